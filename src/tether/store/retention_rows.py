"""The Store port's records for retention and sizes: what one purge call deleted and where the
next one goes on, the state of SQLite's write-ahead log, and the size of each table: plain
data, no I/O.

It must not import tether.store.base (which builds on it), tether.core or any backend.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

# Where a purge goes on: after this (time, id) in the order it deletes in. START is before all.
Cursor = tuple[float, str]
START: Cursor = (float("-inf"), "")

ENDED = ("succeeded", "failed", "cancelled", "dead")  # the terminal statuses, as stored
UNFINISHED = ("pending", "running", "waiting", "held")
OUTBOX_DONE = ("delivered", "failed")  # outbox messages retention may delete

# The tables a run's rows live in, in the order a purge deletes them (the run row goes last).
# tether_streams is PostgreSQL's counter of each stream's next offset.
RUN_TABLES = (
    "tether_checkpoints",
    "tether_events",
    "tether_stream_entries",
    "tether_streams",
    "tether_values",
    "tether_forks",
    "tether_outbox",
)
_TABLE_NAME = re.compile(r"tether_[a-z0-9_]{1,60}")


def table_name(name: str) -> str:
    """`name` if it is the name of a Tether table (tether_ and lower-case letters, digits and
    _): the only identifiers ever put into SQL text (row counts per table)."""
    if not _TABLE_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not the name of a Tether table")
    return name


@dataclass(frozen=True, slots=True)
class Purge:
    """What one purge call deleted (or, dry, would delete): rows per table (tables with none are
    left out), and the cursor to pass to the next call (None: nothing more to do)."""

    rows: Mapping[str, int] = field(default_factory=dict)
    after: Cursor | None = None

    @property
    def total(self) -> int:
        return sum(self.rows.values())


def add_rows(into: dict[str, int], table: str, count: int) -> None:
    """Count `count` more rows of `table` (nothing for 0)."""
    if count > 0:
        into[table] = into.get(table, 0) + count


@dataclass(frozen=True, slots=True)
class WalState:
    """SQLite's write-ahead log after a checkpoint: whether a reader or writer kept the
    checkpoint from finishing, the frames in the log and those copied into the database, and
    the size of the -wal file."""

    busy: bool
    frames: int
    copied: int
    wal_bytes: int


@dataclass(frozen=True, slots=True)
class TableSize:
    """One table: its rows, and the bytes it and its indexes take (None: unknown here)."""

    name: str
    rows: int
    bytes: int | None = None


@dataclass(frozen=True, slots=True)
class StorageSizes:
    """The database's size. For SQLite: the main file, the -wal file, the free pages inside
    the file (reused before it grows) and the auto_vacuum mode; for PostgreSQL: the whole
    database. Tables are Tether's, by name."""

    backend: str  # "sqlite", "postgres" or "memory"
    tables: tuple[TableSize, ...] = ()
    database_bytes: int | None = None
    wal_bytes: int | None = None
    free_bytes: int | None = None
    auto_vacuum: str | None = None  # SQLite: "none", "full" or "incremental"


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """Which runs one purge_runs batch deletes: `whole` (all their rows, then the run), or,
    when the first run alone has more rows than the batch, part of `big`'s rows. `after` is the
    cursor past the runs this batch dealt with (deleted or kept); `complete` when it dealt with
    every run it was given."""

    whole: tuple[str, ...]
    big: Cursor | None
    after: Cursor
    complete: bool


def scan_size(limit: int) -> int:
    """How many ended runs a batch of `limit` rows looks at: a run has a row of its own and
    usually several more (checkpoints, events, ...)."""
    return max(1, limit // 4)


def plan_batch(
    found: Sequence[tuple[str, float]],
    waiting: Collection[str],
    rows: Mapping[str, int],
    limit: int,
    after: Cursor,
    *,
    dry_run: bool,
) -> BatchPlan:
    """The plan of a batch given the runs found in deletion order, those kept for their
    outbox, and the rows each has beside its own: whole runs while they fit in `limit` rows;
    a first run bigger than that goes in parts (counted whole when dry)."""
    whole: list[str] = []
    total = 0
    for run_id, at in found:
        if run_id not in waiting:
            size = rows.get(run_id, 0) + 1
            if not whole and size > limit and not dry_run:
                return BatchPlan((), (at, run_id), after, complete=False)
            if whole and total + size > limit:
                return BatchPlan(tuple(whole), None, after, complete=False)
            whole.append(run_id)
            total += size
        after = (at, run_id)
    return BatchPlan(tuple(whole), None, after, complete=True)

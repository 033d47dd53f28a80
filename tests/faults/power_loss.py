"""Tether's SQLite store on the recording VFS (tests/faults/vfs.py), a workload of its
operations, and the check of what a power cut leaves.

Tether opens SQLite through Python's sqlite3, which cannot take a Python VFS; apsw can. So the
store runs unchanged except for its connections: `ApswCommitQueue` is Tether's CommitQueue whose
own `_connect` runs (with the PRAGMAs it sets: journal_mode=WAL, synchronous=...), its
`sqlite3.connect` answered by an apsw connection on the recording VFS, wrapped to look like a
sqlite3 connection. The SQL, the migrations (`queries("sqlite").migrations`), the statements of each
operation (SqliteStore) and the shape of its transactions (the group commit of CommitQueue
`_execute`: one BEGIN IMMEDIATE ... COMMIT for many runs' checkpoints, savepoints, the implicit
transaction of a lone statement) are Tether's own.

The connections also mark, in the VFS's journal, where each transaction began and ended, with
a digest of the whole database after it (every table, row by row): the committed states, in
order. `Book` keeps each checkpoint and run row the workload asked for, and the position where
the store acknowledged it (its call returned). `check_cut` then opens the files a power cut left
and says whether the database is intact, whether it is one of the committed states, and which
acknowledged writes it lacks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import random
import sqlite3
from collections import defaultdict
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

import apsw
from tests.faults.vfs import Journal, RecordingVFS

from tether.store.drivers.sqlite import CommitQueue
from tether.store.drivers.sqlite import commit as sqlite_commit
from tether.store.port import Checkpoint, CheckpointStatus, Lease, NewRun, RunStatus, WorkerInfo
from tether.store.sql_store import queries
from tether.store.sqlite import SqliteStore

T = TypeVar("T")
MIGRATIONS = queries("sqlite").migrations


# -- a sqlite3-shaped connection on apsw ------------------------------------------------------


def state_digest(db: apsw.Connection) -> str:
    """The whole database as one digest: its schema, then every row of every table, in the
    order a scan gives (the order of its b-tree, so equal content gives an equal digest)."""
    h = hashlib.sha256()
    schema = db.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
    ).fetchall()
    h.update(repr(schema).encode())
    for kind, name, _, _ in schema:
        if kind != "table":
            continue
        h.update(f"table {name}".encode())
        for row in db.execute(f'SELECT * FROM "{name}"'):
            for value in row:
                if isinstance(value, str):  # results can be long: no repr, no escaping
                    h.update(b"s%d:" % len(value))
                    h.update(value.encode())
                else:
                    h.update(repr(value).encode())
            h.update(b"\n")
    return h.hexdigest()


EMPTY_STATE = hashlib.sha256(b"[]").hexdigest()  # state_digest of a database with no schema


@dataclass(repr=False)
class Tracker:
    """The committed states of the database, in order, and where each transaction began and
    ended in the journal: ("begin",) and ("end", state index) marks."""

    journal: Journal
    states: list[str] = field(default_factory=lambda: [EMPTY_STATE])
    batch_sizes: list[int] = field(default_factory=list)  # checkpoints per committed transaction
    _changes: dict[int, int] = field(default_factory=dict)
    _checkpoints: int = 0

    def began(self) -> None:
        self.journal.mark("begin")

    def statement(self, sql: str) -> None:
        if "INTO tether_checkpoints" in sql:
            self._checkpoints += 1

    def settled(self, db: apsw.Connection) -> None:
        """The connection is out of any transaction: note the state it committed, if new."""
        total = db.total_changes()
        if total != self._changes.get(id(db), 0):
            self._changes[id(db)] = total
            digest = state_digest(db)
            if digest != self.states[-1]:
                self.states.append(digest)
                if self._checkpoints:
                    self.batch_sizes.append(self._checkpoints)
        self._checkpoints = 0
        self.journal.mark("end", len(self.states) - 1)


class _Rows:
    """A finished statement's rows, read like a sqlite3 cursor."""

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int, sql: str) -> None:
        self._rows = iter(rows)
        self.rowcount = rowcount
        # sqlite3's description: not None for a statement that yields rows (even none). apsw
        # cannot tell once a statement has completed, so it is read off the statement.
        text = sql.lstrip().upper()
        rows_out = text.startswith(("SELECT", "PRAGMA", "WITH")) or "RETURNING" in text
        self.description: tuple[()] | None = () if rows_out else None

    def fetchone(self) -> tuple[Any, ...] | None:
        return next(self._rows, None)

    def fetchall(self) -> list[tuple[Any, ...]]:
        return list(self._rows)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return self._rows


def _as_sqlite3(exc: apsw.Error) -> sqlite3.Error:
    if isinstance(exc, apsw.ConstraintError):
        return sqlite3.IntegrityError(str(exc))
    if isinstance(exc, apsw.BusyError | apsw.LockedError):
        return sqlite3.OperationalError("database is locked")
    return sqlite3.OperationalError(str(exc))


class ApswConnection:
    """What CommitQueue and SqliteStore use of a sqlite3 connection (autocommit mode:
    isolation_level=None), on apsw. Each statement runs to its end at execute()."""

    def __init__(self, path: str, vfs: RecordingVFS, tracker: Tracker, timeout: float) -> None:
        self.db = apsw.Connection(path, vfs=vfs.vfs_name)
        self.db.set_busy_timeout(int(timeout * 1000))
        self.tracker = tracker

    @property
    def in_transaction(self) -> bool:
        return bool(self.db.in_transaction)

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> _Rows:
        if not self.db.in_transaction:
            self.tracker.began()
        self.tracker.statement(sql)
        try:
            rows = self.db.execute(sql, params).fetchall()
            return _Rows(rows, self.db.changes(), sql)
        except apsw.Error as exc:
            raise _as_sqlite3(exc) from exc
        finally:
            if not self.db.in_transaction:
                self.tracker.settled(self.db)

    def executemany(self, sql: str, seq: Sequence[Any]) -> None:
        for params in seq:
            self.execute(sql, params)

    def close(self) -> None:
        self.db.close()


class ApswCommitQueue(CommitQueue):
    """Tether's CommitQueue on apsw connections through the recording VFS. Only the driver
    changes: CommitQueue's own _connect runs, with its PRAGMAs."""

    def __init__(self, path: str, synchronous: str, vfs: RecordingVFS, tracker: Tracker) -> None:
        super().__init__(path, synchronous, MIGRATIONS)
        self.vfs, self.tracker = vfs, tracker

    def _connect(self, busy_timeout: float, *, setup: bool = False) -> sqlite3.Connection:
        def connect(path: str, *, timeout: float = 5.0, **_: object) -> ApswConnection:
            return ApswConnection(path, self.vfs, self.tracker, timeout)

        with mock.patch.object(sqlite_commit.sqlite3, "connect", connect):
            return super()._connect(busy_timeout, setup=setup)


def apsw_store(path: Path, synchronous: str, vfs: RecordingVFS, tracker: Tracker) -> SqliteStore:
    """Tether's SqliteStore on `path`, its connections on apsw through `vfs`."""
    store = SqliteStore(f"sqlite:///{path}?synchronous={synchronous}")
    store.driver.queue = ApswCommitQueue(str(path), synchronous, vfs, tracker)
    return store


# -- what the workload asked for, and what was acknowledged ----------------------------------

Row = tuple[Any, ...]  # a tether_checkpoints row: run_id, seq, name, kind, status, result, ...


@dataclass
class Version:
    row: Row
    submitted: int  # journal position when the store was asked
    acked: int | None = None  # journal position when the store's call returned


@dataclass(repr=False)
class Book:
    """Every checkpoint row and run status the workload asked the store for, in order, and when
    each call was acknowledged."""

    journal: Journal
    checkpoints: dict[tuple[str, int], list[Version]] = field(
        default_factory=lambda: defaultdict(list)
    )
    runs: dict[str, list[Version]] = field(default_factory=lambda: defaultdict(list))

    async def call(self, versions: list[Version], row: Row, call: Awaitable[T]) -> T:
        version = Version(row, len(self.journal.entries))
        versions.append(version)
        result = await call
        version.acked = self.journal.mark("ack")
        return result

    def __repr__(self) -> str:
        return f"<Book of {len(self.checkpoints)} checkpoints, {len(self.runs)} runs>"

    def acknowledged(self, position: int) -> int:
        return sum(
            1
            for versions in self.checkpoints.values()
            for v in versions
            if v.acked is not None and v.acked <= position
        )


def checkpoint_row(lease: Lease, cp: Checkpoint) -> Row:
    return (lease.run_id, cp.seq, cp.name, cp.kind, cp.status.value, cp.result, cp.error,
            cp.attempts, cp.started_at, cp.finished_at, cp.retry_at)  # fmt: skip


# -- the workload -----------------------------------------------------------------------------

WORKFLOW = "pipeline"
SIZES = (0, 12, 300, 2_000, 9_000, 40_000, 150_000)  # bytes of a result's JSON string, about


def _payload(rng: random.Random) -> str:
    size = rng.choice(SIZES)
    return json.dumps(f"é{rng.randbytes(size // 2).hex()}\n", ensure_ascii=False)


async def workload(store: SqliteStore, book: Book, *, runs: int = 6, rounds: int = 10) -> None:
    """What a worker's runs ask of the store, at the SQL level of SqliteStore: create runs
    claimed, checkpoints of all runs at once (one group commit), a lone checkpoint (an implicit
    transaction), at-most-once start markers replaced by their completion, retries, heartbeats,
    an event delivered and taken, runs suspended and claimed back, and every run finished."""
    rng = random.Random(20240611)
    now = 1_800_000_000.0
    await store.open()
    worker = WorkerInfo(id="w-1", host="host", pid=1, pid_token="t", started_at=now,
                        heartbeat_at=now)  # fmt: skip
    await store.register_worker(worker, now)
    ids = [f"run-{i}" for i in range(runs)]
    leases = {run_id: Lease(run_id, worker.id, 1) for run_id in ids}
    seqs = dict.fromkeys(ids, 0)

    async def create(run_id: str) -> None:
        args = json.dumps({"args": [run_id], "kwargs": {}})
        row = (run_id, RunStatus.RUNNING.value)
        created = store.create_run(
            NewRun(run_id, WORKFLOW, args, None), now, owner=worker.id, lease_until=now + 15
        )
        await book.call(book.runs[run_id], row, created)

    async def write(run_id: str, cp: Checkpoint) -> None:
        lease = leases[run_id]
        row = checkpoint_row(lease, cp)
        await book.call(book.checkpoints[(run_id, cp.seq)], row,
                        store.write_checkpoint(lease, cp, now))  # fmt: skip

    def step(run_id: str, status: CheckpointStatus = CheckpointStatus.COMPLETED,
             **kw: Any) -> Checkpoint:  # fmt: skip
        seq = seqs[run_id]
        if status is CheckpointStatus.COMPLETED:
            seqs[run_id] += 1
        fields: dict[str, Any] = {"attempts": 1, "started_at": now, "finished_at": now + 0.5}
        if status is CheckpointStatus.COMPLETED:
            fields["result"] = _payload(rng)
        return Checkpoint(seq=seq, name=f"step{seq}", kind="step", status=status,
                          **{**fields, **kw})  # fmt: skip

    async def finish(run_id: str) -> None:
        row = (run_id, RunStatus.SUCCEEDED.value)
        finished = store.finish_run(
            leases[run_id], RunStatus.SUCCEEDED, json.dumps(run_id), None, now
        )
        await book.call(book.runs[run_id], row, finished)

    await asyncio.gather(*(create(r) for r in ids))
    for round_ in range(rounds):
        now += 1.0
        # Every run's next step at once: one transaction for all (the group commit).
        await asyncio.gather(*(write(r, step(r)) for r in ids))
        lone = ids[round_ % runs]
        await write(lone, step(lone))  # alone: SQLite's implicit transaction
        # An at-most-once step: its start marker, then its completion in the same row.
        marked = ids[(round_ + 1) % runs]
        await write(marked, step(marked, CheckpointStatus.STARTED, finished_at=None))
        await write(marked, step(marked))
        # A retried step: the failed attempt with its retry time, then the success.
        retried = ids[(round_ + 2) % runs]
        error = json.dumps({"type": "TimeoutError", "message": "slow", "traceback": ""})
        await write(retried, step(retried, CheckpointStatus.RETRYING, error=error,
                                  retry_at=now + 1))  # fmt: skip
        await write(retried, step(retried, attempts=2))
        await store.heartbeat(worker.id, list(leases.values()), now + 15, now)
    # An event delivered to a run, then taken into its checkpoint (one transaction each).
    target = ids[0]
    await store.deliver_event(target, "go", json.dumps({"ok": True}), now)
    seq = seqs[target]
    seqs[target] += 1
    taken = Checkpoint(
        seq=seq, name="event:go", kind="event", status=CheckpointStatus.COMPLETED, attempts=1,
        started_at=now, finished_at=now,
    )  # fmt: skip
    lease = leases[target]
    stored = dataclasses.replace(taken, result='{"key":"go","value":{"ok": true}}')
    await book.call(book.checkpoints[(target, seq)], checkpoint_row(lease, stored),
                    store.take_event(lease, ["go"], taken, now))  # fmt: skip
    # Half the runs wait, then are claimed back under a new epoch.
    waiting = ids[: runs // 2]
    await asyncio.gather(*(store.suspend_run(leases[r], now + 5, now) for r in waiting))
    now += 10
    claimed = await store.claim_runs(worker.id, [WORKFLOW], now, now + 15, runs)
    for record in claimed:
        leases[record.id] = Lease(record.id, worker.id, record.epoch)
    assert sorted(r.id for r in claimed) == waiting
    await asyncio.gather(*(write(r, step(r)) for r in ids))
    # Every run ends, in one transaction (each finish in its savepoint).
    await asyncio.gather(*(finish(r) for r in ids))
    await store.close()  # the last connection checkpoints the WAL into the database and drops it


# -- what a power cut left --------------------------------------------------------------------


@dataclass
class Verdict:
    corrupt: bool = False  # integrity_check not ok, or the file does not open as a database
    state: int | None = None  # the committed state it holds (index), None if none of them
    allowed: tuple[int, ...] = ()  # the states a cut at this position may leave
    lost: list[str] = field(default_factory=list)  # acknowledged writes missing
    torn: list[str] = field(default_factory=list)  # rows no request ever wrote


class Transactions:
    """Where each transaction began and ended in the journal, and the state it left."""

    def __init__(self, journal: Journal) -> None:
        self.ends: list[tuple[int, int]] = []  # (position after the end mark, state)
        self.begins: list[int] = []
        for i, entry in enumerate(journal.entries):
            if entry[0] == "begin":
                self.begins.append(i + 1)
            elif entry[0] == "end":
                self.ends.append((i + 1, entry[1]))

    def allowed(self, position: int) -> tuple[int, int]:
        """(the state of the last transaction that ended before the cut, the state the cut may
        also show: that of a transaction under way at the cut, else the same)."""
        ended = [(p, s) for p, s in self.ends if p <= position]
        last_pos, last_state = ended[-1] if ended else (0, 0)
        began = [b for b in self.begins if b <= position]
        if began and began[-1] > last_pos:  # a transaction was under way
            after = [s for p, s in self.ends if p > position]
            return last_state, after[0] if after else last_state
        return last_state, last_state


def check_cut(db_path: Path, position: int, book: Book, tracker: Tracker,
              transactions: Transactions, *, exact: bool) -> Verdict:  # fmt: skip
    """Open the database a cut at `position` left (files laid out at db_path) and judge it.
    `exact`: it must hold the last committed state (or the one under way); otherwise any
    earlier committed state is accepted (synchronous=OFF or NORMAL promise no more)."""
    verdict = Verdict()
    last, under_way = transactions.allowed(position)
    verdict.allowed = (last, under_way) if exact else tuple(range(under_way + 1))
    try:
        db = apsw.Connection(str(db_path))
        # Closing it must not checkpoint: that only costs time (this copy is thrown away).
        db.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)
    except apsw.Error:
        verdict.corrupt = True
        return verdict
    try:
        if db.execute("PRAGMA integrity_check").fetchall() != [("ok",)]:
            verdict.corrupt = True
            return verdict
        digest = state_digest(db)
        if digest in tracker.states:
            verdict.state = tracker.states.index(digest)
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        _check_rows(db, tables, position, book, verdict)
    except apsw.Error:
        verdict.corrupt = True
    finally:
        db.close()
    return verdict


def _judge(found: Row | None, versions: list[Version], position: int, what: str,
           verdict: Verdict) -> None:  # fmt: skip
    asked = [v for v in versions if v.submitted <= position]
    acked = [i for i, v in enumerate(asked) if v.acked is not None and v.acked <= position]
    if found is not None and all(found != v.row for v in asked):
        verdict.torn.append(f"{what}: {found!r:.120}")
    elif acked and (found is None or found not in [v.row for v in asked[acked[-1] :]]):
        verdict.lost.append(what)


def _check_rows(db: apsw.Connection, tables: set[str], position: int, book: Book,
                verdict: Verdict) -> None:  # fmt: skip
    for (run_id, seq), versions in book.checkpoints.items():
        found = None
        if "tether_checkpoints" in tables:
            found = db.execute(
                "SELECT run_id, seq, name, kind, status, result, error, attempts, started_at, "
                "finished_at, retry_at FROM tether_checkpoints WHERE run_id = ? AND seq = ?",
                (run_id, seq),
            ).fetchone()
        _judge(found, versions, position, f"checkpoint {run_id}#{seq}", verdict)
    for run_id, versions in book.runs.items():
        found = None
        if "tether_runs" in tables:
            found = db.execute(
                "SELECT id, status FROM tether_runs WHERE id = ?", (run_id,)
            ).fetchone()
        # Runs change state through other calls too (suspend, claim): only ask that an
        # acknowledged creation left a row and an acknowledged finish its status.
        asked = [v for v in versions if v.submitted <= position]
        acked = [v for v in asked if v.acked is not None and v.acked <= position]
        if not acked:
            continue
        last = acked[-1].row
        if found is None or (last[1] == RunStatus.SUCCEEDED.value and found != last):
            verdict.lost.append(f"run {run_id} ({last[1]})")

"""Upkeep of the database in the Store port, apart from the operations on Tether's data and
written by each driver (what it takes differs by database): free pages back to the file
system, VACUUM, SQLite's write-ahead log, sizes; their records. It must not import
tether.core or any backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


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


class Maintenance(Protocol):
    """Upkeep of the database, written by each driver."""

    async def compact(self, max_pages: int) -> int:
        """Give up to `max_pages` free pages of the database back to the file system in one
        short transaction (SQLite with auto_vacuum=incremental; the file shrinks at the next
        WAL checkpoint). Returns the bytes given back: 0 where there is nothing to do or the
        backend leaves it to the database (PostgreSQL's autovacuum)."""

    async def vacuum(self) -> int | None:
        """Rebuild the database at its smallest (SQLite: VACUUM, which also turns on incremental
        auto_vacuum, then a WAL checkpoint; PostgreSQL: VACUUM ANALYZE of Tether's tables, which
        makes their free space reusable). Writers wait meanwhile. Returns the bytes the
        database shrank by (negative when VACUUM made it grow: statistics, a visibility map),
        None where unknown."""

    async def checkpoint_wal(self) -> WalState | None:
        """SQLite: copy the write-ahead log into the database without waiting for anyone
        (PASSIVE), then, if it is all copied and the -wal file is larger than the journal size
        limit, truncate it unless a reader or writer is at work. None for backends without such
        a log to look after (PostgreSQL)."""

    async def storage_sizes(self) -> StorageSizes:
        """The database's size: files or whole database, and each Tether table's rows (exact
        counts) and bytes with its indexes (where the backend can tell)."""

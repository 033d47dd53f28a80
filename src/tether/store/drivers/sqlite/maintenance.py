"""The upkeep of one SQLite file: giving free pages back to the file system, VACUUM, the
write-ahead log's checkpoint, and the sizes of the file and of Tether's tables.

Compaction and sizes run on the writer thread (never on the event loop); checkpoints and VACUUM
use a connection of their own. It knows nothing of runs. SQL in sql/sqlite/retention.sql.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from pathlib import Path

from tether.store.drivers.sqlite.commit import JOURNAL_SIZE_LIMIT, CommitQueue
from tether.store.port.maintenance import StorageSizes, TableSize, WalState
from tether.store.query import Queries
from tether.store.tables import table_name

_AUTO_VACUUM = {0: "none", 1: "full", 2: "incremental"}


def _connect(path: str, busy_timeout: float) -> sqlite3.Connection:
    """A connection of its own to the existing file (never creating one: the store may have
    been closed and its folder removed meanwhile)."""
    uri = f"{Path(path).absolute().as_uri()}?mode=rw"
    return sqlite3.connect(uri, uri=True, isolation_level=None, timeout=busy_timeout)


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


async def compact(queue: CommitQueue, queries: Queries, max_pages: int) -> int:
    pages = queries.named["retention_pages"]

    def op(c: sqlite3.Connection) -> int:
        page_size, free, mode = c.execute(pages).fetchone()
        if mode != 2 or free <= 0:
            return 0
        # Each step of the pragma frees one page and yields a row that Python's sqlite3 does
        # not read on: one page per statement, then.
        for _ in range(min(free, max(0, max_pages))):
            c.execute("PRAGMA incremental_vacuum(1)")
        left = c.execute(pages).fetchone()[1]
        return int((free - left) * page_size)

    return await queue.submit_to_thread(op, write=True, label="compact")


async def vacuum(path: str) -> int:
    def work() -> int:
        conn = _connect(path, 30.0)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            before = _file_size(path)
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # VACUUM applies it
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return before - _file_size(path)
        finally:
            conn.close()

    return await asyncio.to_thread(work)


def checkpoint_wal(path: str) -> WalState:
    """PASSIVE, then TRUNCATE if all is copied and the file is over the limit; waits for
    nobody (busy_timeout 0): a reader or writer at work makes it report busy instead."""
    wal = f"{path}-wal"
    try:
        conn = _connect(path, 0)
    except sqlite3.OperationalError:
        return WalState(True, -1, -1, _file_size(wal))  # gone, or locked: next time
    try:
        busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if not busy and frames == copied and _file_size(wal) > JOURNAL_SIZE_LIMIT:
            with contextlib.suppress(sqlite3.OperationalError):  # busy: next time
                busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except sqlite3.OperationalError:
        busy, frames, copied = 1, -1, -1  # locked while opening: next time
    finally:
        conn.close()
    return WalState(bool(busy), int(frames), int(copied), _file_size(wal))


async def storage_sizes(queue: CommitQueue, queries: Queries, path: str) -> StorageSizes:
    q = queries.named

    def op(c: sqlite3.Connection) -> StorageSizes:
        names = [table_name(r[0]) for r in c.execute(q["retention_table_names"])]
        counts = {
            n: int(c.execute(q["retention_count_rows"].format(table=n)).fetchone()[0])
            for n in names
        }
        sizes: dict[str, int] = {}
        with contextlib.suppress(sqlite3.OperationalError):  # built without dbstat
            sizes = {n: int(b) for n, b in c.execute(q["retention_table_bytes"])}
        page_size, free, mode = c.execute(q["retention_pages"]).fetchone()
        tables = tuple(TableSize(n, counts[n], sizes.get(n) if sizes else None) for n in names)
        return StorageSizes(
            backend="sqlite",
            tables=tables,
            database_bytes=_file_size(path),
            wal_bytes=_file_size(f"{path}-wal"),
            free_bytes=int(free * page_size),
            auto_vacuum=_AUTO_VACUUM.get(int(mode), str(mode)),
        )

    return await queue.submit_to_thread(op, write=False, label="storage_sizes")

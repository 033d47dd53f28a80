"""Retention on SQLite: deleting what ended long ago a bounded number of rows per transaction,
giving free pages back to the file system, checkpointing the write-ahead log, and sizes.

Batches run on the writer thread (never on the event loop), so live runs' steps go on between
them. Checkpoints and VACUUM use a connection of their own. SQL in sql/sqlite/retention.sql.
It must not import tether.core.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

from tether.store.retention_rows import (
    RUN_TABLES,
    START,
    Cursor,
    Purge,
    StorageSizes,
    TableSize,
    WalState,
    add_rows,
    plan_batch,
    scan_size,
    table_name,
)
from tether.store.rows import load_sql
from tether.store.sqlite_commit import JOURNAL_SIZE_LIMIT, CommitQueue

_Q, _ = load_sql("sqlite")
_AUTO_VACUUM = {0: "none", 1: "full", 2: "incremental"}
# SQLite keeps no tether_streams (offsets come from the entries themselves).
_RUN_TABLES = tuple(t for t in RUN_TABLES if t != "tether_streams")


def _cursor_args(before: float, limit: int, after: Cursor) -> dict[str, object]:
    return {"before": before, "limit": limit, "after_at": after[0], "after_id": after[1]}


def _purge_rows(
    c: sqlite3.Connection,
    run_id: str,
    tables: tuple[str, ...],
    budget: int,
    counts: dict[str, int],
    *,
    dry_run: bool,
) -> bool:
    """Delete (or count, all of them) up to `budget` of the run's rows in `tables`, table by
    table. False when the budget ran out first: the rest goes in the next batch."""
    args = {"id": run_id, "limit": budget}
    for table in tables:
        if dry_run:
            add_rows(counts, table, c.execute(_Q[f"retention_count_{table}"], args).fetchone()[0])
            continue
        deleted = c.execute(_Q[f"retention_delete_{table}"], args).rowcount
        add_rows(counts, table, deleted)
        args["limit"] = budget = budget - deleted
        if budget <= 0:
            return False
    return True


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


class SqliteRetention:
    """Mixed into SqliteStore."""

    _db: CommitQueue
    path: str

    async def _batch(
        self, op: Callable[[sqlite3.Connection], Purge], dry: bool, label: str
    ) -> Purge:
        return await self._db.submit_to_thread(op, write=not dry, label=label)

    async def purge_runs(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        limit = max(1, int(limit))

        def op(c: sqlite3.Connection) -> Purge:
            args = _cursor_args(before, scan_size(limit), after)
            found = c.execute(_Q["retention_expired_runs"], args).fetchall()
            plan = plan_batch(
                [(r[0], r[1]) for r in found], {r[0] for r in found if r[3]},
                {r[0]: r[2] for r in found}, limit, after, dry_run=dry_run,
            )  # fmt: skip
            deleted: dict[str, int] = {}
            chosen = {"ids": json.dumps(plan.whole)}
            for table in _RUN_TABLES if plan.whole else ():
                if dry_run:
                    rows = c.execute(_Q[f"retention_rows_{table}"], chosen).fetchall()
                    add_rows(deleted, table, sum(n for _, n in rows))
                else:
                    done = c.execute(_Q[f"retention_delete_all_{table}"], chosen).rowcount
                    add_rows(deleted, table, done)
            if plan.whole:
                gone = len(plan.whole) if dry_run else c.execute(
                    _Q["retention_delete_runs"], chosen).rowcount  # fmt: skip
                add_rows(deleted, "tether_runs", gone)
            if plan.big is not None:  # a run bigger than a batch: part of its rows
                big = plan.big[1]
                if not _purge_rows(c, big, _RUN_TABLES, limit, deleted, dry_run=False):
                    return Purge(deleted, plan.after)
                gone = c.execute(_Q["retention_delete_run"], {"id": big}).rowcount
                add_rows(deleted, "tether_runs", gone)
                return Purge(deleted, plan.big)
            more = not plan.complete or len(found) == scan_size(limit)
            return Purge(deleted, plan.after if more else None)

        return await self._batch(op, dry_run, "purge_runs")

    async def purge_streams(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        limit = max(1, int(limit))

        def op(c: sqlite3.Connection) -> Purge:
            found = c.execute(
                _Q["retention_ended_runs"], _cursor_args(before, limit, after)
            ).fetchall()
            counts: dict[str, int] = {}
            cursor = after
            for run_id, finished_at, has_entries in found:
                if has_entries:
                    budget = limit - sum(counts.values())
                    if budget <= 0:
                        return Purge(counts, cursor)
                    entries = ("tether_stream_entries",)
                    if not _purge_rows(c, run_id, entries, budget, counts, dry_run=dry_run):
                        return Purge(counts, cursor)
                cursor = (finished_at, run_id)
            return Purge(counts, cursor if len(found) == limit else None)

        return await self._batch(op, dry_run, "purge_streams")

    async def purge_approvals(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        limit = max(1, int(limit))

        def op(c: sqlite3.Connection) -> Purge:
            found = c.execute(
                _Q["retention_expired_approvals"], _cursor_args(before, limit, after)
            ).fetchall()
            counts: dict[str, int] = {}
            cursor = after
            for approval_id, updated_at in found:
                if sum(counts.values()) >= limit:
                    return Purge(counts, cursor)
                args = {"id": approval_id}
                if dry_run:
                    audit = c.execute(_Q["retention_count_audit"], args).fetchone()[0]
                    add_rows(counts, "tether_approval_audit", audit)
                    add_rows(counts, "tether_approvals", 1)
                else:
                    audit = c.execute(_Q["retention_delete_audit"], args).rowcount
                    add_rows(counts, "tether_approval_audit", audit)
                    gone = c.execute(_Q["retention_delete_approval"], args).rowcount
                    add_rows(counts, "tether_approvals", gone)
                cursor = (updated_at, approval_id)
            return Purge(counts, cursor if len(found) == limit else None)

        return await self._batch(op, dry_run, "purge_approvals")

    async def compact(self, max_pages: int) -> int:
        def op(c: sqlite3.Connection) -> int:
            page_size, free, mode = c.execute(_Q["retention_pages"]).fetchone()
            if mode != 2 or free <= 0:
                return 0
            # Each step of the pragma frees one page and yields a row that Python's sqlite3
            # does not read on: one page per statement, then.
            for _ in range(min(free, max(0, max_pages))):
                c.execute("PRAGMA incremental_vacuum(1)")
            left = c.execute(_Q["retention_pages"]).fetchone()[1]
            return int((free - left) * page_size)

        return await self._db.submit_to_thread(op, write=True, label="compact")

    async def vacuum(self) -> int | None:
        def work() -> int:
            conn = _connect(self.path, 30.0)
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                before = _file_size(self.path)
                conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # VACUUM applies it
                conn.execute("VACUUM")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                return before - _file_size(self.path)
            finally:
                conn.close()

        return await asyncio.to_thread(work)

    async def checkpoint_wal(self) -> WalState | None:
        return await asyncio.to_thread(self._checkpoint)

    def _checkpoint(self) -> WalState:
        """PASSIVE, then TRUNCATE if all is copied and the file is over the limit; waits for
        nobody (busy_timeout 0): a reader or writer at work makes it report busy instead."""
        wal = f"{self.path}-wal"
        try:
            conn = _connect(self.path, 0)
        except sqlite3.OperationalError:
            return WalState(True, -1, -1, _file_size(wal))  # gone, or locked: next time
        try:
            busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if not busy and frames == copied and _file_size(wal) > JOURNAL_SIZE_LIMIT:
                with contextlib.suppress(sqlite3.OperationalError):  # busy: next time
                    busy, frames, copied = conn.execute(
                        "PRAGMA wal_checkpoint(TRUNCATE)"
                    ).fetchone()
        except sqlite3.OperationalError:
            busy, frames, copied = 1, -1, -1  # locked while opening: next time
        finally:
            conn.close()
        return WalState(bool(busy), int(frames), int(copied), _file_size(wal))

    async def storage_sizes(self) -> StorageSizes:
        def op(c: sqlite3.Connection) -> StorageSizes:
            names = [table_name(r[0]) for r in c.execute(_Q["retention_table_names"])]
            counts = {
                n: int(c.execute(_Q["retention_count_rows"].format(table=n)).fetchone()[0])
                for n in names
            }
            sizes: dict[str, int] = {}
            with contextlib.suppress(sqlite3.OperationalError):  # built without dbstat
                sizes = {n: int(b) for n, b in c.execute(_Q["retention_table_bytes"])}
            page_size, free, mode = c.execute(_Q["retention_pages"]).fetchone()
            tables = tuple(TableSize(n, counts[n], sizes.get(n) if sizes else None) for n in names)
            return StorageSizes(
                backend="sqlite",
                tables=tables,
                database_bytes=_file_size(self.path),
                wal_bytes=_file_size(f"{self.path}-wal"),
                free_bytes=int(free * page_size),
                auto_vacuum=_AUTO_VACUUM.get(int(mode), str(mode)),
            )

        return await self._db.submit_to_thread(op, write=False, label="storage_sizes")

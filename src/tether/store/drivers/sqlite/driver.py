"""The SQLite driver: running the store's operations (tether.store.ops) on one file, through
its group commit (commit.py), and the named queries' execution on a connection.

It knows nothing of runs; what SQLite does differently lives here and beside it (body.py, the
connection a transaction step's body gets; maintenance.py, the file's upkeep).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from tether.store.drivers.sqlite import maintenance
from tether.store.drivers.sqlite.body import BodyFailed, run_body
from tether.store.drivers.sqlite.commit import CommitQueue, parse_sqlite_url, sqlite_migrates
from tether.store.port.maintenance import StorageSizes, WalState
from tether.store.port.outbox import TransactionBody, TransactionOutcome
from tether.store.query import Conflict, Op, Params, Queries, Query, drive
from tether.store.tables import RUN_TABLES

T = TypeVar("T")


def execute(conn: sqlite3.Connection, queries: Queries, query: Query) -> Any:
    """Run one named query on `conn`: its rows (a SELECT or RETURNING), the rows it changed,
    or None (`many`). Lists among the parameters go in as JSON text (json_each reads them); a
    guarded statement's unique-constraint failure is a Conflict (SQLite's transaction stays
    usable: only the statement is undone)."""
    sql = queries.sql(query)
    if not sql:
        return []
    if query.many:
        conn.executemany(sql, [_encoded(p) for p in query.params])
        return None
    params = _encoded(query.params)
    if query.guard:
        try:
            cursor = conn.execute(sql, params)
        except sqlite3.IntegrityError as exc:
            raise Conflict(str(exc)) from exc
    else:
        cursor = conn.execute(sql, params)
    return cursor.rowcount if cursor.description is None else cursor.fetchall()


def _encoded(params: Params) -> Params:
    if type(params) is dict and any(type(v) is list for v in params.values()):
        return {k: json.dumps(v) if type(v) is list else v for k, v in params.items()}
    return params


class SqliteDriver:
    """Operations on one SQLite file, through its group commit."""

    dialect = "sqlite"
    has_clock = False  # the file has no clock: every process on its machine reads the same one
    # The tables of a run's rows (no stream counters: offsets come from the entries themselves).
    run_tables: tuple[str, ...] = tuple(t for t in RUN_TABLES if t != "tether_streams")
    stream_tables: tuple[str, ...] = ("tether_stream_entries",)

    def __init__(
        self, url: str, queries: Queries, *, busy_timeout: float = 30.0, auto_open: bool = False
    ) -> None:
        self.url = url
        # Open on first use (the memory store, usable at once as an object in memory was).
        self.auto_open = auto_open
        self.path, self.synchronous = parse_sqlite_url(url)
        self.queries = queries
        self.busy_timeout = busy_timeout
        self.queue = CommitQueue(
            self.path,
            self.synchronous,
            queries.migrations,
            busy_timeout=busy_timeout,
            migrate=sqlite_migrates(url),
        )

    async def open(self) -> None:
        await self.queue.open()

    async def close(self) -> None:
        await self.queue.close()

    async def _ready(self) -> None:
        if self.auto_open and not self.queue.is_open:
            await self.queue.open()

    def _fn(self, make: Callable[[], Op[T]]) -> Callable[[sqlite3.Connection], T]:
        queries = self.queries
        return lambda conn: drive(make(), partial(execute, conn, queries))

    async def read(self, make: Callable[[], Op[T]], *, multi: bool = False) -> T:
        # One statement, or several on one connection while no write interleaves (reads on the
        # loop's connection run whole between two commits): a consistent view either way.
        await self._ready()
        return await self.queue.submit(self._fn(make), write=False)

    async def write(self, make: Callable[[], Op[T]], *, label: str = "", multi: bool = True) -> T:
        await self._ready()
        return await self.queue.submit(self._fn(make), write=True, label=label, multi=multi)

    async def slowly(self, make: Callable[[], Op[T]], *, write: bool, label: str = "") -> T:
        """An operation that takes a while (retention's batches): run by the writer thread,
        never on the event loop, so live runs' steps commit between two of them."""
        await self._ready()
        return await self.queue.submit_to_thread(self._fn(make), write=write, label=label)

    async def transaction(
        self,
        check: Callable[[], Op[None]],
        body: TransactionBody,
        after: Callable[[TransactionOutcome], Op[T]],
        *,
        label: str = "",
    ) -> T:
        """Run `check`, call `body` with a guarded connection, then run `after(what it
        returned)`, all in one write transaction; an error of the body propagates as
        it is (an SQL error of the body's is the body's, not the database's)."""
        queries = self.queries

        def fn(conn: sqlite3.Connection) -> T:
            # Inside BEGIN IMMEDIATE: no other connection writes until the commit, so what
            # `after` writes fenced by the lease decides for the whole transaction.
            drive(check(), partial(execute, conn, queries))
            outcome = run_body(conn, body, keep_sqlite_errors=False)
            return drive(after(outcome), partial(execute, conn, queries))

        await self._ready()
        try:
            return await self.queue.submit(fn, write=True, label=label, multi=True)
        except BodyFailed as failed:
            raise failed.error from None

    # -- maintenance ------------------------------------------------------------------------

    async def compact(self, max_pages: int) -> int:
        return await maintenance.compact(self.queue, self.queries, max_pages)

    async def vacuum(self) -> int | None:
        return await maintenance.vacuum(self.path)

    async def checkpoint_wal(self) -> WalState | None:
        return await asyncio.to_thread(maintenance.checkpoint_wal, self.path)

    async def storage_sizes(self) -> StorageSizes:
        return await maintenance.storage_sizes(self.queue, self.queries, self.path)

    async def poll_changes(self) -> bool:
        return await self.queue.poll_changes()

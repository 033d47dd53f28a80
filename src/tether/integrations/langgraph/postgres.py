"""TetherSaver's PostgreSQL connections: a psycopg pool for sync callers and an async pool per
event loop for async ones, on the App's database and schema (`?schema=` in the URL).

Each operation is one transaction on a pooled connection; the operation's encoding and decoding
run off the event loop (`query.adrive`). A blind write (put, put_writes: it reads no result of
its statements) is sent whole in one pipeline, BEGIN and COMMIT with it before its one Sync:
one transaction, all or nothing, in one round trip (psycopg's transaction block inside a
pipeline would sync at BEGIN and at COMMIT too). The first use creates the saver's tables
(`sql/postgres/` migrations, recorded in tether_lg_migrations) under an advisory lock of their
own, so processes starting together apply them once. Sync callers never touch an event loop,
so calling them inside a running loop blocks it for the query's duration but cannot deadlock.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Generator, Iterator
from functools import partial
from typing import Any, TypeVar, cast

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from tether.errors import StoreUnavailable
from tether.store.drivers.postgres.statements import one_commit
from tether.store.postgres import parse_postgres_url
from tether.store.query import Op, Queries, Query, adrive, drive

T = TypeVar("T")
Conn = psycopg.Connection[Any]
AConn = psycopg.AsyncConnection[Any]
Statement = tuple[str, tuple[Any, ...] | None]

MIGRATION_LOCK = 7232  # pg_advisory_xact_lock key; Tether's own migrations use 7231


class PostgresDatabase:
    """TetherSaver's tables in a PostgreSQL database."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self.url = url
        self._conninfo, self._schema = parse_postgres_url(url)
        self._sizes = (min_size, max_size)
        self._queries = Queries(__package__, "postgres")
        self._lock = threading.Lock()
        self._pool: ConnectionPool[Conn] | None = None
        self._apools: dict[asyncio.AbstractEventLoop, asyncio.Task[AsyncConnectionPool[AConn]]]
        self._apools = {}
        self._migrated = False

    def _migration(self) -> Generator[Statement, Any, None]:
        yield "SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,)
        if self._schema is not None:  # a validated identifier (parse_postgres_url)
            yield f'CREATE SCHEMA IF NOT EXISTS "{self._schema}"', None
            yield f'SET LOCAL search_path TO "{self._schema}"', None
        yield (
            (
                "CREATE TABLE IF NOT EXISTS tether_lg_migrations "
                "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
            ),
            None,
        )
        done = {row[0] for row in (yield "SELECT version FROM tether_lg_migrations", None)}
        for version, sql in self._queries.migrations:
            if version not in done:
                yield sql, None
                yield "INSERT INTO tether_lg_migrations VALUES (%s, %s)", (version, time.time())

    def _configure(self, conn: Conn) -> None:
        if self._schema is not None:
            conn.execute(f'SET search_path TO "{self._schema}"')
        conn.commit()

    async def _aconfigure(self, conn: AConn) -> None:
        if self._schema is not None:
            await conn.execute(f'SET search_path TO "{self._schema}"')
        await conn.commit()

    def _sync_pool(self) -> ConnectionPool[Conn]:
        pool = self._pool
        if pool is not None:
            return pool
        with self._lock:
            if self._pool is None:
                try:
                    if not self._migrated:
                        with (
                            psycopg.connect(self._conninfo) as conn,
                            conn.transaction(),
                            conn.cursor() as cursor,
                        ):
                            drive(self._migration(), partial(_statement, cursor))
                        self._migrated = True
                    pool = ConnectionPool(
                        self._conninfo, min_size=self._sizes[0], max_size=self._sizes[1],
                        configure=self._configure, open=False,
                    )  # fmt: skip
                    pool.open(wait=True)
                except psycopg.Error as exc:
                    raise StoreUnavailable(
                        f"cannot open PostgreSQL database {self.url!r} for LangGraph: {exc}"
                    ) from exc
                self._pool = pool
            return self._pool

    async def _open_async_pool(self) -> AsyncConnectionPool[AConn]:
        try:
            if not self._migrated:
                connect = psycopg.AsyncConnection.connect(self._conninfo)
                async with await connect as conn, conn.transaction(), conn.cursor() as cursor:
                    await adrive(self._migration(), partial(_astatement, cursor), threads=True)
                self._migrated = True
            pool: AsyncConnectionPool[AConn] = AsyncConnectionPool(
                self._conninfo, min_size=self._sizes[0], max_size=self._sizes[1],
                configure=self._aconfigure, open=False,
            )  # fmt: skip
            await pool.open(wait=True)
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"cannot open PostgreSQL database {self.url!r} for LangGraph: {exc}"
            ) from exc
        return pool

    async def _async_pool(self) -> AsyncConnectionPool[AConn]:
        """This event loop's pool (async connections belong to the loop that made them)."""
        loop = asyncio.get_running_loop()
        opening = self._apools.get(loop)
        if opening is None:
            self._apools = {lp: t for lp, t in self._apools.items() if not lp.is_closed()}
            opening = self._apools[loop] = loop.create_task(self._open_async_pool())
        try:
            return await asyncio.shield(opening)
        except (psycopg.Error, StoreUnavailable):
            self._apools.pop(loop, None)  # the next call tries again
            raise

    def close(self) -> None:
        """Close the sync pool (and forget the async pools of closed loops: `aclose` closes
        the current loop's)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    async def aclose(self) -> None:
        opening = self._apools.pop(asyncio.get_running_loop(), None)
        if opening is not None:
            with contextlib.suppress(psycopg.Error, StoreUnavailable):
                await (await opening).close()
        await asyncio.to_thread(self.close)

    # -- running operations ---------------------------------------------------------------

    def run(
        self, make: Callable[[], Op[T]], *, write: bool, linger: bool = False, blind: bool = False
    ) -> T:
        if blind:
            result, queries = _statements_of(make)
            with self._sync_pool().connection() as conn, conn.cursor() as cursor:
                conn.autocommit = True  # BEGIN and COMMIT are sent in the pipeline
                try:
                    with _one_commit(conn):
                        for query in queries:
                            _execute(cursor, self._queries, query, fetch=False)
                finally:
                    if not conn.closed:
                        conn.autocommit = False
            return result
        with self._sync_pool().connection() as conn, conn.cursor() as cursor:
            return drive(make(), partial(_execute, cursor, self._queries))  # one transaction

    async def arun(
        self, make: Callable[[], Op[T]], *, write: bool, linger: bool = False, blind: bool = False
    ) -> T:
        pool = await self._async_pool()
        if blind:
            result, queries = await asyncio.to_thread(_statements_of, make)  # encoded off the loop
            async with pool.connection() as conn, conn.cursor() as cursor:
                await conn.set_autocommit(True)
                try:
                    async with one_commit(conn):
                        for query in queries:
                            await _aexecute(cursor, self._queries, query, fetch=False)
                finally:
                    if not conn.closed:
                        await conn.set_autocommit(False)
            return result
        async with pool.connection() as conn, conn.cursor() as cursor:
            return await adrive(make(), partial(_aexecute, cursor, self._queries), threads=True)


@contextlib.contextmanager
def _one_commit(conn: Conn) -> Iterator[None]:
    """`one_commit` (tether.store.drivers.postgres.statements) for a sync connection."""
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            yield
            conn.execute("COMMIT")
    except BaseException:
        if not conn.closed and conn.info.transaction_status != pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                conn.rollback()
        raise


def _statements_of(make: Callable[[], Op[T]]) -> tuple[T, list[Query]]:
    """A blind operation's result and its statements, all made before any is sent (it reads
    no result of theirs, so each gets None)."""
    queries: list[Query] = []
    return drive(make(), queries.append), queries


def _statement(cursor: psycopg.Cursor[Any], statement: Statement) -> Any:
    cursor.execute(statement[0], statement[1])
    return cursor.fetchall() if cursor.description is not None else None


async def _astatement(cursor: psycopg.AsyncCursor[Any], statement: Statement) -> Any:
    await cursor.execute(statement[0], statement[1])
    return await cursor.fetchall() if cursor.description is not None else None


def _execute(
    cursor: psycopg.Cursor[Any], queries: Queries, query: Query, *, fetch: bool = True
) -> Any:
    """Run `query` (only queue it in a pipeline, without `fetch`: nothing to read back)."""
    sql = queries.sql(query)
    if query.many:
        cursor.executemany(sql, cast("list[dict[str, Any]]", query.params))
        return None
    cursor.execute(sql, cast("dict[str, Any]", query.params))
    if not fetch:
        return None
    return cursor.rowcount if cursor.description is None else cursor.fetchall()


async def _aexecute(
    cursor: psycopg.AsyncCursor[Any], queries: Queries, query: Query, *, fetch: bool = True
) -> Any:
    sql = queries.sql(query)
    if query.many:
        await cursor.executemany(sql, cast("list[dict[str, Any]]", query.params))
        return None
    await cursor.execute(sql, cast("dict[str, Any]", query.params))
    if not fetch:
        return None
    return cursor.rowcount if cursor.description is None else await cursor.fetchall()

"""The PostgreSQL driver: a pool of psycopg 3 connections, migrations, LISTEN/NOTIFY, reads,
writes alone in their transaction (a transaction step's body, retention's batches), and the
group commit (commit.py) for every other write. It knows nothing of runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from tether import faults
from tether.errors import StoreUnavailable
from tether.redact import redact_text
from tether.store.drivers.postgres import maintenance
from tether.store.drivers.postgres.body import BodyFailed, call_body
from tether.store.drivers.postgres.commit import GroupCommit
from tether.store.drivers.postgres.held import Held
from tether.store.drivers.postgres.options import postgres_options
from tether.store.drivers.postgres.statements import CHANNEL, Conn, Statements, Tx
from tether.store.port.maintenance import StorageSizes, WalState
from tether.store.port.outbox import TransactionBody, TransactionOutcome
from tether.store.query import Op, Queries, check_schema
from tether.store.tables import RUN_TABLES

T = TypeVar("T")
log = logging.getLogger("tether.store")


class PostgresDriver:
    """Operations on one PostgreSQL database (a schema of it), with a group commit."""

    dialect = "postgres"
    has_clock = True
    run_tables: tuple[str, ...] = (
        RUN_TABLES  # the tables of a run's rows, in the order a purge deletes them
    )
    stream_tables: tuple[str, ...] = ("tether_stream_entries", "tether_streams")

    def __init__(
        self,
        url: str,
        queries: Queries,
        *,
        min_size: int | None = None,
        max_size: int | None = None,
        listen: bool = True,
        hold: bool = True,
    ) -> None:
        self.url = url
        self.options = postgres_options(url)
        self.queries = queries
        self._sizes = (min_size or self.options.pool_min, max_size or self.options.pool_max)
        self._listens = listen
        self._holds = hold  # a connection kept for writes (a keepalive's handle needs none)
        self.pool: AsyncConnectionPool[Conn] | None = None
        self._listener: Conn | None = None
        self._listening: asyncio.Task[None] | None = None
        self._changed = False
        self._own: set[int] = set()  # backend pids of the pool's connections
        self._held: Held | None = None  # the connection kept for writes, outside the pool
        self.statements = Statements(queries, prepare=self.options.prepare_threshold is not None)
        self.commits = GroupCommit(self.statements, self._connection)

    # -- connections ------------------------------------------------------------------------

    async def _configure(self, conn: Conn) -> None:
        # Notifications this process's own connections send are not news to it (its engine
        # wakes its own runs): poll_changes reports other processes' commits, as on SQLite.
        self._own.add(conn.info.backend_pid)
        if self.options.schema is not None:
            await conn.execute(f'SET search_path TO "{self.options.schema}"')

    async def open(self) -> None:
        if self.pool is not None:
            return
        conninfo = self.options.conninfo
        try:
            async with await psycopg.AsyncConnection.connect(conninfo) as conn:
                await self._migrate(conn)
            pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
                conninfo, min_size=self._sizes[0], max_size=self._sizes[1],
                kwargs={"autocommit": True, "prepare_threshold": self.options.prepare_threshold},
                configure=self._configure, open=False,
            )  # fmt: skip
            await pool.open(wait=True)
            listener = None
            if self._listens:
                listener = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
                await listener.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as exc:
            # The URL may carry a password: never in an error that reaches a log.
            shown = redact_text(self.url)
            raise StoreUnavailable(f"cannot open PostgreSQL database {shown!r}: {exc}") from exc
        self.pool, self._listener = pool, listener
        if self._holds:
            self._held = Held(self._connect_held, pool.max_lifetime)
        if listener is not None:
            self._listening = asyncio.create_task(self._listen(listener))

    async def _connect_held(self) -> Conn:
        conn = await psycopg.AsyncConnection.connect(
            self.options.conninfo, autocommit=True,
            prepare_threshold=self.options.prepare_threshold,
        )  # fmt: skip
        try:
            await self._configure(conn)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _listen(self, conn: Conn | None) -> None:
        # Short rounds: cancelling a task blocked inside notifies() can hang the connection,
        # so close() asks the loop to end instead and waits for the round to finish. A lost
        # connection (server restart, killed backend) is opened again.
        while self.pool is not None:
            try:
                if conn is None or conn.closed:
                    conn = await psycopg.AsyncConnection.connect(
                        self.options.conninfo, autocommit=True
                    )
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self._listener = conn
                    self._changed = True  # notifications may have been missed meanwhile
                async for note in conn.notifies(timeout=0.2):
                    if note.pid not in self._own:
                        self._changed = True
            except psycopg.Error:
                conn = None
                await asyncio.sleep(0.1)

    async def _migrate(self, conn: Conn) -> None:
        schema = self.options.schema
        known = {v for v, _ in self.queries.migrations}
        where = f"{redact_text(self.url)!r}"
        if not self.options.migrate:  # a role without DDL rights: look, change nothing
            async with conn.transaction():
                if schema is not None:
                    await conn.execute(f'SET LOCAL search_path TO "{schema}"')
                cur = await conn.execute("SELECT to_regclass('tether_migrations') IS NOT NULL")
                row = await cur.fetchone()
                done: set[int] = set()
                if row is not None and row[0]:
                    cur = await conn.execute("SELECT version FROM tether_migrations")
                    done = {r[0] for r in await cur.fetchall()}
            check_schema(done, known, where, migrate=False)
            return
        async with conn.transaction():
            # One migrator at a time, across processes and machines.
            await conn.execute("SELECT pg_advisory_xact_lock(7231)")
            if schema is not None:
                await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
                await conn.execute(f'SET LOCAL search_path TO "{schema}"')
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS tether_migrations "
                "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
            )
            cur = await conn.execute("SELECT version FROM tether_migrations")
            done = {r[0] for r in await cur.fetchall()}
            check_schema(done, known, where, migrate=True)
            for version, sql in self.queries.migrations:
                if version not in done:
                    await conn.execute(sql.encode())
                    await conn.execute(
                        "INSERT INTO tether_migrations VALUES (%s, extract(epoch FROM now()))",
                        (version,),
                    )

    async def close(self) -> None:
        await self.commits.drain()  # queued writes commit first
        pool, self.pool = self.pool, None
        held, self._held = self._held, None
        if held is not None:
            await held.close()
        if self._listening is not None:
            with contextlib.suppress(Exception):
                await self._listening
        if self._listener is not None:
            await self._listener.close()
        if pool is not None:
            await pool.close()
        self._listener = self._listening = None

    def _closed(self) -> StoreUnavailable:
        return StoreUnavailable(f"the PostgreSQL store {self.url!r} is not open; open() it")

    async def poll_changes(self) -> bool:
        changed, self._changed = self._changed, False
        return changed

    # -- reads ------------------------------------------------------------------------------

    async def read(self, make: Callable[[], Op[T]], *, multi: bool = False) -> T:
        """Run a read-only operation on a pooled connection (in one transaction when it has
        several statements). A broken connection (a server restart, a killed backend) is tried
        again on a fresh one."""
        for attempt in range(1, 4):
            if self.pool is None:
                raise self._closed()
            try:
                async with self._pooled() as conn:
                    if not multi:
                        return await self.statements.drive(conn, make, Tx())
                    async with conn.transaction():
                        return await self.statements.drive(conn, make, Tx())
            except psycopg.OperationalError as exc:
                if attempt == 3:
                    raise StoreUnavailable(f"PostgreSQL operation failed: {exc}") from exc
                await asyncio.sleep(0.05 * attempt)
        raise AssertionError("unreachable")

    # -- writes alone ------------------------------------------------------------------------

    async def alone(
        self, fn: Callable[[Conn], Awaitable[T]], *, write: bool = True, label: str = ""
    ) -> T:
        """Run `fn` in a transaction of its own on a pooled connection, outside the group
        commit (a transaction step's body, retention's batches). A read that meets a broken
        connection is tried again on a fresh one; a write is not, since it may have committed:
        the engine resolves that by reading back."""
        tries = 1 if write else 3
        for attempt in range(1, tries + 1):
            if self.pool is None:
                raise self._closed()
            try:
                async with self._pooled() as conn:
                    if write:
                        faults.hit("store.before_write", label)
                    async with conn.transaction():
                        result = await fn(conn)
                        if write:
                            faults.hit("store.before_commit", label)
                    if write:
                        faults.hit("store.after_commit", label)
                    return result
            except psycopg.OperationalError as exc:
                if attempt == tries:
                    raise StoreUnavailable(f"PostgreSQL operation failed: {exc}") from exc
                await asyncio.sleep(0.05 * attempt)
        raise AssertionError("unreachable")

    async def slowly(self, make: Callable[[], Op[T]], *, write: bool, label: str = "") -> T:
        """An operation that takes a while (retention's batches), in a transaction of its own
        so it never holds up the group commit."""

        async def fn(conn: Conn) -> T:
            tx = Tx()
            result = await self.statements.drive(conn, make, tx)
            if tx.notify:
                await self.statements.notify(conn)
            return result

        return await self.alone(fn, write=write, label=label)

    async def transaction(
        self,
        check: Callable[[], Op[None]],
        body: TransactionBody,
        after: Callable[[TransactionOutcome], Op[T]],
        *,
        label: str = "",
    ) -> T:
        """Run `check`, call `body` (in a thread, its statements on this transaction's
        connection) with a guarded connection, then run `after(what it returned)`, all in one
        transaction; an error of the body propagates as it is."""
        loop = asyncio.get_running_loop()

        async def fn(conn: Conn) -> T:
            await self.statements.drive(conn, check, Tx())
            outcome = await call_body(conn, body, loop)
            return await self.statements.drive(conn, lambda: after(outcome), Tx())

        try:
            return await self.alone(fn, label=label)
        except BodyFailed as failed:
            raise failed.error from None

    # -- maintenance ------------------------------------------------------------------------

    async def compact(self, max_pages: int) -> int:
        return 0  # autovacuum makes freed space reusable; VACUUM FULL is an operator's call

    async def vacuum(self) -> int | None:
        return await maintenance.vacuum(self.options, self.queries)

    async def checkpoint_wal(self) -> WalState | None:
        return None  # PostgreSQL manages its own write-ahead log

    async def storage_sizes(self) -> StorageSizes:
        return await self.alone(lambda c: maintenance.storage_sizes(c, self.queries), write=False)

    # -- writes: the group commit -----------------------------------------------------------

    async def write(self, make: Callable[[], Op[T]], *, label: str = "", multi: bool = True) -> T:
        """Commit the operation, with whatever other writes are queued meanwhile; answer after
        the commit. A broken connection fails it with StoreUnavailable: it may have committed
        (the engine resolves that by reading back)."""
        if self.pool is None:
            raise self._closed()
        return await self.commits.write(make, label=label, multi=multi)

    def _connection(self) -> AbstractAsyncContextManager[Conn]:
        """The connection a commit takes: the held one when it is free, else a pooled one."""
        if self.pool is None:
            raise self._closed()
        if self._held is not None and self._held.free:
            return self._held
        return self._pooled()

    @contextlib.asynccontextmanager
    async def _pooled(self) -> AsyncIterator[Conn]:
        """A connection of the pool. A task cancelled while it waited for one is cancelled:
        the pool's wait (asyncio.wait_for, on Python 3.11) can drop a cancellation that comes as
        a connection does, and the task would go on as if nobody had asked it to stop."""
        if self.pool is None:
            raise self._closed()
        task = asyncio.current_task()
        asked = 0 if task is None else task.cancelling()
        async with self.pool.connection() as conn:
            if task is not None and task.cancelling() > asked:
                raise asyncio.CancelledError
            yield conn

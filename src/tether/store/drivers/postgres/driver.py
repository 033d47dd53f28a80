"""The PostgreSQL driver: a pool of psycopg 3 connections, the group commit, LISTEN/NOTIFY.

Writes (operations of tether.store.ops) queue; a committer takes every write queued so far and
commits them in one transaction, each fenced by its own statements (one run's lost lease never
fails another's write: that operation alone is undone, by a savepoint when it has several
statements), so many runs share one commit and one WAL flush. A write alone with one statement
runs in autocommit: one round trip; so does an operation whose first statement may do it all
(`alone`: a run's end) when that statement did. Reads run on pooled connections, never queued.
It knows nothing of runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from tether import faults
from tether.errors import StoreUnavailable
from tether.redact import redact_text
from tether.store.drivers.postgres import maintenance
from tether.store.drivers.postgres.body import BodyFailed, call_body
from tether.store.drivers.postgres.options import postgres_options
from tether.store.port.maintenance import StorageSizes, WalState
from tether.store.port.outbox import TransactionBody, TransactionOutcome
from tether.store.query import Conflict, Op, Queries, Query, adrive, check_schema, prime
from tether.store.tables import RUN_TABLES

T = TypeVar("T")
Conn = psycopg.AsyncConnection[Any]
log = logging.getLogger("tether.store")

CHANNEL = "tether"  # NOTIFY channel: something became due
COMMITTERS = 2  # transactions of queued writes in flight at once
MAX_BATCH = 256  # writes in one transaction
RETRIES = 3  # a batch that met a deadlock or a serialization failure is run again
_RETRYABLE = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


@dataclass(slots=True, eq=False)
class _Write:
    make: Callable[[], Op[Any]]
    label: str
    multi: bool  # several statements: a savepoint keeps it whole within a shared transaction
    future: asyncio.Future[Any]
    outcome: tuple[bool, Any] = (False, None)


@dataclass(slots=True)
class _Tx:
    """What one transaction's statements share: whether some operation asked to NOTIFY, and
    the pipeline its statements are queued on (each result read forces one round trip, which
    also carries what was queued before: BEGIN with the first statement, NOTIFY with COMMIT)."""

    notify: bool = False
    pipeline: psycopg.AsyncPipeline | None = None


_ALONE = object()  # in a lockstep round: a statement not sent in the pipeline
_Primed = tuple[Op[Any], Query]  # an operation taken up to the query it yields next


class _Undo(Exception):
    """An operation alone in its transaction failed: leave the transaction (rolled back)."""


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
    ) -> None:
        self.url = url
        self.options = postgres_options(url)
        self.queries = queries
        self._sizes = (min_size or self.options.pool_min, max_size or self.options.pool_max)
        self._listens = listen
        self.pool: AsyncConnectionPool[Conn] | None = None
        self._listener: Conn | None = None
        self._listening: asyncio.Task[None] | None = None
        self._changed = False
        self._own: set[int] = set()  # backend pids of the pool's connections
        self._queued: list[_Write] = []
        self._committers = 0
        self._tasks: set[asyncio.Task[None]] = set()

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
        if listener is not None:
            self._listening = asyncio.create_task(self._listen(listener))

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
        while self._tasks:  # queued writes commit first
            await asyncio.gather(*self._tasks, return_exceptions=True)
        pool, self.pool = self.pool, None
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

    # -- statements -------------------------------------------------------------------------

    async def _execute(self, conn: Conn, tx: _Tx, query: Query) -> Any:
        if query.name == "notify":  # once per transaction, at its end
            tx.notify = True
            return []
        sql = self.queries.sql(query)
        if not sql:
            return []
        for carried in query.before:
            await self._execute(conn, tx, carried)
        if query.many:
            async with conn.cursor() as cursor:
                await cursor.executemany(sql, query.params)
            return None
        if query.guard:
            try:
                async with conn.transaction():  # a savepoint: the error leaves the rest usable
                    cur = await conn.execute(sql, query.params)
                    if tx.pipeline is not None:
                        await tx.pipeline.sync()
            except psycopg.errors.UniqueViolation as exc:
                raise Conflict(str(exc)) from exc
        else:
            cur = await conn.execute(sql, query.params)
            if tx.pipeline is not None:
                await tx.pipeline.sync()
        return cur.rowcount if cur.description is None else await cur.fetchall()

    async def _drive(
        self, conn: Conn, make: Callable[[], Op[T]], tx: _Tx, primed: _Primed | None = None
    ) -> T:
        """Run the operation `make` gives (or the one `primed` holds, from its next query)."""

        async def run(query: Query) -> Any:
            return await self._execute(conn, tx, query)

        if primed is not None:
            return await adrive(primed[0], run, first=primed[1])
        return await adrive(make(), run)

    # -- reads ------------------------------------------------------------------------------

    async def read(self, make: Callable[[], Op[T]], *, multi: bool = False) -> T:
        """Run a read-only operation on a pooled connection (in one transaction when it has
        several statements). A broken connection (a server restart, a killed backend) is tried
        again on a fresh one."""
        for attempt in range(1, 4):
            if self.pool is None:
                raise self._closed()
            try:
                async with self.pool.connection() as conn:
                    if not multi:
                        return await self._drive(conn, make, _Tx())
                    async with conn.transaction():
                        return await self._drive(conn, make, _Tx())
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
                async with self.pool.connection() as conn:
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
            tx = _Tx()
            result = await self._drive(conn, make, tx)
            if tx.notify:
                await conn.execute(f"NOTIFY {CHANNEL}")
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
            await self._drive(conn, check, _Tx())
            outcome = await call_body(conn, body, loop)
            return await self._drive(conn, lambda: after(outcome), _Tx())

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
        loop = asyncio.get_running_loop()
        write = _Write(make, label, multi, loop.create_future())
        if not multi and not self._committers and not self._queued:
            # Nobody is committing: a single statement commits at once, in the caller's task
            # (no hop to a committer); writes that come meanwhile queue for a committer.
            self._committers += 1
            try:
                await self._commit([write])
            finally:
                self._committers -= 1
                if self._queued:
                    self._start(loop)
            ok, value = write.outcome
            if ok:
                return value  # type: ignore[no-any-return]
            raise value
        self._queued.append(write)
        if self._committers < COMMITTERS:
            self._start(loop)
        return await write.future  # type: ignore[no-any-return]

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._committers += 1
        task = loop.create_task(self._committer())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _committer(self) -> None:
        try:
            while self._queued:
                batch = self._queued[:MAX_BATCH]
                del self._queued[:MAX_BATCH]
                await self._commit(batch)
                for write in batch:
                    if not write.future.done():
                        ok, value = write.outcome
                        if ok:
                            write.future.set_result(value)
                        else:
                            write.future.set_exception(value)
        finally:
            self._committers -= 1

    async def _commit(self, batch: list[_Write]) -> None:
        """Commit `batch`, setting each write's outcome. A deadlock or serialization failure
        (nothing committed) runs it again; a statement error of one write fails the whole
        transaction, so each is then run alone and only the faulty one fails."""
        for attempt in range(1, RETRIES + 1):
            try:
                if self.pool is None:
                    raise self._closed()
                async with self.pool.connection() as conn:
                    await self._transaction(conn, batch)
                return
            except _RETRYABLE as exc:
                if attempt == RETRIES:
                    self._fail(batch, exc)
                    return
                await asyncio.sleep(0.002 * attempt)
            except psycopg.OperationalError as exc:
                self._fail(batch, StoreUnavailable(f"PostgreSQL operation failed: {exc}"), exc)
                return
            except psycopg.Error as exc:
                if len(batch) == 1:
                    self._fail(batch, exc)
                    return
                for write in batch:
                    await self._commit([write])
                return
            except StoreUnavailable as exc:
                self._fail(batch, exc)
                return

    @staticmethod
    def _fail(batch: list[_Write], exc: BaseException, cause: BaseException | None = None) -> None:
        if cause is not None:
            exc.__cause__ = cause
        for write in batch:
            write.outcome = (False, exc)

    async def _transaction(self, conn: Conn, batch: list[_Write]) -> None:
        primed: _Primed | None = None  # a lone write's operation, taken up to its next query
        if len(batch) == 1 and not faults.ENABLED:
            # One write: autocommit makes a single statement its own transaction, which saves
            # the BEGIN and COMMIT round trips. (With fault sites enabled the explicit path
            # runs, so that "before commit" exists to be hit.)
            write = batch[0]
            if not write.multi:
                tx = _Tx()
                try:
                    write.outcome = (True, await self._drive(conn, write.make, tx))
                except psycopg.Error:
                    raise
                except Exception as exc:
                    write.outcome = (False, exc)
                if tx.notify:
                    await conn.execute(f"NOTIFY {CHANNEL}")
                return
            primed = await self._alone_first(conn, write)
            if primed is None:
                return
        shared = len(batch) > 1
        try:
            async with conn.pipeline() as pipeline:
                tx = _Tx(pipeline=pipeline)
                async with conn.transaction():
                    for write in batch:
                        faults.hit("store.before_write", write.label)
                    singles = [w for w in batch if not w.multi]
                    if singles:
                        await self._lockstep(conn, singles, tx)
                    for write in batch:
                        if write.multi:
                            await self._one(conn, write, tx, savepoint=shared, primed=primed)
                    if tx.notify:
                        await conn.execute(f"NOTIFY {CHANNEL}")
                    for write in batch:
                        faults.hit("store.before_commit", write.label)
        except _Undo:
            return
        for write in batch:
            faults.hit("store.after_commit", write.label)

    async def _alone_first(self, conn: Conn, write: _Write) -> _Primed | None:
        """Settle a write whose operation opens with an `alone` statement by that statement in
        autocommit, when it is all the operation needs (None). Otherwise the operation goes on
        in a transaction from the query it yields next (returned with it): its first one, or
        the one after an `alone` statement that changed nothing but what it repeats."""
        op = write.make()
        settled = True
        try:
            first, value = prime(op)
            if first is None:
                write.outcome = (True, value)
                return None
            if not first.alone:
                settled = False
                return op, first
            if first.before:
                result = await self._carrying(conn, first)
            else:
                result = await self._execute(conn, _Tx(), first)
            try:
                after = op.send(result)
            except StopIteration as stop:
                write.outcome = (True, stop.value)
                return None
            settled = False
            return op, after
        except psycopg.Error:
            raise
        except Exception as exc:
            write.outcome = (False, exc)
            return None
        finally:
            if settled:
                op.close()

    async def _carrying(self, conn: Conn, query: Query) -> Any:
        """An `alone` statement and those it carries, sent together in one pipeline in
        autocommit: the server runs what precedes a sync as one implicit transaction, so they
        commit together, in one round trip."""
        async with conn.pipeline():
            for carried in query.before:
                await conn.execute(self.queries.sql(carried), carried.params)
            cur = await conn.execute(self.queries.sql(query), query.params)
        return await cur.fetchall()

    async def _lockstep(self, conn: Conn, writes: list[_Write], tx: _Tx) -> None:
        """Run single-statement writes side by side: each round sends the next statement of
        every one of them in one pipeline (one round trip for the lot), then hands each its
        result. Their statements change one row each, fenced by their own lease, so the order
        among them is free, and one that fails has changed nothing."""
        live: list[tuple[_Write, Op[Any], Query]] = []
        for write in writes:
            op = write.make()
            try:
                live.append((write, op, next(op)))
            except StopIteration as stop:
                write.outcome = (True, stop.value)
        while live:
            # Statements of the same text go in one executemany (one result per parameter
            # set), the groups side by side in one pipeline. Guarded, many-row and notify
            # statements, and a dialect's empty ones, run on their own after it (a savepoint
            # cannot share it): their result stays _ALONE.
            groups: dict[str, list[int]] = {}
            for i, (_, _, query) in enumerate(live):
                if sql := self._pipelined(query):
                    groups.setdefault(sql, []).append(i)
            results: list[Any] = [_ALONE] * len(live)
            async with conn.pipeline():
                for sql, members in groups.items():
                    async with conn.cursor() as cursor:
                        params = [live[i][2].params for i in members]
                        await cursor.executemany(sql, params, returning=True)
                        for i in members:
                            if cursor.description is None:
                                results[i] = cursor.rowcount
                            else:
                                results[i] = await cursor.fetchall()
                            cursor.nextset()
            after: list[tuple[_Write, Op[Any], Query]] = []
            for (write, op, query), result in zip(live, results, strict=True):
                try:
                    if result is not _ALONE:
                        after.append((write, op, op.send(result)))
                        continue
                    try:
                        alone = await self._execute(conn, tx, query)
                    except Conflict as conflict:
                        after.append((write, op, op.throw(conflict)))
                    else:
                        after.append((write, op, op.send(alone)))
                except StopIteration as stop:
                    write.outcome = (True, stop.value)
                except psycopg.Error:
                    raise
                except Exception as exc:
                    write.outcome = (False, exc)
            live = after

    def _pipelined(self, query: Query) -> str:
        """The query's SQL if it may share the pipeline, else ""."""
        if query.guard or query.many or query.before or query.name == "notify":
            return ""
        return self.queries.sql(query)

    async def _one(
        self, conn: Conn, write: _Write, tx: _Tx, *, savepoint: bool, primed: _Primed | None = None
    ) -> None:
        """One write of a transaction. An error of the operation's own (a lost lease) is its
        outcome, and its statements are undone; a database error propagates and fails the
        whole transaction."""
        try:
            if savepoint:
                async with conn.transaction():
                    write.outcome = (True, await self._drive(conn, write.make, tx, primed))
            else:
                write.outcome = (True, await self._drive(conn, write.make, tx, primed))
        except psycopg.Error:
            raise
        except Exception as exc:
            write.outcome = (False, exc)
            if write.multi and not savepoint:  # alone in its transaction: undo it whole
                raise _Undo() from exc

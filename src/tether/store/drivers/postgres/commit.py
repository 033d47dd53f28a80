"""The group commit of PostgreSQL writes.

Writes (operations of tether.store.ops) queue; a committer takes every write queued so far and
commits them in one transaction, each fenced by its own statements (one run's lost lease never
fails another's write: that operation alone is undone, by a savepoint when it has several
statements), so many runs share one commit and one WAL flush. A write alone with one statement
runs in autocommit: one round trip; so does an operation whose first statement may do it all
(`alone`: a run's end) when that statement did, and in a shared transaction such statements go
in one round for the lot. It knows nothing of runs, nor of the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg

from tether import faults
from tether.errors import StoreUnavailable
from tether.store.drivers.postgres.statements import Conn, Primed, Statements, Tx
from tether.store.query import Conflict, Op, Query, prime

T = TypeVar("T")

COMMITTERS = 2  # transactions of queued writes in flight at once
MAX_BATCH = 256  # writes in one transaction
RETRIES = 3  # a batch that met a deadlock or a serialization failure is run again
SETTLE = 1.0  # seconds a cancelled caller waits for its write, taken into a transaction, to land
_RETRYABLE = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


@dataclass(slots=True, eq=False)
class _Write:
    make: Callable[[], Op[Any]]
    label: str
    multi: bool  # several statements: a savepoint keeps it whole within a shared transaction
    future: asyncio.Future[Any]
    outcome: tuple[bool, Any] | None = None  # None: not decided (yet, or in this attempt)
    resolved: bool = False  # its transaction is over: the outcome is final
    landed: asyncio.Future[None] | None = None  # set once resolved, for a cancelled caller

    def answer(self) -> tuple[bool, Any]:
        if self.outcome is None:  # a commit interrupted before it decided this write
            return False, StoreUnavailable("the write's commit was interrupted; it may have "
                                           "committed: read it back")  # fmt: skip
        return self.outcome


_ALONE = object()  # in a lockstep round: a statement not sent in the pipeline


def _resolve(write: _Write) -> None:
    write.resolved = True
    if not write.future.done():
        ok, value = write.answer()
        if ok:
            write.future.set_result(value)
        else:
            write.future.set_exception(value)
    if write.landed is not None and not write.landed.done():
        write.landed.set_result(None)


def _send(write: _Write, op: Op[Any], result: Any) -> Query | None:
    """The operation's next query after `result` (a Conflict is thrown into it), or None once
    it has ended, its outcome set. A database error propagates: it fails the transaction."""
    try:
        return op.throw(result) if isinstance(result, Conflict) else op.send(result)
    except StopIteration as stop:
        write.outcome = (True, stop.value)
    except psycopg.Error:
        raise
    except Exception as exc:
        write.outcome = (False, exc)
    return None


class _Undo(Exception):
    """An operation alone in its transaction failed: leave the transaction (rolled back)."""


class GroupCommit:
    """The queue of writes to one database, and the committers that empty it."""

    def __init__(
        self, statements: Statements, connection: Callable[[], AbstractAsyncContextManager[Conn]]
    ) -> None:
        self._statements = statements
        self._connection = connection  # a pooled connection, or StoreUnavailable once closed
        self._queued: list[_Write] = []
        self._committers = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def drain(self) -> None:
        """Wait until every queued write has committed (or failed). Cancelling the wait
        leaves the committers at work: their writes' callers are not the ones cancelled."""
        while self._tasks:
            await asyncio.shield(asyncio.gather(*self._tasks, return_exceptions=True))

    async def write(self, make: Callable[[], Op[T]], *, label: str = "", multi: bool = True) -> T:
        """Commit the operation, with whatever other writes are queued meanwhile; answer after
        the commit. A broken connection fails it with StoreUnavailable: it may have committed
        (the engine resolves that by reading back). Cancelled, it is withdrawn if it was not
        sent yet, else waited for (see _settle_cancelled)."""
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
            ok, value = write.answer()
            if ok:
                return value  # type: ignore[no-any-return]
            raise value
        self._queued.append(write)
        if self._committers < COMMITTERS:
            self._start(loop)
        try:
            return await write.future  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            await self._settle_cancelled(write)
            raise

    async def _settle_cancelled(self, write: _Write) -> None:
        """The caller of `write` was cancelled. Still queued, the write is withdrawn: it never
        commits (a committer that takes it first drops it: see _live). Taken into a
        transaction already, it is waited for, up to SETTLE seconds, its outcome dropped, as a
        statement cancelled on its connection is (direct.DRAIN): a write its caller gave up on
        must not commit after what that caller does next (a stopping worker's claim committed
        after its release kept a run leased to a worker that was gone, until the lease ran
        out). A transaction slower than that (a lock held elsewhere) may still commit after."""
        if write in self._queued:
            self._queued.remove(write)
            return
        if write.resolved:
            return
        # The caller's own future went with its cancellation: another tells when it lands.
        loop = asyncio.get_running_loop()
        landed = write.landed = loop.create_future()
        give_up = loop.time() + SETTLE
        while not landed.done() and (left := give_up - loop.time()) > 0:
            # A cancellation meanwhile does not cut the wait short: the first is raised after.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([landed], timeout=left)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._committers += 1
        task = loop.create_task(self._committer())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _committer(self) -> None:
        try:
            while self._queued:
                batch = self._live(self._queued[:MAX_BATCH])
                del self._queued[:MAX_BATCH]
                if not batch:
                    continue
                try:
                    await self._commit(batch)
                except Exception as exc:  # an injected fault: the attempt's writes fail
                    self._fail(batch, exc)
                except BaseException:  # cancelled mid-commit: nothing is known of the batch
                    self._fail(batch, StoreUnavailable("the commit was interrupted; its "
                                                       "writes may have committed"))  # fmt: skip
                    raise
                finally:
                    for write in batch:
                        _resolve(write)
        finally:
            self._committers -= 1
            if not self._committers:  # ended early: what is still queued would wait for ever
                left, self._queued = self._queued, []
                self._fail(left, StoreUnavailable("the PostgreSQL store stopped committing"))
                for write in left:
                    _resolve(write)

    @staticmethod
    def _live(writes: list[_Write]) -> list[_Write]:
        """Of `writes`, about to be sent, those whose callers still wait: a cancelled one
        (its caller's future cancelled with it, before the caller took it back from the
        queue) is dropped, never sent."""
        live = []
        for write in writes:
            if write.future.cancelled():
                _resolve(write)  # settled: nothing of it was sent
            else:
                live.append(write)
        return live

    async def _commit(self, batch: list[_Write]) -> None:
        """Commit `batch`, setting each write's outcome. A deadlock or serialization failure
        (nothing committed) runs it again; a statement error of one write fails the whole
        transaction, so each is then run alone and only the faulty one fails. Writes whose
        callers were cancelled meanwhile are not run again."""
        for attempt in range(1, RETRIES + 1):
            if attempt > 1:
                batch = self._live(batch)
                if not batch:
                    return
            for write in batch:  # what an attempt rolled back decided nothing
                write.outcome = None
            try:
                async with self._connection() as conn:  # StoreUnavailable once closed
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
                for write in self._live(batch):
                    try:
                        await self._commit([write])
                    except Exception as exc:  # an injected fault fails this write alone
                        write.outcome = (False, exc)
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
        primed: Primed | None = None  # a lone write's operation, taken up to its next query
        if len(batch) == 1 and not faults.ENABLED:
            # One write: autocommit makes a single statement its own transaction, which saves
            # the BEGIN and COMMIT round trips. (With fault sites enabled the explicit path
            # runs, so that "before commit" exists to be hit.)
            write = batch[0]
            if not write.multi:
                tx = Tx()
                try:
                    write.outcome = (True, await self._statements.drive(conn, write.make, tx))
                except psycopg.Error:
                    raise
                except Exception as exc:
                    write.outcome = (False, exc)
                if tx.notify:
                    await self._statements.notify(conn)
                return
            primed = await self._alone_first(conn, write)
            if primed is None:
                return
        shared = len(batch) > 1
        try:
            async with conn.pipeline() as pipeline:
                tx = Tx(pipeline=pipeline)
                async with conn.transaction():
                    for write in batch:
                        faults.hit("store.before_write", write.label)
                    singles = [w for w in batch if not w.multi]
                    if singles:
                        await self._lockstep(conn, singles, tx)
                    multis = [w for w in batch if w.multi]
                    going: Sequence[tuple[_Write, Primed | None]] = [(w, primed) for w in multis]
                    if shared and multis:
                        going = await self._alone_round(conn, multis)
                    for write, taken in going:
                        await self._one(conn, write, tx, savepoint=shared, primed=taken)
                    if tx.notify:
                        await self._statements.notify(conn)
                    for write in batch:
                        faults.hit("store.before_commit", write.label)
        except _Undo:
            return
        for write in batch:
            faults.hit("store.after_commit", write.label)

    async def _alone_first(self, conn: Conn, write: _Write) -> Primed | None:
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
            result = await self._statements.execute(conn, Tx(), first)
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

    async def _lockstep(self, conn: Conn, writes: list[_Write], tx: Tx) -> None:
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
            results = await self._round(conn, [query for _, _, query in live])
            after: list[tuple[_Write, Op[Any], Query]] = []
            for (write, op, query), pipelined in zip(live, results, strict=True):
                result = pipelined
                if result is _ALONE:
                    try:
                        result = await self._statements.execute(conn, tx, query)
                    except Conflict as conflict:
                        result = conflict
                    except psycopg.Error:
                        raise
                    except Exception as exc:
                        write.outcome = (False, exc)
                        continue
                if (following := _send(write, op, result)) is not None:
                    after.append((write, op, following))
            live = after

    async def _alone_round(self, conn: Conn, writes: list[_Write]) -> list[tuple[_Write, Primed]]:
        """Several-statement writes sharing a transaction, whose operation opens with an
        `alone` statement (a run's end, with the checkpoints it carries): those statements
        for all of them in one pipelined round and without a savepoint, since each does its
        whole operation or changes nothing. Returns the writes that go on, each (in its
        savepoint) from the query it yields next, or from its first where it opens otherwise;
        those settled here are done. A savepoint's round trips per write (three or four)
        become one for the lot."""
        going: list[tuple[_Write, Primed]] = []
        sent: list[tuple[_Write, Op[Any], Query]] = []
        try:
            for write in writes:
                op = write.make()
                try:
                    first, value = prime(op)
                except psycopg.Error:
                    raise
                except Exception as exc:
                    write.outcome = (False, exc)
                    continue
                if first is None:
                    write.outcome = (True, value)
                elif first.alone and self._pipelined(first):
                    sent.append((write, op, first))
                else:
                    going.append((write, (op, first)))
            results = await self._round(conn, [query for _, _, query in sent])
        except BaseException:
            for _, op, _ in sent:
                op.close()
            for _, (taken, _) in going:
                taken.close()
            raise
        for (write, op, _), result in zip(sent, results, strict=True):
            if (following := _send(write, op, result)) is not None:
                going.append((write, (op, following)))
        return going  # those settled here are not driven again

    async def _round(self, conn: Conn, queries: list[Query]) -> list[Any]:
        """Each query's result, from one pipeline: statements of the same text in one
        executemany (one result per parameter set), the groups side by side. A query that may
        not share the pipeline (guarded, many-row, notify, a dialect's empty one) gets _ALONE,
        for the caller to run on its own (a savepoint cannot share it)."""
        if not queries:
            return []
        groups: dict[str, list[int]] = {}
        for i, query in enumerate(queries):
            if sql := self._pipelined(query):
                groups.setdefault(sql, []).append(i)
        results: list[Any] = [_ALONE] * len(queries)
        async with conn.pipeline():
            for sql, members in groups.items():
                async with conn.cursor() as cursor:
                    params = [queries[i].params for i in members]
                    await cursor.executemany(sql, params, returning=True)
                    for i in members:
                        if cursor.description is None:
                            results[i] = cursor.rowcount
                        else:
                            results[i] = await cursor.fetchall()
                        cursor.nextset()
        return results

    def _pipelined(self, query: Query) -> str:
        """The query's SQL if it may share the pipeline, else ""."""
        if query.guard or query.many or query.name == "notify":
            return ""
        return self._statements.queries.sql(query)

    async def _one(
        self, conn: Conn, write: _Write, tx: Tx, *, savepoint: bool, primed: Primed | None = None
    ) -> None:
        """One write of a transaction. An error of the operation's own (a lost lease) is its
        outcome, and its statements are undone; a database error propagates and fails the
        whole transaction."""
        drive = self._statements.drive
        try:
            if savepoint:
                async with conn.transaction():
                    write.outcome = (True, await drive(conn, write.make, tx, primed))
            else:
                write.outcome = (True, await drive(conn, write.make, tx, primed))
        except psycopg.Error:
            raise
        except Exception as exc:
            write.outcome = (False, exc)
            if write.multi and not savepoint:  # alone in its transaction: undo it whole
                raise _Undo() from exc

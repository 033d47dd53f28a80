"""Transactions and the outbox on PostgreSQL, mixed into PostgresStore, and the connection a
transaction body gets. One transaction on a pooled connection: the body (in a thread; its
statements run on that connection), its messages, then the checkpoint, fenced by the lease and
locking the run row to the commit (an adopter sees the checkpoint). SQL in sql/postgres/.
It must not import tether.core.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, TypeVar

import psycopg
from psycopg import pq, sql

from tether.errors import PermanentError
from tether.store.base import Checkpoint, Lease
from tether.store.outbox_rows import (
    REFUSAL,
    OutboxMessage,
    OutboxSettlement,
    OutboxStatus,
    TransactionBody,
    TransactionOutcome,
    message_rows,
    outbox_from_row,
    refused_statement,
    settle_args,
    tx_lease_lost,
)
from tether.store.rows import checkpoint_params, load_sql

_Q, _ = load_sql("postgres")
T = TypeVar("T")
Conn = psycopg.AsyncConnection[Any]
Query = str | bytes | sql.SQL | sql.Composed


class _BodyFailed(Exception):
    """Carries what a transaction body raised out of the store's transaction, so that an SQL
    error of the body's own is not taken for a failure of the database."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class PgCursor:
    """The result of a statement a transaction body ran (its rows fetched whole), and a way
    to run more on the same connection."""

    def __init__(self, owner: GuardedPgConnection) -> None:
        self._owner = owner
        self._rows: list[Any] = []
        self._at = 0
        self.rowcount = -1
        self.description: Any = None
        self.statusmessage: str | None = None
        self.arraysize = 1

    def _set(self, result: tuple[list[Any], int, Any, str | None]) -> PgCursor:
        self._rows, self.rowcount, self.description, self.statusmessage = result
        self._at = 0
        return self

    def execute(self, query: Query, params: Any = None) -> PgCursor:
        return self._set(self._owner.run(query, params, many=False))

    def executemany(self, query: Query, params_seq: Iterable[Any]) -> PgCursor:
        return self._set(self._owner.run(query, list(params_seq), many=True))

    def fetchone(self) -> Any:
        if self._at >= len(self._rows):
            return None
        self._at += 1
        return self._rows[self._at - 1]

    def fetchmany(self, size: int | None = None) -> list[Any]:
        n = self.arraysize if size is None else size
        rows = self._rows[self._at : self._at + n]
        self._at += len(rows)
        return rows

    def fetchall(self) -> list[Any]:
        rows = self._rows[self._at :]
        self._at = len(self._rows)
        return rows

    def __iter__(self) -> Iterator[Any]:
        while (row := self.fetchone()) is not None:
            yield row

    def close(self) -> None:
        self._rows = []


class GuardedPgConnection:
    """The connection an @app.transaction() body gets on PostgreSQL: its statements run on
    Tether's own connection, inside the transaction that also writes the step's checkpoint
    (psycopg placeholders: %s, %(name)s). It runs statements (execute, executemany, cursor;
    rows are fetched whole) and refuses what would end or change that transaction: commit(),
    rollback(), close(), transaction() and BEGIN, COMMIT, SAVEPOINT, SET... statements. It
    works only while the body runs."""

    def __init__(self, conn: Conn, loop: asyncio.AbstractEventLoop) -> None:
        self._conn: Conn | None = conn
        self._loop = loop

    def _text(self, query: Query) -> str:
        if isinstance(query, sql.Composable):
            return query.as_string(self._conn)
        return query.decode() if isinstance(query, bytes) else str(query)

    def run(self, query: Query, params: Any, *, many: bool) -> tuple[list[Any], int, Any, Any]:
        conn = self._conn
        if conn is None:
            raise PermanentError(
                "this connection belonged to a transaction step that has ended; use the "
                "connection only inside the body it was passed to"
            )
        why = refused_statement(self._text(query))
        if why is not None:
            raise PermanentError(why)

        async def run() -> tuple[list[Any], int, Any, Any]:
            cur = conn.cursor()
            if many:
                await cur.executemany(query, params)
            else:
                await cur.execute(query, params)
            rows = await cur.fetchall() if cur.description is not None else []
            return rows, cur.rowcount, cur.description, cur.statusmessage

        done: Future[tuple[list[Any], int, Any, Any]]
        done = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return done.result()

    def cursor(self) -> PgCursor:
        return PgCursor(self)

    def execute(self, query: Query, params: Any = None) -> PgCursor:
        return PgCursor(self).execute(query, params)

    def executemany(self, query: Query, params_seq: Iterable[Any]) -> PgCursor:
        return PgCursor(self).executemany(query, params_seq)

    def commit(self) -> None:
        raise PermanentError(f"commit() is not allowed {REFUSAL}")

    def rollback(self) -> None:
        raise PermanentError(f"rollback() is not allowed {REFUSAL}")

    def close(self) -> None:
        raise PermanentError(f"close() is not allowed {REFUSAL}")

    def transaction(self) -> None:
        raise PermanentError(
            f"transaction() (a savepoint) is not allowed {REFUSAL}; to go on after a conflict, "
            f"write the statement so it does not fail (INSERT ... ON CONFLICT)"
        )

    def release(self) -> None:
        """The body has ended (or is abandoned): the connection is Tether's again."""
        self._conn = None


class PostgresOutbox:
    """Mixed into PostgresStore."""

    async def _tx(self, fn: Callable[[Any], Awaitable[T]], *, write: bool, label: str = "") -> T:
        raise NotImplementedError  # PostgresStore's

    async def _rows(self, query: str, args: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError  # PostgresStore's

    async def run_transaction(
        self, lease: Lease, body: TransactionBody, checkpoint: Checkpoint, now: float
    ) -> str:
        cp = checkpoint
        loop = asyncio.get_running_loop()

        async def op(c: Conn) -> str:
            outcome = await _call_body(c, body, loop)
            if outcome.messages:
                async with c.cursor() as cur:
                    rows = message_rows(lease.run_id, cp.name, outcome.messages, now)
                    await cur.executemany(_Q["outbox_insert"], rows)
            done = replace(cp, finished_at=outcome.finished_at or cp.finished_at)
            args = checkpoint_params(
                lease.run_id, done, outcome.result, lease.worker_id, lease.epoch
            )
            # Fenced and locked to the commit (see tx_checkpoint): without the lease nothing
            # is written, and the body's writes and messages are rolled back with it.
            if (await c.execute(_Q["tx_checkpoint"], args)).rowcount != 1:
                raise tx_lease_lost(lease.run_id, lease.worker_id, lease.epoch, cp.name)
            return outcome.result

        try:
            return await self._tx(op, write=True, label=f"run_transaction:{cp.name}")
        except _BodyFailed as failed:
            raise failed.error from None

    async def claim_outbox(
        self, worker_id: str, now: float, claim_until: float, limit: int
    ) -> list[OutboxMessage]:
        args = {"worker": worker_id, "now": now, "claim_until": claim_until,
                "limit": max(0, limit)}  # fmt: skip

        async def op(c: Conn) -> list[OutboxMessage]:
            rows = await (await c.execute(_Q["outbox_claim"], args)).fetchall()
            return sorted((outbox_from_row(r) for r in rows), key=lambda m: (m.created_at, m.id))

        return await self._tx(op, write=True, label="claim_outbox")

    async def settle_outbox(
        self, message_id: str, claim: int, settlement: OutboxSettlement, now: float
    ) -> bool:
        args = settle_args(message_id, claim, settlement, now)

        async def op(c: Conn) -> bool:
            return bool((await c.execute(_Q["outbox_settle"], args)).rowcount == 1)

        return await self._tx(op, write=True, label=f"settle_outbox:{settlement.status.value}")

    async def next_outbox_at(self) -> float | None:
        rows = await self._rows(_Q["outbox_next_at"], {})
        return None if rows[0][0] is None else float(rows[0][0])

    async def list_outbox(
        self,
        *,
        status: OutboxStatus | None = None,
        run_id: str | None = None,
        limit: int = 100,
    ) -> list[OutboxMessage]:
        args = {"status": None if status is None else OutboxStatus(status).value,
                "run_id": run_id, "limit": max(0, limit)}  # fmt: skip
        return [outbox_from_row(r) for r in await self._rows(_Q["outbox_list"], args)]

    async def retry_outbox(self, message_id: str, now: float) -> OutboxMessage | None:
        args = {"id": message_id, "now": now}

        async def op(c: Conn) -> OutboxMessage | None:
            await c.execute(_Q["outbox_retry"], args)
            row = await (await c.execute(_Q["outbox_get"], args)).fetchone()
            return None if row is None else outbox_from_row(row)

        return await self._tx(op, write=True, label="retry_outbox")


async def _call_body(
    c: Conn, body: TransactionBody, loop: asyncio.AbstractEventLoop
) -> TransactionOutcome:
    """Run the body in a thread with a guarded connection on `c`. What it raises comes out as
    _BodyFailed, unless the connection broke (then psycopg.OperationalError: the store's
    failure, StoreUnavailable above). Cancelled meanwhile, it waits for the body to stop (its
    next statement fails) before the connection goes back to the pool."""
    guard = GuardedPgConnection(c, loop)
    running = asyncio.ensure_future(asyncio.to_thread(body, guard))
    try:
        outcome = await asyncio.shield(running)
    except asyncio.CancelledError:
        guard.release()
        await asyncio.wait({running})
        raise
    except Exception as exc:
        if c.broken or c.closed:
            if isinstance(exc, psycopg.OperationalError):
                raise
            raise psycopg.OperationalError(f"the connection broke during a body: {exc}") from exc
        raise _BodyFailed(exc) from exc
    finally:
        guard.release()
    if c.info.transaction_status == pq.TransactionStatus.INERROR:
        raise _BodyFailed(PermanentError(
            "PostgreSQL aborted the transaction of this step after an SQL error that the body "
            "caught and went on from; let such errors propagate (the step is then retried), "
            "or write the statement so it does not fail (INSERT ... ON CONFLICT)"
        ))  # fmt: skip
    return outcome

"""The connection a transaction step's body gets on PostgreSQL, guarded: the body runs in a
thread, its statements on the store's own connection inside the transaction that also writes
the step's checkpoint, and it refuses what would end or change that transaction. It knows
nothing of runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from typing import Any

import psycopg
from psycopg import pq, sql

from tether.errors import PermanentError
from tether.store.drivers.guard import REFUSAL, Refusing, refused_statement
from tether.store.port.outbox import TransactionBody, TransactionOutcome

Conn = psycopg.AsyncConnection[Any]
Query = str | bytes | sql.SQL | sql.Composed


class BodyFailed(Exception):
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


class GuardedPgConnection(Refusing):
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

    def transaction(self) -> None:
        raise PermanentError(
            f"transaction() (a savepoint) is not allowed {REFUSAL}; to go on after a conflict, "
            f"write the statement so it does not fail (INSERT ... ON CONFLICT)"
        )

    def release(self) -> None:
        """The body has ended (or is abandoned): the connection is Tether's again."""
        self._conn = None


async def call_body(
    c: Conn, body: TransactionBody, loop: asyncio.AbstractEventLoop
) -> TransactionOutcome:
    """Run the body in a thread with a guarded connection on `c`. What it raises comes out as
    BodyFailed, unless the connection broke (then psycopg.OperationalError: the store's
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
        raise BodyFailed(exc) from exc
    finally:
        guard.release()
    if c.info.transaction_status == pq.TransactionStatus.INERROR:
        raise BodyFailed(PermanentError(
            "PostgreSQL aborted the transaction of this step after an SQL error that the body "
            "caught and went on from; let such errors propagate (the step is then retried), "
            "or write the statement so it does not fail (INSERT ... ON CONFLICT)"
        ))  # fmt: skip
    return outcome

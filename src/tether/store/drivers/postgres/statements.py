"""Statements on one PostgreSQL connection: a named query's SQL executed (a guarded one in a
savepoint, a notify kept for the transaction's end), and an operation of tether.store.ops driven
through its queries; `one_commit`, a transaction sent whole in one pipeline. Reads, writes alone
and the group commit share it; it never picks a connection, and begins or commits only there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg import pq

from tether.store.drivers.postgres.direct import Direct
from tether.store.query import Conflict, Op, Queries, Query, adrive

T = TypeVar("T")
Conn = psycopg.AsyncConnection[Any]
Primed = tuple[Op[Any], Query]  # an operation taken up to the query it yields next

CHANNEL = "tether"  # NOTIFY channel: something became due


@dataclass(slots=True)
class Tx:
    """What one transaction's statements share: whether some operation asked to NOTIFY, and
    the pipeline its statements are queued on (each result read forces one round trip, which
    also carries what was queued before: BEGIN with the first statement, NOTIFY with COMMIT)."""

    notify: bool = False
    pipeline: psycopg.AsyncPipeline | None = None


class Statements:
    """Runs the named queries of one dialect's SQL on a connection it is given: a statement
    alone outside any transaction straight through libpq (direct.py), the others by psycopg."""

    def __init__(self, queries: Queries, *, prepare: bool = True) -> None:
        self.queries = queries
        self.direct = Direct(prepare=prepare)

    async def execute(self, conn: Conn, tx: Tx, query: Query) -> Any:
        if query.name == "notify":  # once per transaction, at its end
            tx.notify = True
            return []
        sql = self.queries.sql(query)
        if not sql:
            return []
        if (
            tx.pipeline is None
            and not query.many
            and not query.guard
            and self.direct.takes(conn, sql, query.params)
        ):
            return await self.direct.execute(conn, sql, query.params)
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

    async def drive(
        self, conn: Conn, make: Callable[[], Op[T]], tx: Tx, primed: Primed | None = None
    ) -> T:
        """Run the operation `make` gives (or the one `primed` holds, from its next query)."""

        async def run(query: Query) -> Any:
            return await self.execute(conn, tx, query)

        if primed is not None:
            return await adrive(primed[0], run, first=primed[1])
        return await adrive(make(), run)

    @staticmethod
    async def notify(conn: Conn) -> None:
        await conn.execute(f"NOTIFY {CHANNEL}")


@asynccontextmanager
async def one_commit(conn: Conn) -> AsyncIterator[None]:
    """The statements queued inside, on an autocommit connection, as one transaction in one
    round trip: BEGIN and COMMIT go in the pipeline with them, before its one Sync. (Not the
    implicit transaction of a pipeline: psycopg sends the Sync when the block raises too, which
    would commit what was queued before a client-side error, a parameter it cannot send.)
    On any error the transaction is rolled back before the connection is used again."""
    try:
        async with conn.pipeline():
            await conn.execute("BEGIN")
            yield
            await conn.execute("COMMIT")
    except BaseException:
        if not conn.closed and conn.info.transaction_status != pq.TransactionStatus.IDLE:
            with suppress(psycopg.Error):
                await conn.rollback()
        raise

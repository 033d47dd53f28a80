"""Retention on PostgreSQL: deleting what ended long ago a bounded number of rows per
transaction (the runs of a batch locked with SKIP LOCKED, so a resume or another worker's
batch waits for none of it), VACUUM on request, and sizes from pg_total_relation_size.
PostgreSQL's autovacuum makes freed space reusable; there is no log for Tether to checkpoint.

SQL in sql/postgres/retention.sql. It must not import tether.core.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

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

_Q, _ = load_sql("postgres")
T = TypeVar("T")


def _cursor_args(before: float, limit: int, after: Cursor) -> dict[str, object]:
    return {"before": before, "limit": limit, "after_at": after[0], "after_id": after[1]}


async def _one(c: Any, query: str, args: dict[str, object]) -> Any:
    return (await (await c.execute(query, args)).fetchone())[0]


async def _purge_rows(
    c: Any, run_id: str, tables: tuple[str, ...], budget: int, counts: dict[str, int], *, dry: bool
) -> bool:
    """Delete (or count, all of them) up to `budget` of the run's rows in `tables`, table by
    table. False when the budget ran out first: the rest goes in the next batch."""
    args: dict[str, object] = {"id": run_id, "limit": budget}
    for table in tables:
        if dry:
            add_rows(counts, table, int(await _one(c, _Q[f"retention_count_{table}"], args)))
            continue
        deleted = (await c.execute(_Q[f"retention_delete_{table}"], args)).rowcount
        add_rows(counts, table, deleted)
        args["limit"] = budget = budget - deleted
        if budget <= 0:
            return False
    return True


class PostgresRetention:
    """Mixed into PostgresStore."""

    _conninfo: str
    _schema: str | None

    async def _tx(self, fn: Callable[[Any], Awaitable[T]], *, write: bool, label: str = "") -> T:
        raise NotImplementedError  # PostgresStore's

    async def purge_runs(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        limit = max(1, int(limit))

        async def op(c: Any) -> Purge:
            args = _cursor_args(before, scan_size(limit), after)
            found = await (await c.execute(_Q["retention_expired_runs"], args)).fetchall()
            plan = plan_batch(
                [(str(r[0]), float(r[1])) for r in found], {r[0] for r in found if r[3]},
                {r[0]: int(r[2]) for r in found}, limit, after, dry_run=dry_run,
            )  # fmt: skip
            deleted: dict[str, int] = {}
            chosen = {"ids": list(plan.whole)}
            for table in RUN_TABLES if plan.whole else ():
                if dry_run:
                    cur = await c.execute(_Q[f"retention_rows_{table}"], chosen)
                    add_rows(deleted, table, sum(int(n) for _, n in await cur.fetchall()))
                else:
                    cur = await c.execute(_Q[f"retention_delete_all_{table}"], chosen)
                    add_rows(deleted, table, cur.rowcount)
            if plan.whole:
                gone = len(plan.whole) if dry_run else (
                    await c.execute(_Q["retention_delete_runs"], chosen)).rowcount  # fmt: skip
                add_rows(deleted, "tether_runs", gone)
            if plan.big is not None:  # a run bigger than a batch: part of its rows
                big = plan.big[1]
                if not await _purge_rows(c, big, RUN_TABLES, limit, deleted, dry=False):
                    return Purge(deleted, plan.after)
                cur = await c.execute(_Q["retention_delete_run"], {"id": big})
                add_rows(deleted, "tether_runs", cur.rowcount)
                return Purge(deleted, plan.big)
            more = not plan.complete or len(found) == scan_size(limit)
            return Purge(deleted, plan.after if more else None)

        return await self._tx(op, write=not dry_run, label="purge_runs")

    async def purge_streams(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        limit = max(1, int(limit))
        tables = ("tether_stream_entries", "tether_streams")

        async def op(c: Any) -> Purge:
            cur = await c.execute(_Q["retention_ended_runs"], _cursor_args(before, limit, after))
            found = await cur.fetchall()
            counts: dict[str, int] = {}
            cursor = after
            for run_id, finished_at, has_entries in found:
                if has_entries:
                    budget = limit - sum(counts.values())
                    if budget <= 0:
                        return Purge(counts, cursor)
                    if not await _purge_rows(c, run_id, tables, budget, counts, dry=dry_run):
                        return Purge(counts, cursor)
                cursor = (float(finished_at), str(run_id))
            return Purge(counts, cursor if len(found) == limit else None)

        return await self._tx(op, write=not dry_run, label="purge_streams")

    async def purge_approvals(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        limit = max(1, int(limit))

        async def op(c: Any) -> Purge:
            args = _cursor_args(before, limit, after)
            found = await (await c.execute(_Q["retention_expired_approvals"], args)).fetchall()
            counts: dict[str, int] = {}
            cursor = after
            for approval_id, updated_at in found:
                if sum(counts.values()) >= limit:
                    return Purge(counts, cursor)
                one = {"id": approval_id}
                if dry_run:
                    audit = int(await _one(c, _Q["retention_count_audit"], one))
                    add_rows(counts, "tether_approval_audit", audit)
                    add_rows(counts, "tether_approvals", 1)
                else:
                    audit = (await c.execute(_Q["retention_delete_audit"], one)).rowcount
                    add_rows(counts, "tether_approval_audit", audit)
                    gone = (await c.execute(_Q["retention_delete_approval"], one)).rowcount
                    add_rows(counts, "tether_approvals", gone)
                cursor = (float(updated_at), str(approval_id))
            return Purge(counts, cursor if len(found) == limit else None)

        return await self._tx(op, write=not dry_run, label="purge_approvals")

    async def compact(self, max_pages: int) -> int:
        return 0  # autovacuum makes freed space reusable; VACUUM FULL is an operator's call

    async def vacuum(self) -> int | None:
        # VACUUM cannot run inside a transaction: a connection of its own, in autocommit.
        async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as conn:
            if self._schema is not None:
                await conn.execute(f'SET search_path TO "{self._schema}"')
            before = await (await conn.execute(_Q["retention_table_sizes"], {})).fetchall()
            for name, _ in before:
                await conn.execute(f"VACUUM (ANALYZE) {table_name(name)}")
            after = await (await conn.execute(_Q["retention_table_sizes"], {})).fetchall()
        return sum(int(b) for _, b in before) - sum(int(b) for _, b in after)

    async def checkpoint_wal(self) -> WalState | None:
        return None  # PostgreSQL manages its own write-ahead log

    async def storage_sizes(self) -> StorageSizes:
        async def op(c: Any) -> StorageSizes:
            found = await (await c.execute(_Q["retention_table_sizes"], {})).fetchall()
            tables = []
            for name, size in found:
                query = _Q["retention_count_rows"].format(table=table_name(name))
                tables.append(TableSize(name, int(await _one(c, query, {})), int(size)))
            database = int(await _one(c, _Q["retention_database_bytes"], {}))
            return StorageSizes(backend="postgres", tables=tuple(tables), database_bytes=database)

        return await self._tx(op, write=False)

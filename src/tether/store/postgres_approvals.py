"""The approval operations of the PostgreSQL backend, mixed into PostgresStore: one transaction
each, SQL in sql/postgres/queries.sql; and close_approvals, which ending a run calls in its own
transaction. It must not import tether.core.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from tether.errors import ApprovalNotFound, LeaseLost
from tether.store.approval_rows import (
    ApprovalChange,
    ApprovalRecord,
    AuditEntry,
    ChangeFn,
    Note,
    apply_change,
    approval_from_row,
    approval_key,
    approval_to_row,
    audit_from_row,
    cancel_on_run_end,
    chain,
)
from tether.store.base import Lease, RunStatus
from tether.store.rows import audit_to_row, load_sql

_Q, _ = load_sql("postgres")
T = TypeVar("T")


class PostgresApprovals:
    async def _tx(self, fn: Callable[[Any], Awaitable[T]], *, write: bool, label: str = "") -> T:
        raise NotImplementedError  # PostgresStore's

    async def _rows(self, query: str, args: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError  # PostgresStore's

    async def _lost(self, conn: Any, lease: Lease) -> LeaseLost:
        raise NotImplementedError  # PostgresStore's

    async def _deliver(self, conn: Any, run_id: str, key: str, payload: str, now: float) -> None:
        raise NotImplementedError  # PostgresStore's

    async def create_approval(
        self, lease: Lease, record: ApprovalRecord, now: float
    ) -> tuple[ApprovalRecord, bool]:
        fence = {"run_id": lease.run_id, "worker": lease.worker_id, "epoch": lease.epoch}
        stored, entries = chain(record, [Note("created", None, {"title": record.title})], now)

        async def op(c: Any) -> tuple[ApprovalRecord, bool]:
            if await (await c.execute(_Q["lease_held"], fence)).fetchone() is None:
                raise await self._lost(c, lease)
            if (await c.execute(_Q["insert_approval"], approval_to_row(stored))).rowcount == 0:
                row = await (await c.execute(_Q["get_approval"], {"id": record.id})).fetchone()
                assert row is not None
                return approval_from_row(row), False
            await insert_audit(c, entries)
            return stored, True

        return await self._tx(op, write=True, label=f"create_approval:{record.id}")

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        rows = await self._rows(_Q["get_approval"], {"id": approval_id})
        return approval_from_row(rows[0]) if rows else None

    async def list_approvals(
        self, *, status: str | None = None, run_id: str | None = None, limit: int = 100
    ) -> list[ApprovalRecord]:
        args = {"status": status, "run_id": run_id, "limit": max(0, limit)}
        return [approval_from_row(r) for r in await self._rows(_Q["list_approvals"], args)]

    async def change_approval(
        self, approval_id: str, change: ChangeFn, now: float
    ) -> tuple[ApprovalRecord, ApprovalChange]:
        async def op(c: Any) -> tuple[ApprovalRecord, ApprovalChange]:
            found = await (await c.execute(_Q["approval_run"], {"id": approval_id})).fetchone()
            if found is None:
                raise ApprovalNotFound(
                    f"no approval has id {approval_id!r}; list them with `tether approvals list`"
                )
            # The run first, then the approval: the order in which finish_run and cancel_run
            # lock them, so the two never deadlock, and the run's status holds until commit.
            cur = await c.execute(_Q["lock_run_status"], {"id": found[0]})
            status = await cur.fetchone()
            run_status = None if status is None else RunStatus(status[0])
            row = await (await c.execute(_Q["lock_approval"], {"id": approval_id})).fetchone()
            assert row is not None  # approvals are never deleted
            record = approval_from_row(row)
            outcome = change(record, None if run_status is None else run_status.value, now)
            stored = await save_approval(c, apply_change(record, outcome, now))
            if outcome.event is not None and run_status is not None and not run_status.terminal:
                await self._deliver(c, record.run_id, approval_key(approval_id), outcome.event, now)
            return stored, outcome

        return await self._tx(op, write=True, label=f"change_approval:{approval_id}")

    async def approval_audit(self, approval_id: str) -> list[AuditEntry]:
        return [audit_from_row(r) for r in await self._rows(_Q["approval_audit"],
                                                            {"id": approval_id})]  # fmt: skip


async def insert_audit(conn: Any, entries: Sequence[AuditEntry]) -> None:
    async with conn.cursor() as cur:
        await cur.executemany(_Q["insert_audit"], [audit_to_row(e) for e in entries])


async def save_approval(
    conn: Any, saved: tuple[ApprovalRecord, list[AuditEntry]]
) -> ApprovalRecord:
    """Write a changed approval's row and append its new audit entries."""
    record, entries = saved
    await conn.execute(_Q["update_approval"], approval_to_row(record))
    await insert_audit(conn, entries)
    return record


async def close_approvals(conn: Any, run_id: str, status: RunStatus, now: float) -> None:
    """Cancel the pending approvals of a run that ended, in its transaction."""
    rows = await (await conn.execute(_Q["pending_approvals"], {"run_id": run_id})).fetchall()
    for row in rows:
        record = approval_from_row(row)
        change = cancel_on_run_end(record, status.value, now)
        await save_approval(conn, apply_change(record, change, now))

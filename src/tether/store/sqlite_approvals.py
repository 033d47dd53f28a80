"""The approval operations of the SQLite backend, mixed into SqliteStore, and the helpers that
ending a run shares with them (its pending approvals cancelled, events delivered, a lost lease
explained): one transaction each, SQL in sql/sqlite/queries.sql. It must not import tether.core.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from tether.store.sqlite_commit import CommitQueue

_Q, _ = load_sql("sqlite")


def lease_lost(conn: sqlite3.Connection, lease: Lease) -> LeaseLost:
    row = conn.execute(
        "SELECT owner, epoch, status FROM tether_runs WHERE id = ?", (lease.run_id,)
    ).fetchone()
    now = "is gone" if row is None else f"is {row[2]}, owner {row[0]!r}, epoch {row[1]}"
    return LeaseLost(
        f"worker {lease.worker_id!r} lost run {lease.run_id!r} (it held epoch {lease.epoch}; "
        f"the run {now}); this worker stops executing it"
    )


class SqliteApprovals:
    _db: CommitQueue

    async def create_approval(
        self, lease: Lease, record: ApprovalRecord, now: float
    ) -> tuple[ApprovalRecord, bool]:
        fence = {"run_id": lease.run_id, "worker": lease.worker_id, "epoch": lease.epoch}
        stored, entries = chain(record, [Note("created", None, {"title": record.title})], now)

        def op(c: sqlite3.Connection) -> tuple[ApprovalRecord, bool]:
            if c.execute(_Q["lease_held"], fence).fetchone() is None:
                raise lease_lost(c, lease)
            if c.execute(_Q["insert_approval"], approval_to_row(stored)).rowcount == 0:
                row = c.execute(_Q["get_approval"], {"id": record.id}).fetchone()
                return approval_from_row(row), False
            c.executemany(_Q["insert_audit"], [audit_to_row(e) for e in entries])
            return stored, True

        label = f"create_approval:{record.id}"
        return await self._db.submit(op, write=True, label=label, multi=True)

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        def op(c: sqlite3.Connection) -> ApprovalRecord | None:
            row = c.execute(_Q["get_approval"], {"id": approval_id}).fetchone()
            return None if row is None else approval_from_row(row)

        return await self._db.submit(op, write=False)

    async def list_approvals(
        self, *, status: str | None = None, run_id: str | None = None, limit: int = 100
    ) -> list[ApprovalRecord]:
        args = {"status": status, "run_id": run_id, "limit": max(0, limit)}
        return await self._db.submit(
            lambda c: [approval_from_row(r) for r in c.execute(_Q["list_approvals"], args)],
            write=False,
        )

    async def change_approval(
        self, approval_id: str, change: ChangeFn, now: float
    ) -> tuple[ApprovalRecord, ApprovalChange]:
        # A multi-statement write runs in BEGIN IMMEDIATE (sqlite_commit): the write lock is
        # held from the first read, so no other process changes the row between read and write.
        def op(c: sqlite3.Connection) -> tuple[ApprovalRecord, ApprovalChange]:
            row = c.execute(_Q["get_approval"], {"id": approval_id}).fetchone()
            if row is None:
                raise ApprovalNotFound(
                    f"no approval has id {approval_id!r}; list them with `tether approvals list`"
                )
            record = approval_from_row(row)
            found = c.execute(_Q["run_status"], {"id": record.run_id}).fetchone()
            run_status = None if found is None else RunStatus(found[0])
            outcome = change(record, None if run_status is None else run_status.value, now)
            stored = _save_approval(c, apply_change(record, outcome, now))
            if outcome.event is not None and run_status is not None and not run_status.terminal:
                deliver_event(c, record.run_id, approval_key(approval_id), outcome.event, now)
            return stored, outcome

        label = f"change_approval:{approval_id}"
        return await self._db.submit(op, write=True, label=label, multi=True)

    async def approval_audit(self, approval_id: str) -> list[AuditEntry]:
        return await self._db.submit(
            lambda c: [
                audit_from_row(r) for r in c.execute(_Q["approval_audit"], {"id": approval_id})
            ],
            write=False,
        )


def deliver_event(c: sqlite3.Connection, run_id: str, key: str, payload: str, now: float) -> None:
    args = {"run_id": run_id, "key": key, "payload": payload, "now": now}
    c.execute(_Q["insert_event"], args)
    c.execute(_Q["wake_for_event"], args)


def _save_approval(
    c: sqlite3.Connection, saved: tuple[ApprovalRecord, list[AuditEntry]]
) -> ApprovalRecord:
    """Write a changed approval's row and append its new audit entries."""
    record, entries = saved
    c.execute(_Q["update_approval"], approval_to_row(record))
    c.executemany(_Q["insert_audit"], [audit_to_row(e) for e in entries])
    return record


def close_approvals(c: sqlite3.Connection, run_id: str, status: RunStatus, now: float) -> None:
    """Cancel the pending approvals of a run that ended, in its transaction."""
    for row in c.execute(_Q["pending_approvals"], {"run_id": run_id}).fetchall():
        record = approval_from_row(row)
        _save_approval(c, apply_change(record, cancel_on_run_end(record, status.value, now), now))

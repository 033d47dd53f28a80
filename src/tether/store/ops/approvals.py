"""The operations on approvals: create one under a run's lease, read and list them, change one
atomically (a decision, an expiry, a cancellation) with its audit entries, and cancel the
pending approvals of a run that ended; and keep the database's secrets (the key of digests).

Written once for both SQL dialects. A change locks the run, then the approval: the order in
which a run's end locks them, so the two never deadlock. It must not touch a connection.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from tether.errors import ApprovalNotFound
from tether.store.audit import apply_change, cancel_on_run_end, chain, created_note
from tether.store.keys import approval_key
from tether.store.ops.common import deliver, fence, lease_lost
from tether.store.port import Lease, RunStatus
from tether.store.port.approvals import (
    ApprovalChange,
    ApprovalRecord,
    AuditEntry,
    ChangeFn,
    Eligible,
)
from tether.store.query import Op, Query, execute_many, one, select
from tether.store.rows import approval_from_row, approval_to_row, audit_from_row, audit_to_row


def create_approval(
    lease: Lease, record: ApprovalRecord, now: float
) -> Op[tuple[ApprovalRecord, bool]]:
    stored, entries = chain(record, [created_note(record)], now)
    if (yield from one("lease_held", **fence(lease))) is None:
        raise (yield from lease_lost(lease))
    if (yield Query("insert_approval", approval_to_row(stored))) == 0:
        row = yield from one("get_approval", id=record.id)
        assert row is not None
        return approval_from_row(row), False
    yield from _audit(entries)
    return stored, True


def get_approval(approval_id: str) -> Op[ApprovalRecord | None]:
    row = yield from one("get_approval", id=approval_id)
    return None if row is None else approval_from_row(row)


def list_approvals(
    status: str | None, run_id: str | None, limit: int, reviewer: Eligible | None = None
) -> Op[list[ApprovalRecord]]:
    if reviewer is None:
        rows = yield from select("list_approvals", status=status, run_id=run_id,
                                 limit=max(0, limit))  # fmt: skip
    else:
        after_at, after_id = reviewer.after
        rows = yield from select("reviewer_approvals", status=status, run_id=run_id,
                                 eligible=json.dumps(list(reviewer.entries)),
                                 viewer=reviewer.name, after_at=after_at, after_id=after_id,
                                 limit=max(0, limit))  # fmt: skip
    return [approval_from_row(r) for r in rows]


def change_approval(
    approval_id: str, change: ChangeFn, now: float
) -> Op[tuple[ApprovalRecord, ApprovalChange]]:
    found = yield from one("approval_run", id=approval_id)
    if found is None:
        raise ApprovalNotFound(
            f"no approval has id {approval_id!r}; list them with `tether approvals list`"
        )
    status = yield from one("lock_run_status", id=found[0])
    run_status = None if status is None else RunStatus(status[0])
    row = yield from one("lock_approval", id=approval_id)
    assert row is not None  # deleted only with its run, by retention
    record = approval_from_row(row)
    outcome = change(record, None if run_status is None else run_status.value, now)
    stored = yield from _save(apply_change(record, outcome, now))
    if outcome.event is not None and run_status is not None and not run_status.terminal:
        yield from deliver(record.run_id, approval_key(approval_id), outcome.event, now)
    return stored, outcome


def approval_audit(approval_id: str) -> Op[list[AuditEntry]]:
    rows = yield from select("approval_audit", id=approval_id)
    return [audit_from_row(r) for r in rows]


def close_approvals(run_id: str, status: RunStatus, now: float) -> Op[None]:
    """Cancel the pending approvals of a run that ended, in its transaction."""
    for row in (yield from select("pending_approvals", run_id=run_id)):
        record = approval_from_row(row)
        yield from _save(apply_change(record, cancel_on_run_end(record, status.value, now), now))


def approval_steps(after: tuple[str, int], limit: int) -> Op[list[tuple[str, int, str]]]:
    rows = yield from select("approval_steps", after_run=after[0], after_seq=after[1],
                             limit=max(0, limit))  # fmt: skip
    return [(str(r[0]), int(r[1]), str(r[2])) for r in rows]


def database_secret(name: str, fresh: str, now: float) -> Op[str]:
    """The secret stored under `name`, stored as `fresh` if there was none."""
    yield Query("insert_secret", {"name": name, "value": fresh, "now": now})
    row = yield from one("get_secret", name=name)
    assert row is not None  # inserted just above, or by whoever won the race
    return str(row[0])


def _save(saved: tuple[ApprovalRecord, list[AuditEntry]]) -> Op[ApprovalRecord]:
    """Write a changed approval's row and append its new audit entries."""
    record, entries = saved
    yield Query("update_approval", approval_to_row(record))
    yield from _audit(entries)
    return record


def _audit(entries: Sequence[AuditEntry]) -> Op[None]:
    yield from execute_many("insert_audit", [audit_to_row(e) for e in entries])

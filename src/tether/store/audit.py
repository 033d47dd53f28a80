"""The arithmetic of an approval's audit trail: each entry hash-chained to the one before,
changes applied to the row with their entries, the rule that a run's end cancels its pending
approvals, and the check of a chain. Pure functions, no I/O and no policy of decisions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace

from tether.store.port.approvals import (
    CANCELLED,
    EXPIRED,
    GENESIS,
    PENDING,
    ApprovalChange,
    ApprovalRecord,
    AuditEntry,
    Note,
)


def audit_hash(
    prev_hash: str, approval_id: str, seq: int, at: float, event: str, actor: str | None,
    detail: str,
) -> str:  # fmt: skip
    """SHA-256 over the entry and the hash before it: editing or deleting an entry breaks every
    hash after it (and the approval row keeps the head and the count, for the last one)."""
    text = json.dumps([prev_hash, approval_id, seq, at, event, actor, detail])
    return hashlib.sha256(text.encode()).hexdigest()


def chain(
    record: ApprovalRecord, notes: Sequence[Note], now: float
) -> tuple[ApprovalRecord, list[AuditEntry]]:
    """Place `notes` at the end of the record's audit chain: (the record with its new head and
    count, the entries to insert)."""
    entries = []
    head, count = record.audit_head, record.audit_count
    for note in notes:
        count += 1
        detail = json.dumps(note.detail or {}, sort_keys=True)
        digest = audit_hash(head, record.id, count, now, note.event, note.actor, detail)
        entries.append(AuditEntry(record.id, count, now, note.event, note.actor, detail,
                                  head, digest))  # fmt: skip
        head = digest
    return replace(record, audit_count=count, audit_head=head, updated_at=now), entries


def apply_change(
    record: ApprovalRecord, change: ApprovalChange, now: float
) -> tuple[ApprovalRecord, list[AuditEntry]]:
    """The row to store and the entries to insert for `change` to a stored `record`."""
    return chain(change.record or record, change.notes, now)


def cancel_on_run_end(record: ApprovalRecord, run_status: str | None, now: float) -> ApprovalChange:
    """A run that ends (or is cancelled) with approvals pending cancels them: nobody would act
    on a decision any more, and a late decision must be refused."""
    if record.status != PENDING:
        return ApprovalChange()
    reason = f"the run ended ({run_status})" if run_status else "the run is gone"
    return ApprovalChange(
        record=replace(record, status=CANCELLED),
        notes=(Note("cancelled", None, {"reason": reason}),),
    )


def verify_chain(record: ApprovalRecord, entries: Sequence[AuditEntry]) -> list[str]:
    """What is wrong with an approval's audit trail (empty when intact): edited entries break
    their hash, deleted ones break the sequence or the chain, a deleted tail the count."""
    problems = []
    head = GENESIS
    for expected, entry in enumerate(entries, start=1):
        if entry.seq != expected:
            problems.append(f"entry {expected} is missing (found entry {entry.seq} in its place)")
            break
        digest = audit_hash(head, entry.approval_id, entry.seq, entry.at, entry.event,
                            entry.actor, entry.detail)  # fmt: skip
        if entry.prev_hash != head or entry.hash != digest:
            problems.append(f"entry {entry.seq} ({entry.event}) was altered: its hash does not "
                            f"match its content and the entry before it")  # fmt: skip
            break
        head = entry.hash
    if not problems and (len(entries) != record.audit_count or head != record.audit_head):
        problems.append(
            f"the trail has {len(entries)} entries but the approval recorded "
            f"{record.audit_count}: entries at the end were deleted or the head was changed"
        )
    told = _status_told(entries)
    decided_somehow = told is None and record.status != PENDING
    if not problems and told != record.status and not decided_somehow:
        problems.append(
            f"the approval says {record.status!r} but its trail says {told!r}: its row was "
            f"changed outside Tether"
        )
    return problems


def _status_told(entries: Sequence[AuditEntry]) -> str | None:
    """The status an approval's trail leads to: its last decision or closure, else pending;
    None for a decision whose entry does not name its status."""
    status: str | None = PENDING
    for entry in entries:
        if entry.event == "decided":
            status = json.loads(entry.detail).get("status")
        elif entry.event in (EXPIRED, CANCELLED):
            status = entry.event
    return status

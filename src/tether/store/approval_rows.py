"""Approvals as the store keeps them: the approval row, its append-only audit trail hash-chained
per approval, and the change a caller asks the store to apply atomically.

The store never judges a decision: it locks the row, calls the caller's pure `change` function
with what it holds, and writes the outcome (new row, chained audit entries, a mailbox event) in
one transaction. This module must not import tether.core or any backend; it holds no policy
beyond the chain arithmetic and the rule that a run's end cancels its pending approvals.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

PENDING = "pending"
APPROVED = "approved"
REJECTED = "rejected"
EXPIRED = "expired"
CANCELLED = "cancelled"
GENESIS = "0" * 64  # the prev_hash of an approval's first audit entry


def approval_key(approval_id: str) -> str:
    """The mailbox key on which a run learns that its approval was decided or closed."""
    return f"tether:approval:{approval_id}"


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """One approval. `operation` and `context` are stored redacted (what reviewers see); the
    digest covers the raw operation. JSON fields are text made by tether.serde or json."""

    id: str
    run_id: str
    step: str  # the checkpoint name of the approval call in its run
    title: str
    description: str
    options: str  # JSON list of {id, label, style, schema}
    operation: str  # JSON, redacted
    operation_digest: str
    reviewers: str  # JSON list of names and "group:<name>"; "*" is anyone
    required: int  # distinct approvers needed
    separate_duties: bool  # the run's starter may not decide
    starter: str | None  # who started the run
    context: str  # JSON, redacted
    response_schema: str | None  # JSON schema every response must satisfy, if any
    created_at: float
    expires_at: float
    status: str = PENDING  # pending, approved, rejected, expired, cancelled, or an option id
    decision: str | None = None  # JSON {option, reviewer, approvers, comment, response, at}
    votes: str = "[]"  # JSON list of approvals given so far towards `required`
    outcomes: str = "[]"  # JSON list of {ref, outcome, detail, at} reported by the run
    audit_count: int = 0
    audit_head: str = GENESIS  # the hash of the newest audit entry
    updated_at: float = 0.0


# The columns the SQL backends keep outside the JSON body (queried or updated on their own).
_COLUMNS = ("id", "run_id", "step", "status", "created_at", "expires_at", "updated_at",
            "audit_count", "audit_head")  # fmt: skip


def approval_to_row(record: ApprovalRecord) -> dict[str, Any]:
    """Column values for a SQL row: the queried columns, and `body` (JSON of the rest)."""
    data = {f: getattr(record, f) for f in ApprovalRecord.__dataclass_fields__}
    row = {c: data.pop(c) for c in _COLUMNS}
    row["body"] = json.dumps(data, sort_keys=True)
    return row


def approval_from_row(row: Sequence[Any]) -> ApprovalRecord:
    """The record from a row selected as APPROVAL_COLUMNS."""
    values = dict(zip((*_COLUMNS, "body"), row, strict=True))
    body = json.loads(values.pop("body"))
    return ApprovalRecord(**values, **body)


APPROVAL_COLUMNS = ", ".join((*_COLUMNS, "body"))


@dataclass(frozen=True, slots=True)
class AuditEntry:
    approval_id: str
    seq: int  # 1, 2, ... per approval
    at: float
    event: str  # created, viewed, voted, decided, refused, expired, cancelled, outcome
    actor: str | None
    detail: str  # JSON object
    prev_hash: str
    hash: str


AUDIT_COLUMNS = "approval_id, seq, at, event, actor, detail, prev_hash, hash"


def audit_from_row(row: Sequence[Any]) -> AuditEntry:
    return AuditEntry(*row)


def audit_hash(
    prev_hash: str, approval_id: str, seq: int, at: float, event: str, actor: str | None,
    detail: str,
) -> str:  # fmt: skip
    """SHA-256 over the entry and the hash before it: editing or deleting an entry breaks every
    hash after it (and the approval row keeps the head and the count, for the last one)."""
    text = json.dumps([prev_hash, approval_id, seq, at, event, actor, detail])
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Note:
    """An audit entry to append: the store gives it its place in the chain."""

    event: str
    actor: str | None = None
    detail: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ApprovalChange:
    """What a `change` function asks for: the approval's new state (None: unchanged), audit
    entries to append, and a payload to deliver to the run under approval_key(id), all in one
    transaction. `refused` carries the reason a request was refused (audit it in `notes`)."""

    record: ApprovalRecord | None = None
    notes: tuple[Note, ...] = ()
    event: str | None = None
    refused: str | None = None


# change(stored record, the run's status or None if the run is gone, now) -> ApprovalChange
ChangeFn = Callable[[ApprovalRecord, str | None, float], ApprovalChange]


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

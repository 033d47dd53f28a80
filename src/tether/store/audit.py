"""The arithmetic of an approval's audit trail: each entry hash-chained to the one before, the
`created` entry committing to the approval's fixed fields, changes applied to the row with their
entries, the rule that a run's end cancels its pending approvals, and the check of a row against
its trail. Pure functions, no I/O and no policy of decisions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace

from tether.store.port.approvals import (
    APPROVED,
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


# What an approval is asked with and never changes: the `created` entry commits to them, so a
# row rewritten behind Tether's back (other reviewers, a lower quorum, another operation) shows.
FIXED = ("run_id", "step", "title", "description", "options", "operation", "operation_digest",
         "reviewers", "required", "separate_duties", "starter", "context", "response_schema",
         "created_at", "expires_at")  # fmt: skip


def fixed_digest(record: ApprovalRecord) -> str:
    """SHA-256 of the approval's fixed fields (FIXED), exactly as stored."""
    text = json.dumps([[name, getattr(record, name)] for name in FIXED])
    return hashlib.sha256(text.encode()).hexdigest()


def created_note(record: ApprovalRecord) -> Note:
    """The first entry of an approval: its title, the digest of its fixed fields (`covers`), and
    the fields one checks by eye (`fixed`), so that the trail alone says what was asked."""
    fixed = {
        "run_id": record.run_id, "step": record.step,
        "reviewers": json.loads(record.reviewers), "required": record.required,
        "separate_duties": record.separate_duties, "starter": record.starter,
        "options": [o["id"] for o in json.loads(record.options)],
        "operation_digest": record.operation_digest, "expires_at": record.expires_at,
    }  # fmt: skip
    return Note("created", None, {"title": record.title, "covers": fixed_digest(record),
                                  "fixed": fixed})  # fmt: skip


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


NOT_COVERED = "not covered"


def covered(entries: Sequence[AuditEntry]) -> bool:
    """Whether the trail's `created` entry commits to the fixed fields (approvals made before
    it did are checked by their chain and status only: "not covered", not broken)."""
    return (
        bool(entries)
        and entries[0].event == "created"
        and "covers" in json.loads(entries[0].detail)
    )


def verify_record(record: ApprovalRecord, entries: Sequence[AuditEntry]) -> list[str]:
    """What is wrong with an approval's row and trail (empty when they agree): the chain
    (verify_chain), the fixed fields against the `created` entry's commitment, and who decided,
    with which option, response and approvers, against the `voted` and `decided` entries."""
    problems = verify_chain(record, entries)
    if problems:
        return problems
    if covered(entries):
        committed = json.loads(entries[0].detail)
        if committed["covers"] != fixed_digest(record):
            problems.append(_rewritten(record, committed.get("fixed") or {}))
    problems += _decision_problems(record, entries)
    return problems


def _rewritten(record: ApprovalRecord, fixed: dict[str, object]) -> str:
    now = (created_note(record).detail or {})["fixed"]
    changed = [name for name, value in fixed.items() if now.get(name) != value]
    which = ", ".join(changed) if changed else "title, description, operation or context"
    return (
        f"the approval's row was rewritten outside Tether: its fixed fields ({which}) are not "
        "what its `created` entry commits to; do not act on it, restore it from a backup"
    )


def _decision_problems(record: ApprovalRecord, entries: Sequence[AuditEntry]) -> list[str]:
    voted = [e for e in entries if e.event == "voted"]
    decided = [e for e in entries if e.event == "decided"]
    votes = [v.get("reviewer") for v in json.loads(record.votes)]
    told_votes = [e.actor for e in voted] + [e.actor for e in decided[-1:]]
    problems = []
    if votes != told_votes:
        problems.append(f"the approval's votes name {votes} but its trail {told_votes}: its row "
                        "was changed outside Tether")  # fmt: skip
    if not decided or not record.decision:
        return problems
    last = json.loads(decided[-1].detail)
    data = json.loads(record.decision)
    for name in ("reviewer", "option", "response"):
        if data.get(name) != last.get(name):
            problems.append(f"the approval says its {name} is {data.get(name)!r} but its "
                            f"`decided` entry says {last.get(name)!r}: its row was changed "
                            "outside Tether")  # fmt: skip
    if last.get("status") == APPROVED:
        approvers = [e.actor for e in voted] + [decided[-1].actor]
        if list(data.get("approvers") or ()) != approvers:
            problems.append(
                f"the approval names approvers {data.get('approvers')} but its "
                f"trail {approvers}: its row was changed outside Tether"
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

"""The rules of deciding, as pure change functions the store applies atomically to one approval
(see tether.store.port.approvals and tether.store.audit): a vote, an expiry, a cancellation, a
view, a reported outcome.

Every path that does not approve fails closed: it is refused or ends the approval without
approving, and the refusal is written to the audit trail in the same transaction. No I/O here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from tether.approvals.model import Reviewer
from tether.redact import redact
from tether.serde import canonical
from tether.store.port import TERMINAL_STATUSES
from tether.store.port.approvals import (
    APPROVED,
    CANCELLED,
    EXPIRED,
    PENDING,
    REJECTED,
    STATUSES,
    ApprovalChange,
    ApprovalRecord,
    ChangeFn,
    Note,
)

_TERMINAL = {s.value for s in TERMINAL_STATUSES}


@dataclass(frozen=True, slots=True)
class Vote:
    reviewer: Reviewer
    option: str
    operation_digest: str
    comment: str | None = None
    response: Any = None


def status_of(option: str) -> str:
    return {"approve": APPROVED, "reject": REJECTED}.get(option, option)


def _refuse(reason: str, message: str, actor: str | None, **detail: Any) -> ApprovalChange:
    note = Note("refused", actor, {"reason": reason, "message": message, **detail})
    return ApprovalChange(notes=(note,), refused=f"{reason}: {message}")


def _close(record: ApprovalRecord, status: str, actor: str | None, detail: dict[str, Any],
           now: float, *extra: Note) -> ApprovalChange:  # fmt: skip
    """End a pending approval without a decision (expired, cancelled); the run is told."""
    data = {"option": None, "reviewer": actor, "comment": detail.get("reason"), "at": now}
    return ApprovalChange(
        record=replace(record, status=status, decision=json.dumps(data)),
        notes=(Note(status, actor, detail), *extra),
        event=json.dumps({"status": status, **data}),
    )


def vote(v: Vote) -> ChangeFn:
    """A reviewer's decision: refused unless every rule holds; with `required` > 1 approvals
    accumulate as votes until enough distinct reviewers approved."""

    def change(record: ApprovalRecord, run_status: str | None, now: float) -> ApprovalChange:
        who = v.reviewer.name
        reviewers = json.loads(record.reviewers)
        asked = {"option": v.option}
        if v.reviewer.service:
            return _refuse("wrong_reviewer", f"{who!r} is a service account (groups "
                           f"{', '.join(sorted(v.reviewer.groups))}) and never decides an "
                           "approval; decide as a person", who, **asked)  # fmt: skip
        if not v.reviewer.may_decide(reviewers):
            return _refuse("wrong_reviewer", f"{who!r} is not among the reviewers of this "
                           f"approval ({', '.join(reviewers)})", who, **asked)  # fmt: skip
        if record.separate_duties and record.starter is None:
            # Made before creation refused this: with nobody known to have started the run,
            # nobody can be told apart from the starter, so nobody decides.
            return _refuse("separate_duties", "separation of duties is asked but the run has no "
                           "known starter; cancel this approval and start the run with "
                           "started_by=...", who, **asked)  # fmt: skip
        if record.separate_duties and who == record.starter:
            return _refuse("separate_duties", f"{who!r} started this run and may not decide "
                           "its approval (separation of duties)", who, **asked)  # fmt: skip
        if record.status != PENDING:
            reason = "expired" if record.status == EXPIRED else "already_decided"
            return _refuse(reason, f"the approval is {record.status} already; a decision is "
                           "taken once", who, **asked)  # fmt: skip
        if run_status is None or run_status in _TERMINAL:
            return _refuse("run_ended", f"its run has ended ({run_status or 'gone'})", who, **asked)
        if now >= record.expires_at:
            late = "the approval expired before this decision"
            refused = Note("refused", who, {"reason": "expired", "message": late, **asked})
            closing = _close(record, EXPIRED, None, {"reason": "expired"}, now, refused)
            return replace(closing, refused=f"expired: {late}")
        if v.operation_digest != record.operation_digest:
            return _refuse("stale_digest", "the operation digest does not match the operation "
                           "of this approval: look at the approval again and decide what it "
                           "shows now", who, **asked, digest=v.operation_digest)  # fmt: skip
        options = {o["id"]: o for o in json.loads(record.options)}
        if v.option in STATUSES:
            # Refused at definition since; an older approval may still offer one.
            return _refuse("unknown_option", f"{v.option!r} is a status, not an option one "
                           "may choose", who, **asked)  # fmt: skip
        if v.option not in options:
            return _refuse("unknown_option", f"{v.option!r} is not an option of this approval "
                           f"(options: {', '.join(options)})", who, **asked)  # fmt: skip
        problem = _invalid_response(record, options[v.option].get("schema"), v.response)
        if problem is not None:
            return _refuse("invalid_response", problem, who, **asked)
        votes = json.loads(record.votes)
        if any(x["reviewer"] == who for x in votes):
            return _refuse("already_voted", f"{who!r} approved already; {record.required} "
                           "distinct reviewers must approve", who, **asked)  # fmt: skip
        pending = [x for x in votes if x["option"] == "approve"]
        earlier = pending[0].get("response") if pending else None
        if v.option == "approve" and pending and not _same(earlier, v.response):
            # A quorum approves one operation: an approval with another edit is not a vote for
            # the edit already approved, and must never let its own edit run.
            edit = canonical(redact(earlier))
            return _refuse("differing_edit", f"{len(pending)} reviewer(s) approved the response "
                           f"{edit}; approve that one or reject (a different edit needs a new "
                           "approval)", who, **asked, response=redact(v.response))  # fmt: skip
        entry = {"reviewer": who, "option": v.option, "comment": v.comment,
                 "response": v.response, "at": now}  # fmt: skip
        if v.option == "approve" and len(votes) + 1 < record.required:
            detail = {**entry, "approvals": len(votes) + 1, "required": record.required}
            return ApprovalChange(
                record=replace(record, votes=json.dumps([*votes, entry])),
                notes=(Note("voted", who, detail),),
            )
        approvers = [x["reviewer"] for x in votes] + [who] if v.option == "approve" else [who]
        status = status_of(v.option)
        data = {**entry, "approvers": approvers}
        return ApprovalChange(
            record=replace(record, status=status, decision=json.dumps(data),
                           votes=json.dumps([*votes, entry])),
            notes=(Note("decided", who, {**entry, "status": status}),),
            event=json.dumps({"status": status, **data}),
        )  # fmt: skip

    return change


def _same(a: Any, b: Any) -> bool:
    return canonical(a) == canonical(b)


def _invalid_response(record: ApprovalRecord, schema: object, response: Any) -> str | None:
    given = (schema, json.loads(record.response_schema or "null"))
    schemas: list[dict[str, Any]] = [s for s in given if isinstance(s, dict)]
    if not schemas:
        return None if response is None else "this option takes no response"
    from jsonschema import Draft202012Validator  # see model.check_schema

    for each in schemas:
        errors = sorted(Draft202012Validator(each).iter_errors(response), key=str)
        if errors:
            where = "/".join(str(p) for p in errors[0].absolute_path) or "the response"
            return f"invalid response at {where}: {errors[0].message}"
    return None


def expire(record: ApprovalRecord, run_status: str | None, now: float) -> ApprovalChange:
    """The run's own expiry timer fired: a pending approval expires (no approval). The run
    itself is the one closing it, so nothing is sent to its mailbox."""
    if record.status != PENDING:
        return ApprovalChange()
    return replace(_close(record, EXPIRED, None, {"reason": "expired"}, now), event=None)


def cancel(actor: str | None, reason: str) -> ChangeFn:
    """An operator withdraws the question: the run sees status cancelled (not approved)."""

    def change(record: ApprovalRecord, run_status: str | None, now: float) -> ApprovalChange:
        if record.status != PENDING:
            return _refuse("already_decided", f"the approval is {record.status} already",
                           actor, option=None)  # fmt: skip
        return _close(record, CANCELLED, actor, {"reason": reason}, now)

    return change


def viewed(actor: str) -> ChangeFn:
    """A reviewer's look, recorded once per reviewer (`viewers` remembers who looked)."""

    def change(record: ApprovalRecord, run_status: str | None, now: float) -> ApprovalChange:
        viewers = json.loads(record.viewers)
        if actor in viewers:
            return ApprovalChange()
        return ApprovalChange(
            record=replace(record, viewers=json.dumps([*viewers, actor])),
            notes=(Note("viewed", actor),),
        )

    return change


def outcome(ref: str, what: str, detail: Any) -> ChangeFn:
    """What the run reports after the decision; `ref` (its checkpoint) makes it happen once."""

    def change(record: ApprovalRecord, run_status: str | None, now: float) -> ApprovalChange:
        outcomes = json.loads(record.outcomes)
        if any(o["ref"] == ref for o in outcomes):
            return ApprovalChange()
        entry = {"ref": ref, "outcome": what, "detail": detail, "at": now}
        return ApprovalChange(
            record=replace(record, outcomes=json.dumps([*outcomes, entry])),
            notes=(Note("outcome", None, {"outcome": what, "detail": detail}),),
        )

    return change

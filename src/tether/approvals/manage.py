"""Approvals from outside a run: list them, show one (audited as viewed), decide, cancel, read
and verify the audit trail. What the App, the CLI and the server call.

Every refusal raises ApprovalRefused after it was written to the audit trail; nothing here
approves anything the rules in rules.py did not accept inside the store's transaction.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tether.approvals.model import (
    Approval,
    Decision,
    HistoryEntry,
    Reviewer,
    as_reviewer,
    decision_from,
)
from tether.approvals.rules import Vote, cancel, viewed, vote
from tether.errors import ApprovalNotFound, ApprovalRefused, ConfigurationError
from tether.store.audit import verify_chain
from tether.store.port.approvals import PENDING

if TYPE_CHECKING:
    from tether.core.engine import Engine

MAX_COMMENT = 10_000


def _not_found(approval_id: str) -> ApprovalNotFound:
    return ApprovalNotFound(
        f"no approval has id {approval_id!r}; list them with `tether approvals list`"
    )


async def list_approvals(
    engine: Engine,
    *,
    status: str | None = PENDING,
    run_id: str | None = None,
    reviewer: Reviewer | str | None = None,
    limit: int = 100,
) -> list[Approval]:
    """Approvals, oldest first; with `reviewer`, only those this reviewer may decide. A pending
    approval past its expiry shows as expired (and is left out of status="pending")."""
    now = engine.clock.now()
    # Expired-but-unclosed approvals are filtered after the query, so fetch a margin more.
    records = await engine.store.list_approvals(status=_stored(status), run_id=run_id,
                                                limit=limit * 2 + 10)  # fmt: skip
    shown = [Approval.of(r, now) for r in records]
    if status is not None:
        shown = [a for a in shown if a.status == status]
    if reviewer is not None:
        who = as_reviewer(reviewer)
        shown = [a for a in shown if a.may_decide(who)]
    return shown[:limit]


def _stored(status: str | None) -> str | None:
    return PENDING if status == "expired" else status


async def get_approval(
    engine: Engine, approval_id: str, *, viewer: Reviewer | str | None = None
) -> Approval:
    """One approval; with `viewer`, their look is recorded in the audit trail."""
    if viewer is not None:
        who = as_reviewer(viewer)
        record, _ = await engine.store.change_approval(approval_id, viewed(who.name),
                                                       engine.clock.now())  # fmt: skip
    else:
        found = await engine.store.get_approval(approval_id)
        if found is None:
            raise _not_found(approval_id)
        record = found
    return Approval.of(record, engine.clock.now())


async def decide(
    engine: Engine,
    approval_id: str,
    option: str,
    *,
    reviewer: Reviewer | str,
    operation_digest: str,
    comment: str | None = None,
    response: Any = None,
) -> Decision:
    """Decide an approval as `reviewer`. Returns the Decision (status `pending` for a vote
    towards a quorum); raises ApprovalRefused (audited) when any rule does not hold."""
    who = as_reviewer(reviewer)
    if not isinstance(option, str) or not isinstance(operation_digest, str):
        raise ConfigurationError("decide() takes the option id and the operation digest as str")
    if comment is not None and (not isinstance(comment, str) or len(comment) > MAX_COMMENT):
        raise ConfigurationError(f"a comment is a str of at most {MAX_COMMENT} chars")
    # The response is stored as JSON: check it encodes before anything is written.
    response = json.loads(engine.serde.dumps(response, what="the decision's response"))
    ballot = Vote(who, option, operation_digest, comment, response)
    record, change = await engine.store.change_approval(approval_id, vote(ballot),
                                                        engine.clock.now())  # fmt: skip
    if change.refused is not None:
        reason, _, message = change.refused.partition(": ")
        raise ApprovalRefused(f"approval {approval_id!r} refused {who.name!r}: {message}",
                              reason=reason)  # fmt: skip
    if change.event is not None:
        engine.wake(record.run_id)
    if record.status == PENDING:
        votes = json.loads(record.votes)
        return Decision(approval_id, PENDING, option=option, reviewer=who.name, comment=comment,
                        response=response, approvers=tuple(v["reviewer"] for v in votes),
                        run_id=record.run_id, step=record.step,
                        operation_digest=record.operation_digest)  # fmt: skip
    data = json.loads(record.decision or "{}")
    decision = decision_from(approval_id, record.status, data, record.run_id, record.step)
    return replace(decision, operation_digest=record.operation_digest)


async def cancel_approval(
    engine: Engine, approval_id: str, *, actor: str | None = None, reason: str = "cancelled"
) -> Decision:
    """Withdraw a pending approval: its run sees status `cancelled` (not approved)."""
    record, change = await engine.store.change_approval(approval_id, cancel(actor, reason),
                                                        engine.clock.now())  # fmt: skip
    if change.refused is not None:
        raise ApprovalRefused(f"approval {approval_id!r}: {change.refused}",
                              reason=change.refused.partition(":")[0])  # fmt: skip
    engine.wake(record.run_id)
    return decision_from(approval_id, record.status, json.loads(record.decision or "{}"),
                         record.run_id, record.step)  # fmt: skip


async def history(engine: Engine, approval_id: str) -> list[HistoryEntry]:
    """The approval's audit trail, oldest first."""
    if await engine.store.get_approval(approval_id) is None:
        raise _not_found(approval_id)
    return [HistoryEntry.of(e) for e in await engine.store.approval_audit(approval_id)]


async def verify(engine: Engine, approval_id: str | None = None) -> dict[str, list[str]]:
    """Check audit trails against their hash chains: {approval id: problems} for every
    approval checked (an empty list when intact)."""
    if approval_id is not None:
        found = await engine.store.get_approval(approval_id)
        if found is None:
            raise _not_found(approval_id)
        records = [found]
    else:
        records = await engine.store.list_approvals(status=None, limit=1_000_000)
    return {r.id: verify_chain(r, await engine.store.approval_audit(r.id)) for r in records}

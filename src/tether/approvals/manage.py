"""Approvals from outside a run: list them, show one (audited as viewed), decide, cancel, read
the audit trail and verify rows against their trails. What the App, the CLI and the server call.

Every refusal raises ApprovalRefused after it was written to the audit trail; nothing here
approves anything the rules in rules.py did not accept inside the store's transaction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tether.approvals.flow import approval_id
from tether.approvals.model import (
    ANYONE,
    Approval,
    Decision,
    HistoryEntry,
    Reviewer,
    as_reviewer,
    decision_from,
)
from tether.approvals.rules import Vote, cancel, viewed, vote
from tether.errors import ApprovalNotFound, ApprovalRefused, ConfigurationError
from tether.redact import redact_text
from tether.store.audit import covered, verify_record
from tether.store.port.approvals import (
    PENDING,
    ApprovalChange,
    ApprovalRecord,
    ChangeFn,
    Eligible,
)

if TYPE_CHECKING:
    from tether.core.engine import Engine

MAX_COMMENT = 10_000
CHANNELS = ("app", "api", "inbox", "cli")  # where a look, a decision or a cancellation came from
MAX_CLIENT = 200


def origin(channel: str, client: str | None) -> dict[str, str | None]:
    """The `channel` and `client` every audit entry of a request records, checked."""
    if channel not in CHANNELS:
        raise ConfigurationError(
            f"channel is one of {', '.join(CHANNELS)}, not {channel!r}: say where the request "
            "came from (the App's own callers use 'app')"
        )
    if client is not None and (not isinstance(client, str) or len(client) > MAX_CLIENT):
        raise ConfigurationError(
            f"client is an address or host/pid of at most {MAX_CLIENT} chars, or None"
        )
    return {"channel": channel, "client": client}


def stamped(change: ChangeFn, where: dict[str, str | None]) -> ChangeFn:
    """`change` with `where` (channel, client) added to the detail of every entry it writes:
    the trail says how each look and decision arrived, not only who claimed to make it."""

    def apply(record: ApprovalRecord, run_status: str | None, now: float) -> ApprovalChange:
        outcome = change(record, run_status, now)
        notes = tuple(replace(n, detail={**(n.detail or {}), **where}) for n in outcome.notes)
        return replace(outcome, notes=notes)

    return apply


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
    if reviewer is not None:
        return await _inbox(engine, as_reviewer(reviewer), status, run_id, limit, now)
    # Expired-but-unclosed approvals are filtered after the query, so fetch a margin more.
    records = await engine.store.list_approvals(status=_stored(status), run_id=run_id,
                                                limit=limit * 2 + 10)  # fmt: skip
    shown = [Approval.of(r, now) for r in records]
    if status is not None:
        shown = [a for a in shown if a.status == status]
    return shown[:limit]


async def _inbox(
    engine: Engine, who: Reviewer, status: str | None, run_id: str | None, limit: int, now: float
) -> list[Approval]:
    """The approvals `who` may decide, selected by the store page by page (oldest first), so
    thousands asked of others never hide theirs."""
    if who.service:
        return []
    entries = (ANYONE, who.name, *sorted(f"group:{g}" for g in who.groups))
    eligible = Eligible(who.name, entries)
    shown: list[Approval] = []
    page = max(limit, 1) + 10
    while len(shown) < limit:
        records = await engine.store.list_approvals(status=_stored(status), run_id=run_id,
                                                    limit=page, reviewer=eligible)  # fmt: skip
        for record in records:
            approval = Approval.of(record, now)
            # Only an approval past its expiry but not yet closed is left out here.
            if (status is None or approval.status == status) and approval.may_decide(who):
                shown.append(approval)
        if len(records) < page:
            break
        eligible = replace(eligible, after=(records[-1].created_at, records[-1].id))
    return shown[:limit]


def _stored(status: str | None) -> str | None:
    return PENDING if status == "expired" else status


async def get_approval(
    engine: Engine,
    approval_id: str,
    *,
    viewer: Reviewer | str | None = None,
    channel: str = "app",
    client: str | None = None,
) -> Approval:
    """One approval; with `viewer`, their first look is recorded in the audit trail (a second
    look by the same viewer appends nothing, so reading never grows the trail without bound)."""
    where = origin(channel, client)
    found = await engine.store.get_approval(approval_id)
    if found is None:
        raise _not_found(approval_id)
    record = found
    # Checked again inside the store's transaction (rules.viewed); this read only spares the
    # write lock for a look already on the record.
    if viewer is not None and as_reviewer(viewer).name not in json.loads(record.viewers):
        record, _ = await engine.store.change_approval(
            approval_id, stamped(viewed(as_reviewer(viewer).name), where), engine.clock.now()
        )
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
    channel: str = "app",
    client: str | None = None,
) -> Decision:
    """Decide an approval as `reviewer`. Returns the Decision (status `pending` for a vote
    towards a quorum); raises ApprovalRefused (audited) when any rule does not hold. `channel`
    and `client` say where the decision came from; every entry it writes records them."""
    where = origin(channel, client)
    who = as_reviewer(reviewer)
    if not isinstance(option, str) or not isinstance(operation_digest, str):
        raise ConfigurationError("decide() takes the option id and the operation digest as str")
    if comment is not None and (not isinstance(comment, str) or len(comment) > MAX_COMMENT):
        raise ConfigurationError(f"a comment is a str of at most {MAX_COMMENT} chars")
    # The response is stored as JSON: check it encodes before anything is written.
    response = json.loads(engine.serde.dumps(response, what="the decision's response"))
    # A comment is stored, shown to everyone who reads the trail and sent in webhooks: a secret
    # pasted into it is redacted before it is written (the reviewer sees the redaction).
    comment = None if comment is None else redact_text(comment)
    ballot = Vote(who, option, operation_digest, comment, response)
    record, change = await engine.store.change_approval(
        approval_id, stamped(vote(ballot), where), engine.clock.now()
    )
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
    engine: Engine,
    approval_id: str,
    *,
    actor: str | None = None,
    reason: str = "cancelled",
    channel: str = "app",
    client: str | None = None,
) -> Decision:
    """Withdraw a pending approval: its run sees status `cancelled` (not approved)."""
    where = origin(channel, client)
    record, change = await engine.store.change_approval(
        approval_id, stamped(cancel(actor, reason), where), engine.clock.now()
    )
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


@dataclass(frozen=True, slots=True)
class TrailCheck:
    """What `verify` found for one approval: its problems (none: the row and its trail agree)
    and whether its `created` entry commits to its fixed fields (False for approvals made
    before it did: their chain and status are checked, their fixed fields cannot be)."""

    problems: tuple[str, ...] = ()
    covered: bool = True


async def check(engine: Engine, approval_id: str | None = None) -> dict[str, TrailCheck]:
    """Check approvals against their trails (audit.verify_record); without `approval_id`, also
    every approval a run's checkpoint says it created that is missing from the table (deleted
    with its trail)."""
    store = engine.store
    if approval_id is not None:
        found = await store.get_approval(approval_id)
        if found is None:
            raise _not_found(approval_id)
        records = [found]
    else:
        records = await store.list_approvals(status=None, limit=1_000_000)
    checked = {}
    for record in records:
        entries = await store.approval_audit(record.id)
        checked[record.id] = TrailCheck(tuple(verify_record(record, entries)), covered(entries))
    if approval_id is None:
        checked.update(await _missing(engine, set(checked)))
    return checked


async def _missing(engine: Engine, known: set[str]) -> dict[str, TrailCheck]:
    missing = {}
    after = ("", 0)
    while steps := await engine.store.approval_steps(after, 1000):
        for run_id, _, name in steps:
            aid = approval_id(run_id, name)
            if aid not in known:
                problem = (f"run {run_id!r} created approval {aid!r} (its checkpoint {name!r}) "
                           "but the approval is not in the table: it was deleted with its trail "
                           "outside Tether")  # fmt: skip
                missing[aid] = TrailCheck((problem,), covered=False)
        after = steps[-1][:2]
    return missing


async def verify(engine: Engine, approval_id: str | None = None) -> dict[str, list[str]]:
    """Check approvals against their trails: {approval id: problems} for every approval checked
    (an empty list when the row and its trail agree), missing ones included (see `check`)."""
    return {aid: list(c.problems) for aid, c in (await check(engine, approval_id)).items()}


class ApprovalsMixin:
    """The App's approval methods (App inherits them): each opens the App, then calls the
    function of the same name above."""

    engine: Engine

    if TYPE_CHECKING:

        async def open(self) -> None: ...

    async def list_approvals(
        self,
        status: str | None = "pending",
        *,
        run_id: str | None = None,
        reviewer: Reviewer | str | None = None,
        limit: int = 100,
    ) -> list[Approval]:
        """Approvals, oldest first (status None: all); with `reviewer`, only those they may
        decide."""
        await self.open()
        return await list_approvals(self.engine, status=status, run_id=run_id,
                                           reviewer=reviewer, limit=limit)  # fmt: skip

    async def get_approval(
        self,
        approval_id: str,
        *,
        viewer: Reviewer | str | None = None,
        channel: str = "app",
        client: str | None = None,
    ) -> Approval:
        """One approval (ApprovalNotFound otherwise); a `viewer`'s first look is audited, with
        the `channel` (app, api, inbox, cli) and `client` it came from."""
        await self.open()
        return await get_approval(self.engine, approval_id, viewer=viewer,
                                         channel=channel, client=client)  # fmt: skip

    async def decide(
        self,
        approval_id: str,
        option: str,
        *,
        reviewer: Reviewer | str,
        operation_digest: str,
        comment: str | None = None,
        response: object = None,
        channel: str = "app",
        client: str | None = None,
    ) -> Decision:
        """Decide an approval: `operation_digest` is the digest the reviewer saw. Raises
        ApprovalRefused (with `.reason`, audited) unless every rule holds; with a quorum, a
        vote that does not complete it returns a Decision with status `pending`. The trail
        records the `channel` (app, api, inbox, cli) and `client` the decision came from."""
        await self.open()
        return await decide(self.engine, approval_id, option, reviewer=reviewer,
                                   operation_digest=operation_digest, comment=comment,
                                   response=response, channel=channel,
                                   client=client)  # fmt: skip

    async def cancel_approval(
        self,
        approval_id: str,
        *,
        actor: str | None = None,
        reason: str = "cancelled",
        channel: str = "app",
        client: str | None = None,
    ) -> Decision:
        """Withdraw a pending approval; its run sees status `cancelled`. The trail records the
        `channel` (app, api, inbox, cli) and `client` it came from."""
        await self.open()
        return await cancel_approval(self.engine, approval_id, actor=actor,
                                            reason=reason, channel=channel,
                                            client=client)  # fmt: skip

    async def approval_history(self, approval_id: str) -> list[HistoryEntry]:
        """The approval's audit trail, oldest first: entries (at, event, actor, detail)."""
        await self.open()
        return await history(self.engine, approval_id)

    async def verify_approvals(self, approval_id: str | None = None) -> dict[str, list[str]]:
        """Check approvals against their audit trails (the hash chain, the fixed fields the
        `created` entry commits to, who decided), and find approvals deleted with their trail:
        {approval id: problems}, an empty list when intact."""
        await self.open()
        return await verify(self.engine, approval_id)

    async def check_approvals(self, approval_id: str | None = None) -> dict[str, TrailCheck]:
        """verify_approvals with, for each approval, whether its trail covers its fixed fields
        (approvals made before Tether recorded that are "not covered", not broken)."""
        await self.open()
        return await check(self.engine, approval_id)

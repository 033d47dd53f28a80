"""`tether.approval()` inside a workflow: create the approval once per call site, wait durably for
its decision or expiry, re-check the bound operation, and tell notifiers and webhooks.

Each part is a checkpoint, so replay and restarts never create a second approval or deliver a
callback twice. The rules of deciding live in rules.py; this module never judges a decision.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

from tether.approvals.digest import digest_key
from tether.approvals.model import (
    APPROVE_REJECT,
    Decision,
    Option,
    check_schema,
    decision_from,
    operation_digest,
)
from tether.approvals.notify import Webhook, deliver_webhook, notify
from tether.approvals.rules import expire, outcome
from tether.core.context import current_run
from tether.core.execution import RunContext
from tether.core.outage import MISSING
from tether.core.waits import EventWait, Plan, TimerWait, check_duration, wait
from tether.errors import ConfigurationError, NonDeterminismError
from tether.redact import mask, redact, redact_text
from tether.store.keys import approval_key
from tether.store.port import CheckpointStatus
from tether.store.port.approvals import ApprovalRecord

log = logging.getLogger("tether.approvals")


def approval_id(run_id: str, step: str) -> str:
    """The id of the approval a run asks for at `step`: the same on every replay."""
    return "ap-" + hashlib.sha256(f"{len(run_id)}:{run_id}:{step}".encode()).hexdigest()[:32]


async def approval(
    title: str,
    description: str = "",
    options: Sequence[Option] = APPROVE_REJECT,
    operation: Any = None,
    reviewers: Sequence[str] = (),
    expires_in: timedelta = timedelta(days=1),
    context: Any = None,
    response_schema: dict[str, Any] | None = None,
    *,
    required: int = 1,
    separate_duties: bool = False,
    on_decision: Webhook | None = None,
    key: str | None = None,
) -> Decision:
    """Ask people to decide, and wait durably for the decision. The decision is bound to
    `operation` by digest, taken once, by one of `reviewers` (names, `group:<name>`, or `*`),
    from `required` distinct reviewers for approval; after `expires_in` it is `expired` and
    `approved` is False. `context` and `operation` are shown to reviewers with secrets
    redacted. `separate_duties` refuses the person who started the run. `key` names the
    approval within its run (its checkpoint is `approval:<key>`, its id derived from it) for
    callers whose own ids must map to one approval, such as an interrupt's id."""
    spec = _check(title, description, options, reviewers, expires_in, response_schema, required,
                  on_decision)  # fmt: skip
    spec["separate_duties"] = bool(separate_duties)
    ctx = current_run("approval")
    serde = ctx.engine.serde
    base = "approval" if key is None else f"approval:{check_approval_key(key)}"
    slot = ctx.slot(base, "approval")
    name, recorded = slot.name, slot.recorded
    plain = json.loads(serde.dumps(operation))
    with ctx.io():
        secret = await digest_key(ctx.engine.store, ctx.engine.clock.now())
    digest = operation_digest(ctx.run_id, name, plain, key=secret)
    aid = approval_id(ctx.run_id, name)
    if recorded is not None and recorded.status is CheckpointStatus.COMPLETED:
        info = ctx.decode(recorded, lambda: dict(json.loads(recorded.result or "{}")))
        if info.get("digest") == operation_digest(ctx.run_id, name, plain):
            digest = info["digest"]  # made before digests were keyed: it keeps its digest
        if info.get("digest") != digest:
            raise ctx.abandon(NonDeterminismError(
                f"approval {name!r} of run {ctx.run_id!r} was asked for an operation with "
                f"digest {info.get('digest')}, this code asks for {digest}: the operation "
                f"changed, so the recorded decision does not apply to it. Let the run finish on "
                f"the old code (it is held until code that replays it comes), or start it anew.",
                recorded=[name], requested=[name], position=slot.position,
            ))  # fmt: skip
    else:
        stored = await _create(ctx, aid, name, digest, spec, (operation, secret), context)
        info = {"id": aid, "digest": digest, "expires_at": stored.expires_at}
        now = ctx.engine.clock.now()
        await ctx.write(slot.checkpoint(CheckpointStatus.COMPLETED, attempts=1,
                                        result=json.dumps(info), started_at=now,
                                        finished_at=now))  # fmt: skip
    await notify(ctx, aid, "requested")
    plan = Plan({"decision": EventWait(approval_key(aid)),
                 "expiry": TimerWait(at=info["expires_at"])})  # fmt: skip
    won, value = await wait(ctx, f"{name}:wait", "approval-wait", plan)
    if won != approval_key(aid):
        value = await _expire(ctx, aid, name)
    decision = _decision(ctx, aid, name, value, operation, digest, secret)
    if on_decision is not None:
        await deliver_webhook(on_decision, decision)
    await notify(ctx, aid, "decided")
    return decision


def check_approval_key(key: str) -> str:
    if not isinstance(key, str) or not key or len(key) > 200 or "#" in key:
        raise ConfigurationError(
            f"an approval key is a str of 1-200 chars without '#', not {key!r}"
        )
    return key


def _check(
    title: str, description: str, options: Sequence[Option], reviewers: Sequence[str],
    expires_in: timedelta, response_schema: object, required: int, on_decision: object,
) -> dict[str, Any]:  # fmt: skip
    if not isinstance(title, str) or not title.strip() or len(title) > 500:
        raise ConfigurationError(f"an approval needs a title of 1-500 chars, not {title!r}")
    if not isinstance(description, str):
        raise ConfigurationError("an approval's description is a str")
    options = list(options)
    if not options or not all(isinstance(o, Option) for o in options):
        raise ConfigurationError("approval options are a non-empty list of tether.Option")
    ids = [o.id for o in options]
    if len(set(ids)) != len(ids):
        raise ConfigurationError(f"approval option ids must be distinct: {ids}")
    if (
        isinstance(reviewers, str)
        or not reviewers
        or not all(isinstance(r, str) and r.strip() for r in reviewers)
    ):
        raise ConfigurationError(
            "an approval needs reviewers: a list of names and 'group:<name>' (or ['*'] for "
            f"anyone who may decide), not {reviewers!r}"
        )
    seconds = check_duration(expires_in, "approval expires_in")
    if seconds <= 0:
        raise ConfigurationError("an approval's expires_in must be positive")
    check_schema(response_schema, "approval response_schema")
    if not isinstance(required, int) or isinstance(required, bool) or required < 1:
        raise ConfigurationError(f"required= takes an int >= 1, not {required!r}")
    if on_decision is not None and not isinstance(on_decision, Webhook):
        raise ConfigurationError(f"on_decision takes a tether.Webhook, not {on_decision!r}")
    return {"title": title, "description": description, "options": options,
            "reviewers": list(reviewers), "seconds": seconds,
            "response_schema": response_schema, "required": required}  # fmt: skip


async def _create(
    ctx: RunContext, aid: str, name: str, digest: str, spec: dict[str, Any],
    keyed: tuple[Any, bytes], context: Any,
) -> ApprovalRecord:  # fmt: skip
    operation, key = keyed
    engine = ctx.engine
    serde = engine.serde
    await ctx.at_frontier()
    if ctx.pending:
        await ctx.flush()
    starter = await _starter(ctx)
    if spec.get("separate_duties") and starter is None:
        # Fail closed: without a known starter nobody can be told apart from them.
        raise ConfigurationError(
            f"approval {spec['title']!r} asks for separate_duties=True, but run {ctx.run_id!r} "
            "has no known starter (nor has any run above it): start the run with "
            "app.start(..., started_by=NAME) (the server does this for the signed-in user), "
            "or drop separate_duties"
        )
    now = engine.clock.now()
    schema = spec["response_schema"]
    record = ApprovalRecord(
        # Title and description are shown and logged everywhere: stored redacted, as the
        # reviewer sees them.
        id=aid, run_id=ctx.run_id, step=name, title=redact_text(spec["title"]),
        description=redact_text(spec["description"]),
        options=json.dumps([o.to_json() for o in spec["options"]]),
        # Masked, not merely redacted: the reviewer sees that a value is hidden, how long it is
        # and its fingerprint, and sees in full what only pretends to be a secret.
        operation=json.dumps(mask(json.loads(serde.dumps(operation)), key)),
        operation_digest=digest, reviewers=json.dumps(spec["reviewers"]),
        required=spec["required"], separate_duties=bool(spec.get("separate_duties")),
        starter=starter,
        context=json.dumps(redact(json.loads(serde.dumps(context, what="approval context")))),
        response_schema=None if schema is None else json.dumps(schema),
        created_at=now, expires_at=now + spec["seconds"],
    )  # fmt: skip

    async def call() -> ApprovalRecord:
        stored, _ = await engine.store.create_approval(ctx.lease, record, engine.clock.now())
        return stored

    async def read_back() -> object:
        found = await engine.store.get_approval(aid)
        return MISSING if found is None else found

    stored: ApprovalRecord = await ctx.durable(call, read_back)
    return stored


async def _starter(ctx: RunContext) -> str | None:
    """Who started the run, or the nearest ancestor run someone started."""
    run_id: str | None = ctx.run_id
    while run_id is not None:
        with ctx.io():
            run = await ctx.engine.store.get_run(run_id)
        if run is None:
            return None
        if run.started_by is not None:
            return run.started_by
        run_id = run.parent_id
    return None


async def _expire(ctx: RunContext, aid: str, name: str) -> dict[str, Any]:
    """The expiry timer won: close the approval (a decision that raced in first stands)."""
    slot = ctx.slot(f"{name}:expiry", "approval-expiry")
    recorded = slot.recorded
    if recorded is not None and recorded.status is CheckpointStatus.COMPLETED:
        return ctx.decode(recorded, lambda: dict(json.loads(recorded.result or "{}")))
    store, clock = ctx.engine.store, ctx.engine.clock

    async def call() -> ApprovalRecord:
        stored, _ = await store.change_approval(aid, expire, clock.now())
        return stored

    stored: ApprovalRecord = await ctx.durable(call, call)
    value = {"status": stored.status, **json.loads(stored.decision or "{}")}
    now = clock.now()
    await ctx.write(slot.checkpoint(CheckpointStatus.COMPLETED, attempts=1,
                                    result=json.dumps(value), started_at=now,
                                    finished_at=now))  # fmt: skip
    return value


def _decision(
    ctx: RunContext, aid: str, name: str, value: Any, operation: Any, digest: str, key: bytes
) -> Decision:
    data = dict(value or {})
    decision = decision_from(aid, str(data.get("status")), data, ctx.run_id, name)
    response = decision.response
    if isinstance(response, dict) and "arguments" in response and isinstance(operation, dict):
        # An edit: the operation changes, so it gets its own digest; the old approval does
        # not cover it, and the workflow decides whether to ask again.
        edited = {**operation, "arguments": response["arguments"]}
        plain = json.loads(ctx.engine.serde.dumps(edited))
        return _with(decision, edited, operation_digest(ctx.run_id, name, plain, key=key))
    return _with(decision, operation, digest)


def _with(decision: Decision, operation: Any, digest: str) -> Decision:
    return replace(decision, operation=operation, operation_digest=digest)


async def report(decision: Decision, what: str, detail: Any) -> None:
    """Decision.report: append what happened after the decision to the approval's history."""
    if not isinstance(what, str) or not what:
        raise ConfigurationError(f"report() takes a non-empty outcome str, not {what!r}")
    ctx = current_run("report")
    slot = ctx.slot(f"outcome:{decision.step}", "approval-outcome")
    name, recorded = slot.name, slot.recorded
    if recorded is not None and recorded.status is CheckpointStatus.COMPLETED:
        return
    serde, store, clock = ctx.engine.serde, ctx.engine.store, ctx.engine.clock
    shown = redact(json.loads(serde.dumps(detail, what="the outcome's detail")))
    if ctx.pending:
        await ctx.flush()

    async def call() -> object:
        return await store.change_approval(decision.approval_id, outcome(name, what, shown),
                                           clock.now())  # fmt: skip

    await ctx.durable(call, call)  # recorded once by its ref, so calling again is safe
    now = clock.now()
    await ctx.write(slot.checkpoint(CheckpointStatus.COMPLETED, attempts=1, result="null",
                                    started_at=now, finished_at=now))  # fmt: skip

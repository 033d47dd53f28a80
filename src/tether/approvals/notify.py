"""Telling the world about approvals: the Notifier interface (a log notifier built in), and
`on_decision` webhooks signed in the Standard Webhooks format (tether.webhooks), POSTed over the
outbox's HTTP client (pooled, redirects never followed). Both run as durable steps with retries
inside the run.

A notifier or webhook that keeps failing is logged and never fails the run: the decision
stands whether or not anyone was told. Bodies carry ids and the decision, never the context;
logs carry neither the secret nor the body.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tether.approvals.model import Approval, Decision, decision_from
from tether.core.context import current_run, idempotency_key
from tether.core.retry import Retry
from tether.core.step import Step
from tether.errors import ConfigurationError
from tether.outbox.client import Client, check_url, shown
from tether.outbox.delivery import SERVICE, Delivery
from tether.webhooks import check_secret, headers

if TYPE_CHECKING:
    from tether.core.engine import Engine
    from tether.core.execution import RunContext

log = logging.getLogger("tether.approvals")


@runtime_checkable
class Notifier(Protocol):
    """Told when an approval is asked for and when it ends (decided, expired, cancelled).
    Called from a step: it may run again after a crash, so make it idempotent."""

    async def approval_requested(self, approval: Approval) -> None: ...

    async def approval_decided(self, approval: Approval, decision: Decision) -> None: ...


class LogNotifier:
    """Logs approvals on the `tether.approvals` logger (operation and context stay out)."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or log

    async def approval_requested(self, approval: Approval) -> None:
        self.log.info("approval %s asked of %s: %s (run %s, expires %s)", approval.id,
                      ", ".join(approval.reviewers), approval.title, approval.run_id,
                      approval.expires_at.isoformat())  # fmt: skip

    async def approval_decided(self, approval: Approval, decision: Decision) -> None:
        self.log.info("approval %s %s by %s (run %s)", approval.id, decision.status,
                      decision.reviewer or "nobody", approval.run_id)  # fmt: skip


async def _notify_body(engine: Engine, approval_id: str, what: str) -> None:
    record = await engine.store.get_approval(approval_id)
    if record is None or not engine.notifiers:
        return
    shown = Approval.of(record, engine.clock.now())
    for notifier in engine.notifiers:
        if what == "requested":
            await notifier.approval_requested(shown)
        else:
            decision = shown.decision or decision_from(record.id, record.status, None)
            await notifier.approval_decided(shown, decision)


_NOTIFY: Step[..., None] = Step(
    _notify_body, name="tether.notify", retry=Retry(max_attempts=5), timeout=timedelta(minutes=1),
    at_most_once=False, reconcile=None,
)  # fmt: skip


async def notify(ctx: RunContext, approval_id: str, what: str) -> None:
    """Tell the App's notifiers in a checkpointed step. Like `tether.patched`, it replays the
    step where the history holds one and skips where the history holds something else, so
    adding or removing notifiers never breaks the replay of runs in flight; with none, no
    checkpoint is written."""
    at, name = ctx.peek(_NOTIFY.name)
    if at is not None:
        if at.kind != "step" or at.name != name:
            return  # recorded without notifiers
    elif ctx.replaying() or not ctx.engine.notifiers:
        return
    try:
        await _NOTIFY(ctx.engine, approval_id, what)
    except Exception as exc:
        log.warning("notifiers failed for approval %s (%s): %s", approval_id, what, exc)


WEBHOOK_RETRY = Retry(max_attempts=8, initial_delay=timedelta(seconds=1),
                      max_delay=timedelta(minutes=5))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Webhook:
    """POST the decision to `url` in the Standard Webhooks format: headers `webhook-id` (the
    delivery's idempotency key, the same on every retry; also sent as `Idempotency-Key`),
    `webhook-timestamp` and `webhook-signature` (HMAC-SHA256 with `secret`, 16+ characters or
    `whsec_<base64>`); check them with `tether.webhooks.verify` or any Standard Webhooks
    library. A redirect is never followed: it is a failed attempt, retried."""

    url: str
    secret: str = field(repr=False)
    retry: Retry = field(default_factory=lambda: WEBHOOK_RETRY)
    timeout: float = 10.0

    def __post_init__(self) -> None:
        try:
            check_url(self.url)
        except ConfigurationError:
            raise ConfigurationError(
                f"a webhook url starts with https:// or http://: {self.url!r}"
            ) from None
        check_secret(self.secret, "a webhook")
        if not isinstance(self.timeout, int | float) or self.timeout <= 0:
            raise ConfigurationError(f"a webhook timeout is seconds > 0, not {self.timeout!r}")

    def __repr__(self) -> str:
        return f"Webhook({shown(self.url)!r})"


def decision_body(decision: Decision) -> dict[str, Any]:
    return {
        "type": "approval.decided",
        "approval_id": decision.approval_id,
        "run_id": decision.run_id,
        "status": decision.status,
        "option": decision.option,
        "reviewer": decision.reviewer,
        "approvers": list(decision.approvers),
        "decided_at": None if decision.decided_at is None else decision.decided_at.isoformat(),
        "operation_digest": decision.operation_digest,
    }


_RETRYABLE_4XX = frozenset({408, 429})  # the rest of 4xx stops the retries


async def deliver_webhook(hook: Webhook, decision: Decision) -> None:
    body = json.dumps(decision_body(decision), sort_keys=True).encode()
    delivery = current_run("approval").engine.services.get(SERVICE)
    pooled = delivery.webhooks if isinstance(delivery, Delivery) else None

    async def post(hook: Webhook, body: bytes) -> int:
        """One delivery attempt: 2xx is done; 4xx (but 408 and 429) will never succeed."""
        key = idempotency_key()
        signed = headers(hook.secret, key, body, int(time.time()))
        sent = {"Content-Type": "application/json", "Idempotency-Key": key, **signed}
        if pooled is not None:
            return await pooled.post(hook.url, body, sent, timeout=hook.timeout,
                                     retryable_4xx=_RETRYABLE_4XX)  # fmt: skip
        once = Client("tether-webhook")  # no delivery service to pool with: closed at once
        try:
            return await once.post(hook.url, body, sent, timeout=hook.timeout,
                                   retryable_4xx=_RETRYABLE_4XX)  # fmt: skip
        finally:
            await once.aclose()

    step: Step[..., int] = Step(post, name="tether.webhook", retry=hook.retry,
                                timeout=timedelta(seconds=hook.timeout * 2), at_most_once=False,
                                reconcile=None)  # fmt: skip
    try:
        await step(hook, body)
    except Exception as exc:
        log.warning("webhook %s for approval %s failed for good: %s", shown(hook.url),
                    decision.approval_id, exc)  # fmt: skip

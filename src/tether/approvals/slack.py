"""SlackNotifier: approvals posted to a Slack-compatible incoming webhook (Slack, Mattermost,
Rocket.Chat take the same `text`; Slack also draws the `blocks`), with a button to the inbox
page of the approval. Posts go over the outbox's HTTP client (pooled, redirects never followed).
The webhook URL is a secret (its path is the credential): it never appears in a repr, a log
line or an error, and text from the approval is escaped for mrkdwn (&, <, >).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from tether.approvals.message import Sent, Summary, event_key, outcome, public_url_of
from tether.approvals.model import Approval, Decision
from tether.core.context import ambient
from tether.errors import ConfigurationError
from tether.outbox.client import Client, check_url
from tether.outbox.delivery import SERVICE, Delivery

_RETRYABLE_4XX = frozenset({408, 429})  # as approval webhooks: the rest of 4xx is permanent


def mrkdwn(text: str) -> str:
    """`text` safe in Slack's mrkdwn: the three characters Slack asks to escape, so a title
    cannot make a link, a mention (`<!channel>`) or a user reference."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class SlackNotifier:
    """Posts approvals to an incoming webhook (docs/approvals.md, Notifiers). `webhook_url` is
    the secret URL the chat tool gave; `public_url` (default $TETHER_PUBLIC_URL) is where
    reviewers reach the inbox. Each post carries `Idempotency-Key: tether-notify-<key>` with
    the notification's key (message.event_key), the same when a retried step posts it again
    (Slack itself ignores it; a receiver of your own can dedupe on it)."""

    def __init__(self, webhook_url: str, *, public_url: str | None = None,
                 timeout: float = 10.0) -> None:  # fmt: skip
        try:
            check_url(webhook_url)
            host = urlsplit(webhook_url).hostname
        except (ConfigurationError, ValueError):
            host = None
        if not host:
            raise ConfigurationError(
                "SlackNotifier: the webhook URL starts with https:// (http:// for a receiver "
                "on your own network) and names a host"
            )
        self._url = webhook_url
        # What logs and errors call it: the host only; the path is the credential.
        self.called = f"{urlsplit(webhook_url).scheme}://{host}/…"
        self.public_url = public_url_of(public_url, "SlackNotifier")
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigurationError(f"SlackNotifier: timeout is seconds > 0, not {timeout!r}")
        self.timeout = float(timeout)
        self._sent = Sent()

    def __repr__(self) -> str:
        return f"SlackNotifier({self.called!r})"

    # -- the Notifier protocol --------------------------------------------------------------

    async def approval_requested(self, approval: Approval) -> None:
        s = Summary.of(approval, self.public_url)
        title = mrkdwn(s.title)
        lines = [
            f"*Approval requested:* {title}",
            *([mrkdwn(s.description)] if s.description else []),
            f"*Options:* {mrkdwn(', '.join(s.options))}",
            f"*Asked of:* {mrkdwn(', '.join(s.reviewers) or 'nobody named')}",
            f"*Expires:* {s.expires}",
        ]
        # The bare link too: Mattermost and Rocket.Chat draw `text` only, and link a bare URL.
        text = f"Approval requested: {title} (expires {s.expires}). Decide: {s.link}"
        blocks: list[dict[str, Any]] = [
            {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:2900]}},
            {"type": "actions", "elements": [{
                "type": "button", "text": {"type": "plain_text", "text": "Open in the inbox"},
                "url": s.link, "style": "primary", "action_id": "tether-open-approval",
            }]},
        ]  # fmt: skip
        await self._post(approval, "requested", {"text": text, "blocks": blocks})

    async def approval_decided(self, approval: Approval, decision: Decision) -> None:
        s = Summary.of(approval, self.public_url)
        said = mrkdwn(outcome(decision))
        text = f"Decided: {mrkdwn(s.title)} ({said}). {s.link}"
        section = f"*Decided:* {mrkdwn(s.title)}\n{said}\n<{s.link}|Open in the inbox>"
        blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": section[:2900]}}]
        await self._post(approval, "decided", {"text": text, "blocks": blocks})

    # -- sending ----------------------------------------------------------------------------

    async def _post(self, approval: Approval, event: str, payload: dict[str, Any]) -> None:
        key = event_key(approval, event)
        if key in self._sent:
            return  # posted by an earlier attempt of this step, in this process
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": f"tether-notify-{key}"}
        run, _ = ambient()
        delivery = None if run is None else run.engine.services.get(SERVICE)
        pooled = delivery.webhooks if isinstance(delivery, Delivery) else None
        client = pooled or Client("tether-notify")  # no delivery service: closed at once
        try:
            await client.post(self._url, body, headers, timeout=self.timeout,
                              retryable_4xx=_RETRYABLE_4XX, called=self.called)  # fmt: skip
        finally:
            if pooled is None:
                await client.aclose()
        self._sent.add(key)

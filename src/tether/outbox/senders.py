"""Senders: what delivers an outbox message to its destination. The Sender base class (a send,
an optional reconcile hook, a retry policy and a timeout) and the built-in HTTP sender, which
POSTs the payload as JSON over httpx (tether.outbox.client: pooled, redirects never followed)
with the message's key as its Idempotency-Key and webhook-id and, given a secret, a Standard
Webhooks signature (tether.webhooks). Senders send; they never touch the store.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from tether.core.retry import Retry
from tether.errors import ConfigurationError, PermanentError
from tether.outbox.client import Client, HttpError, check_url, shown
from tether.store.port.outbox import OutboxMessage
from tether.webhooks import ID_HEADER, TIMESTAMP_HEADER, check_secret, sign

DEFAULT_TIMEOUT = 30.0  # seconds a send may take before it counts as failed
# HTTP statuses that may succeed later (the rest of 4xx never will: a permanent failure).
_RETRYABLE_4XX = frozenset({408, 409, 425, 429})
# A key travels in headers: visible ASCII, or the send fails at once saying so.
_HEADER_SAFE = frozenset(chr(c) for c in range(0x21, 0x7F))


class Sender:
    """Delivers outbox messages to one kind of destination: subclass it and define `send`.

    `send(message)` returns once the receiver has accepted the message, and raises if it did
    not: the message is sent again per `retry` (the App's policy when None), except after a
    `tether.PermanentError`, which fails it at once. Every send of one message carries the
    same `message.key`: give it to the receiver as its idempotency key, so that a message sent
    twice (a retry after a lost answer, a worker that died mid-send) is applied once.

    `reconcile(message)` is asked, before sending again, about a message whose previous send
    has an unknown outcome (the worker died during it): True if the receiver has it (it is
    marked delivered without sending), False if not, None if unknown (then it is sent again,
    with the same key). `timeout` bounds each send, in seconds.
    """

    retry: Retry | None = None
    timeout: float = DEFAULT_TIMEOUT

    async def send(self, message: OutboxMessage) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define async send(message)")

    async def reconcile(self, message: OutboxMessage) -> bool | None:
        return None


class HttpSender(Sender):
    """POSTs each message's payload as JSON to `url` (or, without one, to the message's
    destination, an http(s):// URL), with the headers `webhook-id` and `Idempotency-Key` (both
    the message's key, the same on every send), `webhook-timestamp`, `Tether-Message-Id` and,
    given a `secret` (16+ characters, or `whsec_<base64>`), `webhook-signature` (Standard
    Webhooks: check it with `tether.webhooks.verify` or any Standard Webhooks library). A 2xx
    answer delivers the message; a redirect (3xx) is never followed and is a failed attempt;
    3xx, 5xx, 408, 409, 425, 429 and network errors are retried (Retry-After is honoured);
    any other status fails it at once. Connections are pooled per sender (`aclose()` ends
    them; the delivery service does when it stops)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        secret: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        retry: Retry | None = None,
    ) -> None:
        if url is not None:
            check_url(url)
        if secret is not None:
            check_secret(secret, "an HttpSender")
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigurationError(f"an HttpSender timeout is seconds > 0, not {timeout!r}")
        if retry is not None and not isinstance(retry, Retry):
            raise ConfigurationError(f"retry= takes a tether.Retry, not {retry!r}")
        self.url = url
        self.secret = secret
        self.headers = dict(headers or {})
        self.timeout = float(timeout)
        self.retry = retry
        self._client = Client("tether-outbox")

    def __repr__(self) -> str:
        return f"HttpSender({None if self.url is None else shown(self.url)!r})"

    async def send(self, message: OutboxMessage) -> None:
        url = self.url or check_url(message.destination)
        if not set(message.key) <= _HEADER_SAFE:
            raise PermanentError(
                f"outbox message {message.id}: its key {message.key!r} cannot travel in an HTTP "
                f"header (visible ASCII only); record it again with such a key"
            )
        body = message.payload_json.encode()
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            **self.headers,
            "Idempotency-Key": message.key,
            "Tether-Message-Id": message.id,
            ID_HEADER: message.key,
            TIMESTAMP_HEADER: str(timestamp),
        }
        if self.secret is not None:
            headers["webhook-signature"] = sign(self.secret, message.key, body, timestamp)
        await self._client.post(
            url, body, headers, timeout=self.timeout, retryable_4xx=_RETRYABLE_4XX
        )

    async def aclose(self) -> None:
        """End this sender's pooled connections (a later send opens new ones)."""
        await self._client.aclose()


__all__ = ["DEFAULT_TIMEOUT", "HttpError", "HttpSender", "Sender", "check_url"]

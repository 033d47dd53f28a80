"""Senders: what delivers an outbox message to its destination. The Sender base class (a send,
an optional reconcile hook, a retry policy and a timeout) and the built-in HTTP sender, which
POSTs the payload as JSON with the message's Idempotency-Key and, given a secret, a
Tether-Signature (tether.webhooks). Senders send; they never touch the store.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

from tether.core.retry import Retry
from tether.errors import ConfigurationError, PermanentError
from tether.store.port.outbox import OutboxMessage
from tether.webhooks import SIGNATURE_HEADER, sign

DEFAULT_TIMEOUT = 30.0  # seconds a send may take before it counts as failed
# HTTP statuses that may succeed later (the rest of 4xx never will: a permanent failure).
_RETRYABLE_4XX = frozenset({408, 409, 425, 429})


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


class HttpError(ConnectionError):
    """The receiver answered with a status that may succeed later (5xx, 408, 409, 425, 429);
    `retry_after` holds its Retry-After, in seconds, when it gave one."""

    def __init__(self, message: str, *, status: int, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class HttpSender(Sender):
    """POSTs each message's payload as JSON to `url` (or, without one, to the message's
    destination, an http(s):// URL), with the headers `Idempotency-Key` (the message's key,
    the same on every send), `Tether-Message-Id` and, given a `secret` (16+ characters),
    `Tether-Signature` (check it with `tether.webhooks.verify`). A 2xx answer delivers the
    message; 5xx, 408, 409, 425, 429 and network errors are retried (Retry-After is honoured);
    any other status fails it at once."""

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
        if secret is not None and (not isinstance(secret, str) or len(secret) < 16):
            raise ConfigurationError("an HttpSender secret is a str of at least 16 characters")
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigurationError(f"an HttpSender timeout is seconds > 0, not {timeout!r}")
        if retry is not None and not isinstance(retry, Retry):
            raise ConfigurationError(f"retry= takes a tether.Retry, not {retry!r}")
        self.url = url
        self.secret = secret
        self.headers = dict(headers or {})
        self.timeout = float(timeout)
        self.retry = retry

    def __repr__(self) -> str:
        return f"HttpSender({self.url!r})"

    async def send(self, message: OutboxMessage) -> None:
        url = self.url or check_url(message.destination)
        body = message.payload_json.encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "tether-outbox",
            **self.headers,
            "Idempotency-Key": message.key,
            "Tether-Message-Id": message.id,
        }
        if self.secret is not None:
            headers[SIGNATURE_HEADER] = sign(self.secret, body, int(time.time()))
        # The scheme was checked to be http(s).
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310
        await asyncio.to_thread(self._post, request, url)

    def _post(self, request: urllib.request.Request, url: str) -> None:
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                response.read()
        except urllib.error.HTTPError as exc:
            status, retry_after = exc.code, _retry_after(exc.headers.get("Retry-After"))
            exc.close()  # it holds the response's socket
            if 400 <= status < 500 and status not in _RETRYABLE_4XX:
                raise PermanentError(
                    f"{url} refused the message with HTTP {status}; it will not accept it as "
                    f"it is (fix the payload or the receiver, then app.retry_outbox(id))"
                ) from None
            raise HttpError(f"{url} answered HTTP {status}", status=status,
                            retry_after=retry_after) from None  # fmt: skip


def check_url(url: str) -> str:
    if not isinstance(url, str) or not url.startswith(("https://", "http://")):
        raise ConfigurationError(f"an HTTP destination starts with https:// or http://: {url!r}")
    return url


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (a number of seconds, or an HTTP date)."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())

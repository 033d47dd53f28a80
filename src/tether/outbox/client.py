"""The HTTP client of deliveries (the outbox's HttpSender, approval webhooks): one pooled httpx
AsyncClient per owner and event loop, explicit connect and read timeouts, and redirects never
followed. It classifies the answer: 2xx accepted; 3xx (a redirect: never followed, never
delivered), 5xx, some 4xx and network errors retried (HttpError, ConnectionError); other 4xx
refused (PermanentError). It sends; it never touches the store, and what it raises or logs
holds no header, no body and no credential of a URL (`shown`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Collection, Mapping
from email.utils import parsedate_to_datetime
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from tether.errors import ConfigurationError, PermanentError

if TYPE_CHECKING:
    import httpx

CONNECT_TIMEOUT = 5.0  # seconds to connect, at most (the rest of the timeout is for the answer)
MAX_ANSWER = 64 * 1024  # bytes of an answer's body read; the rest is dropped with the connection
POOL = 16  # connections kept open per owner
# The URLs of requests sent here, by identity (equal URLs of two sends must not share an entry
# that the first one's collection removes): httpx logs each request's URL at INFO, credentials
# and query included; its records of these URLs are shown without them (_Masked).
_SENT: weakref.WeakValueDictionary[int, httpx.URL] = weakref.WeakValueDictionary()
# What a caller asked its URL to be called instead of `shown(url)` (a Slack webhook's secret is
# its path), by the same identity, for the length of its request only.
_CALLED: dict[int, str] = {}


class _Masked(logging.Filter):
    """Rewrites httpx's "HTTP Request: <method> <url> ..." records of Tether's requests."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 2 and _SENT.get(id(args[1])) is args[1]:
            called = _CALLED.get(id(args[1])) or shown(str(args[1]))
            record.args = (args[0], called, *args[2:])
        return True


_MASK = _Masked()


class HttpError(ConnectionError):
    """The receiver answered with a status that may succeed later (3xx, 5xx, 408, 409, 425, 429
    for the outbox); `retry_after` holds its Retry-After, in seconds, when it gave one."""

    def __init__(self, message: str, *, status: int, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


def check_url(url: str) -> str:
    if not isinstance(url, str) or not url.startswith(("https://", "http://")):
        raise ConfigurationError(f"an HTTP destination starts with https:// or http://: {url!r}")
    return url


def shown(url: str) -> str:
    """`url` fit for logs and errors: without user:password@ and with its query and fragment
    cut (they often carry tokens)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<an unparsable URL>"
    if not parts.scheme or not host:
        return repr(url[:80])[1:-1]
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    query = "?…" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")) + query


class Client:
    """POSTs on one pooled httpx.AsyncClient per event loop (an AsyncClient is bound to the
    loop it connects in); `aclose()` ends the connections, the next post opens new ones."""

    def __init__(self, user_agent: str) -> None:
        self.user_agent = user_agent
        self._http: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _client(self) -> httpx.AsyncClient:
        import httpx  # here: importing tether stays light

        logging.getLogger("httpx").addFilter(_MASK)  # once: a logger keeps one of each filter
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop or self._http.is_closed:
            # A client left on another loop cannot be closed from this one: it is dropped.
            self._http = httpx.AsyncClient(
                follow_redirects=False,
                limits=httpx.Limits(max_connections=POOL, max_keepalive_connections=POOL),
                headers={"User-Agent": self.user_agent},
            )
            self._loop = loop
        return self._http

    async def aclose(self) -> None:
        client, self._http, self._loop = self._http, None, None
        if client is not None:
            try:
                running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not None:
                await client.aclose()

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout: float,
        retryable_4xx: Collection[int],
        called: str | None = None,
    ) -> int:
        """POST `body` to `url`; the status if 2xx, else raises (see the module docstring).
        `called` names the URL in logs and errors instead of `shown(url)`, for a URL whose path
        is the secret."""
        import httpx

        where = called or shown(url)
        limits = httpx.Timeout(timeout, connect=min(CONNECT_TIMEOUT, timeout))
        client = self._client()
        try:
            request = client.build_request(
                "POST", url, content=body, headers=dict(headers), timeout=limits
            )
            _SENT[id(request.url)] = request.url
            if called is not None:
                _CALLED[id(request.url)] = called
            try:
                response = await client.send(request, stream=True)
            finally:
                _CALLED.pop(id(request.url), None)
            try:
                read = 0
                async for chunk in response.aiter_raw():  # drained, so the connection is reused
                    read += len(chunk)
                    if read > MAX_ANSWER:
                        break
                status, answer = response.status_code, response.headers
            finally:
                await response.aclose()
        except httpx.InvalidURL:
            raise PermanentError(f"{where} is not a valid URL; fix the destination") from None
        except httpx.TimeoutException as exc:
            raise ConnectionError(
                f"{where} did not answer within {timeout}s ({type(exc).__name__})"
            ) from None
        except httpx.TransportError as exc:
            raise ConnectionError(f"{where} could not be reached: {type(exc).__name__}") from None
        if 200 <= status < 300:
            return status
        phrase = _phrase(status)
        retry_after = _retry_after(answer.get("Retry-After"))
        if 300 <= status < 400:
            location = answer.get("Location")
            to = f" with Location {shown(location)}" if location else ""
            raise HttpError(
                f"{where} answered {status} {phrase}{to}: redirects are not followed and the "
                f"message is not delivered; point the destination at the final URL",
                status=status,
                retry_after=retry_after,
            )
        if 400 <= status < 500 and status not in retryable_4xx:
            raise PermanentError(
                f"{where} refused the message with HTTP {status} {phrase}; it will not accept it "
                f"as it is (fix the payload or the receiver, then send it again)"
            )
        raise HttpError(
            f"{where} answered HTTP {status} {phrase}", status=status, retry_after=retry_after
        )


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "(a status HTTP does not define)"


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (a number of seconds, or an HTTP date)."""
    if not value:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit() and len(text) <= 9:
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time())

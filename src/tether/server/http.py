"""HTTP hygiene shared by the JSON API and the inbox: strict JSON bodies (duplicate keys and
invalid JSON are 400), a body size limit (413), no NUL character in the URL (422: no id or key
may hold one, and PostgreSQL cannot even look one up), a Host header that names this server
(400 otherwise: a DNS-rebinding name cannot pass for it), and the security headers every
response carries.

Pure ASGI and FastAPI plumbing: no routes, no authentication, no Tether calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine, Iterable
from typing import Any
from urllib.parse import urlsplit

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether.errors import ConfigurationError
from tether.text import hostile, visible

MAX_BODY = 1 << 20  # 1 MiB: decisions, events and forms are small
_NUL = re.compile(rb"\x00|%00")  # in a query string, raw or percent-encoded

SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; "
     b"base-uri 'none'; form-action 'self'; object-src 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
]  # fmt: skip


_DEFAULT_PORTS = {"http": 80, "https": 443}
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def _place(scheme: str, netloc: str) -> str | None:
    """`host:port` of a netloc (lower case, the scheme's default port filled in), or None for
    anything that is not a plain host with an optional port."""
    if not netloc or any(c in netloc for c in "@/\\?# ") or hostile(netloc):
        return None
    try:
        parts = urlsplit(f"//{netloc}")
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:
        return None
    host = parts.hostname
    if not host or port is None:
        return None
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port}"


def origin(url: str) -> str | None:
    """`scheme://host:port` of a URL or an Origin header, normalized, or None."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:  # "http://[::1": a client may send anything
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        return None
    place = _place(scheme, parts.netloc)
    return None if place is None else f"{scheme}://{place}"


class Site:
    """The origins this server answers for: those configured (`tether serve --origin`), else
    the address the request reached, whose loopback names are interchangeable. A request's
    Host must name one of them; a form's Origin must be one of them."""

    def __init__(self, origins: Iterable[str] = ()) -> None:
        found = []
        for given in origins:
            normal = origin(given)
            if normal is None:
                raise ConfigurationError(
                    f"{given!r} is not an origin; give scheme://host[:port], such as "
                    f"https://tether.example.com"
                )
            found.append(normal)
        self.configured = frozenset(found)

    def origins(self, scope: Scope) -> frozenset[str]:
        if self.configured:
            return self.configured
        scheme = str(scope.get("scheme", "http"))
        server = scope.get("server") or ("", None)
        host, port = str(server[0]), server[1] or _DEFAULT_PORTS.get(scheme, 80)
        place = _place(scheme, f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        if place is None:
            return frozenset()
        if place.rsplit(":", 1)[0] in _LOOPBACK:
            return frozenset(f"{scheme}://{name}:{port}" for name in _LOOPBACK)
        return frozenset({f"{scheme}://{place}"})

    def serves(self, scope: Scope) -> bool:
        """Whether the request's Host header names one of this server's origins."""
        hosts = [v for k, v in scope["headers"] if k == b"host"]
        if len(hosts) != 1:
            return False
        given = hosts[0].decode("latin-1")
        place = _place(str(scope.get("scheme", "http")), given)
        if place is None:
            return False
        served = {o.split("://", 1)[1] for o in self.origins(scope)}
        if place in served:
            return True
        # A Host without a port behind a proxy that does not say the scheme (so the default
        # port guessed is http's): the name is what a rebinding attack cannot fake.
        name = place.rsplit(":", 1)[0]
        return ":" not in given.rpartition("]")[2] and any(
            s.rsplit(":", 1)[0] == name for s in served
        )


class BadBody(ValueError):
    """A request body that is not strict JSON."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise BadBody(f"the JSON body repeats the key {key!r}; send each key once")
        seen[key] = value
    return seen


def _constant(name: str) -> None:
    raise BadBody(f"the JSON body holds {name}, which is not JSON; send numbers only")


def strict_loads(body: bytes) -> Any:
    try:
        return json.loads(body, object_pairs_hook=_no_duplicates, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise BadBody(f"the body is not valid JSON: {exc.msg} at char {exc.pos}") from None
    except UnicodeDecodeError:
        raise BadBody("the body is not UTF-8 JSON") from None


class StrictRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = strict_loads(await self.body())
            except BadBody as exc:
                raise HTTPException(400, str(exc)) from None  # FastAPI passes these through
        return self._json


class StrictRoute(APIRoute):
    """Routes whose JSON bodies are parsed strictly; a bad body is a 400 that says why."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictRequest(request.scope, request.receive))

        return strict


class Hygiene:
    """ASGI middleware: refuse a Host that is not this server's (400), a URL holding a NUL
    character (422) and bodies over `max_body` (413) before they are read whole, and add the
    security headers to every response."""

    def __init__(
        self, app: ASGIApp, max_body: int = MAX_BODY, *, hsts: bool = False,
        site: Site | None = None,
    ) -> None:  # fmt: skip
        self.app = app
        self.max_body = max_body
        self.site = site or Site()
        self.headers = list(SECURITY_HEADERS)
        if hsts:
            self.headers.append((b"strict-transport-security", b"max-age=31536000"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self.site.serves(scope):
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            message = (
                f"the Host header {visible(host, newlines=False)!r} does not name this server "
                f"({', '.join(sorted(self.site.origins(scope)))}); if it is this server's public "
                f"name, start it with --origin <scheme://host:port>"
            )
            await _problem(400, message, send, self.headers)
            return
        if "\x00" in scope["path"] or _NUL.search(scope.get("query_string", b"")):
            message = "the URL holds a NUL character, which no id, key or field may contain"
            await _problem(422, message, send, self.headers)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await _too_large(self.max_body, send, self.headers)
            return
        received = 0
        started = False

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    raise _TooLarge(self.max_body)
            return message

        async def secured(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *(h for h in self.headers if h[0] not in names)]  # fmt: skip
            await send(message)

        try:
            await self.app(scope, limited, secured)
        except _TooLarge:
            if not started:
                await _too_large(self.max_body, send, self.headers)


class _TooLarge(HTTPException):
    """A body that grew past the limit while it was read (chunked, or a Content-Length that
    lied). An HTTPException, so FastAPI's body parsing passes it on as this 413 instead of
    turning it into a 400 ("There was an error parsing the body")."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over {limit} bytes")


async def _too_large(limit: int, send: Send, headers: list[tuple[bytes, bytes]]) -> None:
    await _problem(413, f"the request body is over {limit} bytes", send, headers)


async def _problem(
    status: int, detail: str, send: Send, headers: list[tuple[bytes, bytes]]
) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})

"""Sign-in by a login proxy's header (oauth2-proxy style): a request whose direct peer is one of
the configured proxies and carries the user header is that existing Tether user, for this
request only. Off unless configured; the header from any other address is ignored (and logged
once per address). It never creates a user, and never believes X-Forwarded-For by itself.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from tether.errors import ConfigurationError
from tether.server.auth import SignInRefused
from tether.text import visible
from tether.users import User, check_name, get_user

if TYPE_CHECKING:
    from tether.core.engine import Engine

PEER = "tether.peer"  # the scope key DirectPeer records the TCP peer's address under
_TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}")  # an HTTP header name (RFC 9110)
_NOTED = 1000  # addresses whose ignored header was logged, at most (then: no more lines)

log = logging.getLogger("tether.server")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def direct_peer(scope: Scope) -> str:
    """The address of the machine that opened the connection: recorded by DirectPeer before
    uvicorn's proxy handling rewrote the client, else the scope's client (which, if proxy
    headers are on, is the address uvicorn resolved from X-Forwarded-For)."""
    recorded = scope.get(PEER)
    if isinstance(recorded, str):
        return recorded
    client = scope.get("client")
    return str(client[0]) if client else ""


class DirectPeer:
    """ASGI middleware, outermost: records the TCP peer's address before anything (uvicorn's
    ProxyHeadersMiddleware inside it) replaces the client with a forwarded one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            client = scope.get("client")
            scope[PEER] = str(client[0]) if client else ""
        await self.app(scope, receive, send)


@dataclass(frozen=True)
class TrustedHeader:
    """Who a login proxy says the person is. `proxies`: the addresses or networks of the
    proxies (required: no default trusts anyone); `user_header`: the header naming the user;
    `groups_header`: a comma-separated header of groups that replace the user's own (None:
    the user keeps its groups)."""

    proxies: Sequence[str]
    user_header: str = "X-Forwarded-User"
    groups_header: str | None = None
    networks: tuple[Network, ...] = field(init=False, repr=False)
    noted: set[str] = field(init=False, repr=False, compare=False, default_factory=set)

    def __post_init__(self) -> None:
        if isinstance(self.proxies, str) or not self.proxies:
            raise ConfigurationError(
                "a trusted header needs the proxies it is believed from: give their addresses "
                "or networks (proxies=['10.0.0.5'], tether serve --trusted-proxy 10.0.0.5)"
            )
        networks = []
        for given in self.proxies:
            try:
                networks.append(ipaddress.ip_network(given.strip(), strict=False))
            except ValueError:
                raise ConfigurationError(
                    f"{given!r} is not an address or network (10.0.0.5, 10.0.0.0/8, ::1)"
                ) from None
        for name in (self.user_header, self.groups_header):
            if name is not None and not _TOKEN.fullmatch(name):
                raise ConfigurationError(f"{name!r} is not an HTTP header name")
        object.__setattr__(self, "networks", tuple(networks))

    def trusts(self, address: str) -> bool:
        try:
            found = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped:
            found = found.ipv4_mapped
        return any(found in network for network in self.networks)

    async def user(self, request: Request, engine: Engine) -> User | None:
        """The user the proxy names, None without the header (or from an untrusted address);
        SignInRefused when the proxy names no active user, or names one ambiguously."""
        values = request.headers.getlist(self.user_header)
        if not values:
            return None
        peer = direct_peer(request.scope)
        if not self.trusts(peer):
            if peer not in self.noted and len(self.noted) < _NOTED:
                self.noted.add(peer)
                log.warning(
                    "the header %s came from %s, which is no trusted proxy: ignored (logged "
                    "once per address)",
                    self.user_header,
                    visible(peer, newlines=False),
                )
            return None
        name = values[0].strip()
        if len(values) > 1 or not _valid(name):
            log.warning("a trusted proxy's %s header was refused: not one user name",
                        self.user_header)  # fmt: skip
            raise SignInRefused(403, "Not signed in", "The sign-in proxy sent a user "
                                "header this server cannot read as one user name.")  # fmt: skip
        user = await get_user(engine, name)
        if user is None:
            log.warning("a trusted proxy named %r, who is no active Tether user: refused",
                        visible(name, newlines=False))  # fmt: skip
            raise SignInRefused(
                403,
                "Not a reviewer here",
                f"You are signed in as {name!r}, but this Tether server has no such user. "
                f"Ask an admin to add you (tether users add {name} --group ...).",
            )
        if self.groups_header is None:
            return user
        raw = ",".join(request.headers.getlist(self.groups_header))
        groups = frozenset(g.strip() for g in raw.split(",") if _valid(g.strip()))
        return User(user.name, groups, user.created_at, user.revoked_at)


def _valid(name: str) -> bool:
    try:
        check_name(name)
    except ConfigurationError:
        return False
    return True

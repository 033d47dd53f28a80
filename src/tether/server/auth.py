"""Who is asking: bearer tokens for the API, server-side sessions for the inbox (opened by a
token or by OpenID Connect), a trusted login proxy's header, the CSRF token every inbox form
carries, and the throttle on failed sign-ins and bad tokens.

A session cookie holds a random session id (and, when the identity provider gives the groups,
those groups), signed with the server's secret; the database keeps the id's SHA-256 with the
user, and every request checks it there: sign-out ends the session at once, revoking the user
ends all of theirs, and a session ends after IDLE_SECONDS without a request or SESSION_SECONDS
in all. Nothing here decides what a user may see or do; the routes do. Tokens and session ids
are never logged.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import logging
import re
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from fastapi import HTTPException, Request

from tether.actions import Actor, Via
from tether.actions import record as record_action
from tether.app import App
from tether.errors import ConfigurationError
from tether.server.throttle import Throttle
from tether.store.port.users import SessionRecord
from tether.text import visible
from tether.users import User, authenticate, get_user

if TYPE_CHECKING:
    from tether.server.trusted import TrustedHeader

SESSION_COOKIE = "tether_session"
SESSION_SECONDS = 12 * 3600  # the absolute limit of a session
IDLE_SECONDS = 30 * 60  # a session without a request for this long is over
TOUCH_SECONDS = 60.0  # at most one write of a session's last-seen time per this many seconds
MIN_SECRET = 32  # bytes
REALM = 'Bearer realm="tether"'
GENERATE = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{43}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")
_GROUPS = re.compile(r"[A-Za-z0-9_-]{1,3000}")  # the groups part of a cookie, base64url

log = logging.getLogger("tether.server")


def unauthorized(
    message: str = "a bearer token is required: Authorization: Bearer <token>",
) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": REALM})


def session_secret(text: str) -> bytes:
    """The session secret from its setting (TETHER_SESSION_SECRET): hex digits are decoded (the
    old form), anything else is taken as UTF-8 text; at least MIN_SECRET bytes either way."""
    secret = bytes.fromhex(text) if _HEX.fullmatch(text) else text.encode()
    return check_secret(secret)


def check_secret(secret: bytes) -> bytes:
    if len(secret) < MIN_SECRET:
        raise ConfigurationError(
            f"the session secret (TETHER_SESSION_SECRET) has {len(secret)} bytes; it needs at "
            f"least {MIN_SECRET} random ones (64 hex digits, or text): generate one with "
            f"`{GENERATE}`"
        )
    return secret


def client_of(request: Request) -> str:
    """The client's address as the server saw it (behind a trusted proxy: X-Forwarded-For)."""
    return request.client.host if request.client else "unknown"


def actor_of(user: User, request: Request, via: Via) -> Actor:
    """The user of a request, as the trail of actions names them: through what, from where."""
    return Actor(user.name, via, client_of(request))


def too_many(wait: int) -> HTTPException:
    return HTTPException(
        429,
        f"too many failed sign-ins or bad tokens from this address; try again in {wait} s",
        headers={"Retry-After": str(wait)},
    )


class SignInRefused(HTTPException):
    """A sign-in refused with a page that says why (an OIDC callback, a proxy's header naming
    no user): the inbox renders it as its problem page, title and message escaped."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(status, message)
        self.title = title


@dataclass(frozen=True, slots=True)
class Signed:
    """A live inbox session: its user and its id (what the CSRF token is bound to); `via` says
    what opened it: a session cookie, or a trusted proxy's header on this very request."""

    user: User
    id: str
    via: Literal["session", "header"] = "session"


@dataclass(slots=True)
class Auth:
    app: App
    secret: bytes  # signs session cookies and CSRF tokens
    secure: bool  # cookies only over https
    idle: float = IDLE_SECONDS
    lifetime: float = SESSION_SECONDS
    throttle: Throttle = field(default_factory=Throttle)
    trusted: TrustedHeader | None = None  # a login proxy's header (off unless configured)

    @classmethod
    def make(
        cls,
        app: App,
        secret: bytes | None,
        secure: bool,
        *,
        idle: float = IDLE_SECONDS,
        lifetime: float = SESSION_SECONDS,
    ) -> Auth:
        secret = secrets.token_bytes(MIN_SECRET) if secret is None else check_secret(secret)
        if not 0 < idle <= lifetime:
            raise ConfigurationError(
                f"the idle timeout of sessions ({idle} s) must be positive and at most their "
                f"lifetime ({lifetime} s)"
            )
        return cls(app, secret, secure, idle, lifetime)

    def now(self) -> float:
        return self.app.engine.clock.now()

    # -- the throttle ---------------------------------------------------------------------------

    def check_throttle(self, request: Request) -> None:
        """429 (with Retry-After) while this client has too many recent failures."""
        wait = self.throttle.wait(client_of(request))
        if wait:
            raise too_many(wait)

    def failure(self, request: Request, what: str) -> None:
        client = client_of(request)
        log.warning("%s from %s", what, visible(client, newlines=False))
        if self.throttle.failed(client):
            log.warning(
                "%s is refused for %d s: %d failed sign-ins or bad tokens in %d s",
                visible(client, newlines=False),
                self.throttle.wait(client),
                self.throttle.limit,
                self.throttle.window,
            )

    # -- bearer tokens (the API) --------------------------------------------------------------

    async def bearer(self, request: Request) -> User:
        token = _bearer_token(request)
        if token is None:
            raise unauthorized()
        user = await authenticate(self.app.engine, token)
        if user is None:
            # A valid token passes even from a throttled address: one guesser behind a shared
            # address (NAT, a proxy) must not lock everyone else out. 256-bit tokens make the
            # answer to a guess worthless, so only the failures are slowed.
            self.check_throttle(request)
            self.failure(request, "a bearer token was refused (unknown or revoked)")
            challenge = REALM + ', error="invalid_token"'
            raise HTTPException(401, "the token is unknown or revoked",
                                headers={"WWW-Authenticate": challenge})  # fmt: skip
        return user

    # -- sessions (the inbox) -----------------------------------------------------------------

    def _sign(self, payload: bytes) -> str:
        return hmac.new(self.secret, payload, hashlib.sha256).hexdigest()

    async def open_session(self, token: str, request: Request) -> tuple[User, str] | None:
        """The user and a new session's cookie value for a valid token, or None."""
        user = await authenticate(self.app.engine, token)
        if user is None:
            return None
        return user, await self.start_session(user, request, "with a token")

    async def start_session(
        self, user: User, request: Request, how: str, groups: frozenset[str] | None = None
    ) -> str:
        """A new session of `user` (who proved who they are, `how`: kept in the trail of
        actions), as its cookie's value. `groups`, from an identity provider, replace the
        user's own for this session: they travel in the cookie, under its signature, so every
        server process sharing the secret agrees."""
        session_id = secrets.token_urlsafe(32)
        now = self.now()
        record = SessionRecord(_hash(session_id), user.name, now, now, now + self.lifetime,
                               self.idle)  # fmt: skip
        await self.app.engine.store.create_session(record, now)
        await record_action(self.app, actor_of(user, request, "page"), "sign-in", user.name,
                            detail=how)  # fmt: skip
        payload = session_id
        if groups is not None:
            packed = json.dumps(sorted(groups), separators=(",", ":")).encode()
            payload += "." + base64.urlsafe_b64encode(packed).decode().rstrip("=")
        return f"{payload}.{self._sign(b'session:' + payload.encode())}"

    def _session_id(self, request: Request) -> tuple[str, frozenset[str] | None] | None:
        """The session id of the request's cookie, with the groups it carries (None: the
        user's own), if its signature holds."""
        cookie = request.cookies.get(SESSION_COOKIE, "")
        payload, _, signature = cookie.rpartition(".")
        session_id, dot, packed = payload.partition(".")
        if not _SESSION_ID.fullmatch(session_id) or (dot and not _GROUPS.fullmatch(packed)):
            return None
        if not _same(self._sign(b"session:" + payload.encode()), signature):
            return None
        if not dot:
            return session_id, None
        try:
            names = json.loads(base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4)))
        except ValueError:  # signed by us, so only a changed secret's format could get here
            return None
        return session_id, frozenset(str(n) for n in names)

    async def session(self, request: Request, *, touch: bool = True) -> Signed | None:
        """The request's live session, or None. `touch` counts the request as activity (the
        live streams' polls do not: an open page alone does not keep a session alive). A
        trusted login proxy's header, when configured and sent by that proxy, comes first: the
        proxy has just checked the person, a cookie may be older."""
        if self.trusted is not None:
            vouched = await self.trusted.user(request, self.app.engine)
            if vouched is not None:
                return Signed(vouched, "header:" + vouched.name, "header")
        found_id = self._session_id(request)
        if found_id is None:
            return None
        session_id, groups = found_id
        store, now = self.app.engine.store, self.now()
        found = await store.get_session(_hash(session_id), now)
        if found is None:
            return None
        if touch and now - found.seen_at >= min(TOUCH_SECONDS, found.idle / 10):
            found = await store.touch_session(found.id_hash, now)
            if found is None:
                return None
        user = await get_user(self.app.engine, found.user)
        if user is None or found.created_at < user.created_at.timestamp():
            # Revoked; or a session left from before the name was given to a new user (one
            # opened while its user was being revoked), which must not come back to life.
            return None
        if groups is not None:
            user = dataclasses.replace(user, groups=groups)
        return Signed(user, session_id)

    async def end_session(self, request: Request, user: User) -> bool:
        """End the request's session (sign-out by `user`, kept in the trail of actions);
        whether there was one to end."""
        found = self._session_id(request)
        if found is None:
            return False
        ended = await self.app.engine.store.end_session(_hash(found[0]), self.now())
        if ended:
            await record_action(self.app, actor_of(user, request, "page"), "sign-out",
                                user.name)  # fmt: skip
        return ended

    async def still_valid(self, request: Request, via: Literal["bearer", "session"]) -> bool:
        """Whether what opened this request (its bearer token on the API, its session in the
        inbox: never the other, which the request might carry too) still holds: open streams
        ask this as they go, and close when it no longer does."""
        if via == "bearer":
            token = _bearer_token(request)
            return token is not None and await authenticate(self.app.engine, token) is not None
        try:
            return await self.session(request, touch=False) is not None
        except SignInRefused:  # a proxy's header naming a user revoked since
            return False

    def csrf_token(self, session_id: str) -> str:
        return self._sign(b"csrf:" + session_id.encode())

    def check_csrf(self, session_id: str, token: str) -> bool:
        return bool(token) and _same(self.csrf_token(session_id), token)


def _bearer_token(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _hash(session_id: str) -> str:
    """What the database keeps of a session id: 256 random bits, so a plain SHA-256."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def _same(expected: str, given: str) -> bool:
    """Constant-time equality of a signature we made and one a client sent. Compared as bytes:
    hmac.compare_digest raises TypeError on a str with non-ASCII characters, and a client may
    send any (a cookie or a form field of "é" would otherwise be a 500)."""
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogatepass"))

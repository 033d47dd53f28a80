"""Who is asking: bearer tokens for the API, signed session cookies for the inbox, and the CSRF
token every inbox form carries.

A session cookie holds the user's name, the fingerprint of their current token and an expiry,
signed with the server's secret; revoking the user (or issuing a new token) ends every session
at once. Nothing here decides what a user may see or do; the routes do.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from fastapi import HTTPException, Request

from tether.app import App
from tether.users import User, authenticate, fingerprint, get_user

SESSION_COOKIE = "tether_session"
SESSION_SECONDS = 12 * 3600
REALM = 'Bearer realm="tether"'


def unauthorized(
    message: str = "a bearer token is required: Authorization: Bearer <token>",
) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": REALM})


@dataclass(slots=True)
class Auth:
    app: App
    secret: bytes  # signs sessions and CSRF tokens; a new secret ends every session
    secure: bool  # cookies only over https

    @classmethod
    def make(cls, app: App, secret: bytes | None, secure: bool) -> Auth:
        return cls(app, secret or secrets.token_bytes(32), secure)

    # -- bearer tokens (the API) --------------------------------------------------------------

    async def bearer(self, request: Request) -> User:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise unauthorized()
        user = await authenticate(self.app.engine, token.strip())
        if user is None:
            challenge = REALM + ', error="invalid_token"'
            raise HTTPException(401, "the token is unknown or revoked",
                                headers={"WWW-Authenticate": challenge})  # fmt: skip
        return user

    # -- sessions (the inbox) -----------------------------------------------------------------

    def _sign(self, payload: bytes) -> str:
        return hmac.new(self.secret, payload, hashlib.sha256).hexdigest()

    async def open_session(self, token: str) -> tuple[User, str] | None:
        """The user and a session cookie value for a valid token, or None."""
        user = await authenticate(self.app.engine, token)
        if user is None:
            return None
        mark = await fingerprint(self.app.engine, user.name)
        data = json.dumps({"u": user.name, "f": mark, "e": int(time.time()) + SESSION_SECONDS,
                           "n": secrets.token_hex(8)}, separators=(",", ":")).encode()  # fmt: skip
        value = base64.urlsafe_b64encode(data).decode().rstrip("=")
        return user, f"{value}.{self._sign(data)}"

    async def session(self, request: Request) -> tuple[User, str] | None:
        """The signed-in user and their session cookie value, or None."""
        cookie = request.cookies.get(SESSION_COOKIE, "")
        value, _, signature = cookie.partition(".")
        try:
            data = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
            claims = json.loads(data)
        except (ValueError, TypeError):
            return None
        if not _same(self._sign(data), signature) or not isinstance(claims, dict):
            return None
        if not isinstance(claims.get("e"), int) or claims["e"] < time.time():
            return None
        name = claims.get("u")
        if not isinstance(name, str) or claims.get("f") != await fingerprint(self.app.engine, name):
            return None  # revoked, or a new token was issued
        user = await get_user(self.app.engine, name)
        return None if user is None else (user, cookie)

    def csrf_token(self, session: str) -> str:
        return self._sign(b"csrf:" + session.encode())

    def check_csrf(self, session: str, token: str) -> bool:
        return bool(token) and _same(self.csrf_token(session), token)


def _same(expected: str, given: str) -> bool:
    """Constant-time equality of a signature we made and one a client sent. Compared as bytes:
    hmac.compare_digest raises TypeError on a str with non-ASCII characters, and a client may
    send any (a cookie or a form field of "é" would otherwise be a 500)."""
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogatepass"))

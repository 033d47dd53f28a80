"""The users part of the Store port: the server's users (token hashes, groups, revocation), their
inbox sessions (checked on every request, ended by sign-out or revocation) and the operations
on them. It must not import tether.core or any backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class UserRecord:
    name: str
    groups: tuple[str, ...]
    token_hash: str  # sha256 hex of the token; the token itself is never stored
    created_at: float
    revoked_at: float | None = None


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """An inbox session: live while not ended, before `expires_at` and seen within `idle`."""

    id_hash: str  # sha256 hex of the session id; the id itself is only in the cookie
    user: str
    created_at: float
    seen_at: float
    expires_at: float  # the absolute limit
    idle: float  # seconds without a request after which the session is over
    ended_at: float | None = None


class UsersPort(Protocol):
    """The server's users."""

    async def put_user(self, user: UserRecord) -> None:
        """Insert the user, or replace the one with its name (a new token, new groups)."""

    async def get_user(self, name: str) -> UserRecord | None:
        """The user with this name (revoked ones too), or None."""

    async def user_by_token(self, token_hash: str) -> UserRecord | None:
        """The user whose token has this hash (revoked ones too), or None."""

    async def list_users(self) -> list[UserRecord]:
        """Every user, by name."""

    async def revoke_user(self, name: str, now: float) -> UserRecord | None:
        """Mark the user revoked (keeping the first revocation time); None if unknown."""

    async def create_session(self, session: SessionRecord, now: float) -> None:
        """Insert a session, deleting (in the same transaction) every session that is not live
        at `now`: ended, past its absolute expiry or idle for longer than its limit."""

    async def get_session(self, id_hash: str, now: float) -> SessionRecord | None:
        """The session with this id hash if it is live at `now`, else None. Reads only."""

    async def touch_session(self, id_hash: str, now: float) -> SessionRecord | None:
        """Mark a live session seen at `now` and return it; None (writing nothing) if it is not
        live."""

    async def end_session(self, id_hash: str, now: float) -> bool:
        """End the session (sign-out) at `now`; False if it was unknown or already ended."""

    async def end_sessions(self, user: str, now: float) -> int:
        """End every session of the user (revocation) at `now`; how many were live-or-idle and
        not yet ended."""

"""The users part of the Store port: the server's users (token hashes, groups, revocation) and
the operations on them. It must not import tether.core or any backend.
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

"""Users of the server and the inbox: a name, groups, and one bearer token stored only as its
SHA-256. `tether users add NAME --group G` prints the token once; nothing can show it again.

The token's owner is the reviewer who decides: a request never names its reviewer in its body.
Group `admin` may see and act on every run. This module never logs or returns a stored hash.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from tether.approvals.model import Reviewer
from tether.clock import to_datetime
from tether.errors import ConfigurationError, TetherError
from tether.store.port.users import UserRecord

if TYPE_CHECKING:
    from tether.core.engine import Engine

ADMIN = "admin"
TOKEN_PREFIX = "tt_"  # noqa: S105 - a prefix that marks tokens (secret scanners), not a secret
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,99}")


class UserNotFound(TetherError):
    """No user has this name; list them with `tether users list`."""


@dataclass(frozen=True, slots=True)
class User:
    name: str
    groups: frozenset[str]
    created_at: datetime
    revoked_at: datetime | None = None

    @property
    def reviewer(self) -> Reviewer:
        return Reviewer(self.name, self.groups)

    @property
    def is_admin(self) -> bool:
        return ADMIN in self.groups

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    @classmethod
    def of(cls, record: UserRecord) -> User:
        revoked = None if record.revoked_at is None else to_datetime(record.revoked_at)
        return cls(record.name, frozenset(record.groups), to_datetime(record.created_at), revoked)


def hash_token(token: str) -> str:
    """What the database keeps of a token. Tokens carry 256 random bits, so a plain SHA-256
    cannot be reversed by guessing; no slow hash is needed."""
    return hashlib.sha256(token.encode()).hexdigest()


def check_name(name: str, what: str = "a user name") -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"{what} is 1-100 chars of letters, digits, '.', '_', '@' and '-', starting with a "
            f"letter or digit; not {name!r}"
        )
    return name


async def add_user(
    engine: Engine, name: str, groups: frozenset[str] = frozenset()
) -> tuple[User, str]:
    """Create a user (or give a revoked one a new life) and return it with its new token, the
    only time the token exists outside the caller's hands."""
    check_name(name)
    for group in groups:
        check_name(group, "a group name")
    existing = await engine.store.get_user(name)
    if existing is not None and existing.revoked_at is None:
        raise ConfigurationError(
            f"user {name!r} exists; revoke it first (`tether users revoke {name}`) to issue a "
            f"new token"
        )
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    record = UserRecord(name, tuple(sorted(groups)), hash_token(token), engine.clock.now())
    await engine.store.put_user(record)
    return User.of(record), token


async def list_users(engine: Engine) -> list[User]:
    return [User.of(r) for r in await engine.store.list_users()]


async def revoke_user(engine: Engine, name: str) -> User:
    """Revoke the user's token at once and end every inbox session of theirs: every request
    with either is refused from now on (open streams close within a few seconds)."""
    now = engine.clock.now()
    record = await engine.store.revoke_user(name, now)
    if record is None:
        raise UserNotFound(f"no user is named {name!r}; list them with `tether users list`")
    await engine.store.end_sessions(name, now)
    return User.of(record)


async def authenticate(engine: Engine, token: str) -> User | None:
    """The active user holding `token`, or None."""
    if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    digest = hash_token(token)
    record = await engine.store.user_by_token(digest)
    if record is None or record.revoked_at is not None:
        return None
    if not hmac.compare_digest(record.token_hash, digest):
        return None
    return User.of(record)


async def get_user(engine: Engine, name: str) -> User | None:
    """The active user with this name, or None."""
    record = await engine.store.get_user(name)
    return None if record is None or record.revoked_at is not None else User.of(record)

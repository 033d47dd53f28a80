"""Users as the store keeps them: a name, groups, the SHA-256 of their token, and when they were
added and revoked. Plain records; the rules (who may do what) live in tether.users and the
server. This module must not import tether.core or any backend.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class UserRecord:
    name: str
    groups: tuple[str, ...]
    token_hash: str  # sha256 hex of the token; the token itself is never stored
    created_at: float
    revoked_at: float | None = None


USER_COLUMNS = "name, groups, token_hash, created_at, revoked_at"


def user_to_row(user: UserRecord) -> dict[str, Any]:
    return {"name": user.name, "groups": json.dumps(list(user.groups)),
            "token_hash": user.token_hash, "created_at": user.created_at,
            "revoked_at": user.revoked_at}  # fmt: skip


def user_from_row(row: Sequence[Any]) -> UserRecord:
    return UserRecord(row[0], tuple(json.loads(row[1])), row[2], row[3], row[4])

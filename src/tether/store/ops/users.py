"""The operations on the server's users (put, read by name or token hash, list, revoke) and
on their inbox sessions (create, get, touch, end one, end all of a user).

Written once for both SQL dialects; it must not touch a connection or a driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tether.store.port.users import SessionRecord, UserRecord
from tether.store.query import Op, Query, execute, one, select
from tether.store.rows import user_from_row, user_to_row


def put_user(user: UserRecord) -> Op[None]:
    yield Query("put_user", user_to_row(user))


def get_user(name: str) -> Op[UserRecord | None]:
    row = yield from one("get_user", name=name)
    return None if row is None else user_from_row(row)


def user_by_token(token_hash: str) -> Op[UserRecord | None]:
    row = yield from one("user_by_token", token_hash=token_hash)
    return None if row is None else user_from_row(row)


def list_users() -> Op[list[UserRecord]]:
    return [user_from_row(r) for r in (yield from select("list_users"))]


def revoke_user(name: str, now: float) -> Op[UserRecord | None]:
    row = yield from one("revoke_user", name=name, now=now)
    return None if row is None else user_from_row(row)


# -- sessions ---------------------------------------------------------------------------------


def _session(row: Sequence[Any]) -> SessionRecord:
    return SessionRecord(row[0], row[1], row[2], row[3], row[4], row[5], row[6])


def create_session(session: SessionRecord, now: float) -> Op[None]:
    # Retention: sessions that can no longer open anything go as new ones come.
    yield from execute("drop_stale_sessions", now=now)
    yield from execute(
        "insert_session",
        id_hash=session.id_hash,
        user_name=session.user,
        created_at=session.created_at,
        seen_at=session.seen_at,
        expires_at=session.expires_at,
        idle=session.idle,
        ended_at=session.ended_at,
    )


def get_session(id_hash: str, now: float) -> Op[SessionRecord | None]:
    row = yield from one("get_session", id_hash=id_hash, now=now)
    return None if row is None else _session(row)


def touch_session(id_hash: str, now: float) -> Op[SessionRecord | None]:
    row = yield from one("touch_session", id_hash=id_hash, now=now)
    return None if row is None else _session(row)


def end_session(id_hash: str, now: float) -> Op[bool]:
    return (yield from execute("end_session", id_hash=id_hash, now=now)) > 0


def end_sessions(user: str, now: float) -> Op[int]:
    return (yield from execute("end_sessions", user_name=user, now=now))


# SessionRecord too: sql_store's sessions section names it through this module.
__all__ = [
    "SessionRecord",
    "create_session",
    "end_session",
    "end_sessions",
    "get_session",
    "get_user",
    "list_users",
    "put_user",
    "revoke_user",
    "touch_session",
    "user_by_token",
]

"""The operations on the server's users: put, read by name or token hash, list, revoke.

Written once for both SQL dialects; it must not touch a connection or a driver.
"""

from __future__ import annotations

from tether.store.port.users import UserRecord
from tether.store.query import Op, Query, one, select
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

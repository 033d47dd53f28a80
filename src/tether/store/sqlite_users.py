"""The users operations of the SQLite backend, mixed into SqliteStore: one transaction each,
SQL in sql/sqlite/queries.sql. It must not import tether.core.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from tether.store.rows import load_sql
from tether.store.user_rows import UserRecord, user_from_row, user_to_row

if TYPE_CHECKING:
    from tether.store.sqlite_commit import CommitQueue

_Q, _ = load_sql("sqlite")


class SqliteUsers:
    _db: CommitQueue

    async def put_user(self, user: UserRecord) -> None:
        row = user_to_row(user)

        def op(c: sqlite3.Connection) -> None:
            c.execute(_Q["put_user"], row)

        await self._db.submit(op, write=True, label=f"put_user:{user.name}")

    async def get_user(self, name: str) -> UserRecord | None:
        return await self._one(_Q["get_user"], {"name": name})

    async def user_by_token(self, token_hash: str) -> UserRecord | None:
        return await self._one(_Q["user_by_token"], {"token_hash": token_hash})

    async def list_users(self) -> list[UserRecord]:
        def op(c: sqlite3.Connection) -> list[UserRecord]:
            return [user_from_row(r) for r in c.execute(_Q["list_users"])]

        return await self._db.submit(op, write=False)

    async def revoke_user(self, name: str, now: float) -> UserRecord | None:
        def op(c: sqlite3.Connection) -> UserRecord | None:
            row = c.execute(_Q["revoke_user"], {"name": name, "now": now}).fetchone()
            return None if row is None else user_from_row(row)

        return await self._db.submit(op, write=True, label=f"revoke_user:{name}")

    async def _one(self, query: str, args: dict[str, str]) -> UserRecord | None:
        def op(c: sqlite3.Connection) -> UserRecord | None:
            row = c.execute(query, args).fetchone()
            return None if row is None else user_from_row(row)

        return await self._db.submit(op, write=False)

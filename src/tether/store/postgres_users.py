"""The users operations of the PostgreSQL backend, mixed into PostgresStore: one transaction
each, SQL in sql/postgres/queries.sql. It must not import tether.core.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tether.store.rows import load_sql
from tether.store.user_rows import UserRecord, user_from_row, user_to_row

_Q, _ = load_sql("postgres")
T = TypeVar("T")


class PostgresUsers:
    async def _tx(self, fn: Callable[[Any], Awaitable[T]], *, write: bool, label: str = "") -> T:
        raise NotImplementedError  # PostgresStore's

    async def _rows(self, query: str, args: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError  # PostgresStore's

    async def put_user(self, user: UserRecord) -> None:
        row = user_to_row(user)

        async def op(c: Any) -> None:
            await c.execute(_Q["put_user"], row)

        await self._tx(op, write=True, label=f"put_user:{user.name}")

    async def get_user(self, name: str) -> UserRecord | None:
        rows = await self._rows(_Q["get_user"], {"name": name})
        return user_from_row(rows[0]) if rows else None

    async def user_by_token(self, token_hash: str) -> UserRecord | None:
        rows = await self._rows(_Q["user_by_token"], {"token_hash": token_hash})
        return user_from_row(rows[0]) if rows else None

    async def list_users(self) -> list[UserRecord]:
        return [user_from_row(r) for r in await self._rows(_Q["list_users"], {})]

    async def revoke_user(self, name: str, now: float) -> UserRecord | None:
        async def op(c: Any) -> UserRecord | None:
            row = await (await c.execute(_Q["revoke_user"], {"name": name, "now": now})).fetchone()
            return None if row is None else user_from_row(row)

        return await self._tx(op, write=True, label=f"revoke_user:{name}")

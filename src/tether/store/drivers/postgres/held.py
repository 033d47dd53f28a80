"""The connection a PostgreSQL driver keeps for its writes, outside its pool: a write that
finds it free commits on it without a pool's checkout and return (a third of a lone
statement's cost in the client). Opened in the background when first wanted, opened anew
after it broke or outlived the pool's max_lifetime; while it is busy, missing or opening,
writes take pooled connections. It never takes one of the pool's, and knows nothing of runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import psycopg
from psycopg import pq

Conn = psycopg.AsyncConnection[Any]
log = logging.getLogger("tether.store")

RETRY_AFTER = 1.0  # seconds between two attempts to open it, while the server refuses


class Held:
    """One connection, lent to one user at a time: `async with held:` when `held.free`."""

    def __init__(self, connect: Callable[[], Awaitable[Conn]], max_lifetime: float) -> None:
        self._connect = connect
        self._max_lifetime = max_lifetime
        self._conn: Conn | None = None
        self._since = 0.0  # when it was opened (time.monotonic)
        self._busy = False
        self._opening: asyncio.Task[None] | None = None
        self._failed_at = -RETRY_AFTER
        self._closed = False

    @property
    def free(self) -> bool:
        """Whether it can be lent now; when it is missing, opening it starts."""
        if self._conn is None:
            self._open_soon()
            return False
        return not self._busy

    def _open_soon(self) -> None:
        if self._closed or self._opening is not None:
            return
        if time.monotonic() - self._failed_at < RETRY_AFTER:
            return
        self._opening = asyncio.get_running_loop().create_task(self._open())

    async def _open(self) -> None:
        try:
            conn = await self._connect()
        except (psycopg.Error, OSError) as exc:
            self._failed_at = time.monotonic()
            log.debug("the store's held connection could not be opened: %s", exc)
            return
        finally:
            self._opening = None
        if self._closed:
            await conn.close()
            return
        self._conn, self._since = conn, time.monotonic()

    async def __aenter__(self) -> Conn:
        assert self._conn is not None, "lent only when free"
        assert not self._busy, "lent only when free"
        self._busy = True
        return self._conn

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._busy = False
        conn = self._conn
        if conn is None:
            return
        # A connection not idle after its use (a statement still in flight, a transaction
        # left open, a broken socket) is closed: its state is not worth finding out. One that
        # is idle stays, whatever its user met (a lost lease, a deadlock to retry).
        if (
            self._closed
            or conn.closed
            or conn.pgconn.transaction_status != pq.TransactionStatus.IDLE
            or time.monotonic() - self._since > self._max_lifetime
        ):
            self._conn = None
            await conn.close()

    async def close(self) -> None:
        """Close it; one lent now is closed when its user gives it back (a write alone in its
        caller's task, which the driver's drain does not wait for, must not lose its socket
        in the middle of its statement)."""
        self._closed = True
        opening = self._opening
        if opening is not None:
            await asyncio.gather(opening, return_exceptions=True)
        if self._busy:
            return
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

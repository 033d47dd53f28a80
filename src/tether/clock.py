"""The injected source of time: the engine reads time and sleeps only through a Clock.

Apps keep one clock for every worker of a database: the database server's where it has one
(PostgreSQL), read through this process's monotonic clock so that a step of the local wall
clock does not move it. Tests swap in a fake clock (tether.testing) so timers and backoffs
are instant. This module holds no engine logic and imports nothing from Tether.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock time in seconds since the epoch (UTC)."""

    async def sleep(self, seconds: float) -> None:
        """Sleep for this many seconds of this clock's time."""


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class DatabaseClock:
    """The database's clock, read locally: the monotonic clock plus an offset measured against
    the server (`sync`) whenever the worker heartbeats. Leases, claims, timers and
    `tether.now()` of every worker then agree, whatever each machine's wall clock says. Where
    the database has no clock of its own (SQLite, memory), `sync` takes the local wall clock.
    now() is safe to read from any thread."""

    def __init__(self) -> None:
        self._offset = time.time() - time.monotonic()
        self.skew: float | None = None  # how far the local wall clock is ahead of the server's
        # How far now() may be off the server's clock: half the last measurement's round trip
        # (0 where the clock is the local one).
        self.uncertainty = 0.0

    def now(self) -> float:
        return time.monotonic() + self._offset

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sync(self, read: Callable[[], Awaitable[float | None]]) -> None:
        """Measure the offset again with `read` (the server's time, or None for none)."""
        before = time.monotonic()
        server = await read()
        after = time.monotonic()
        if server is None:
            self._offset, self.skew, self.uncertainty = time.time() - after, None, 0.0
            return
        # The reading was taken somewhere in the round trip: its middle is the best guess. A
        # new guess within the measurement's error of the old one is noise: kept as it was,
        # so that now() does not step back and forth.
        offset, error = server - (before + after) / 2, (after - before) / 2
        if abs(offset - self._offset) > error or self.skew is None:
            self._offset = offset
        self.uncertainty = error
        self.skew = time.time() - self.now()


def to_datetime(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)

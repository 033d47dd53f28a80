"""The injected source of time: the engine reads time and sleeps only through a Clock.

Tests swap in a fake clock (tether.testing) so timers and backoffs are instant; this module holds
no engine logic and imports nothing from Tether.
"""

from __future__ import annotations

import asyncio
import time
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


def to_datetime(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)

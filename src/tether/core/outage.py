"""A store write through a database outage: tried again with backoff for a while, and a write
whose acknowledgement was lost resolved by reading it back, never by writing twice. It knows
nothing of what the write is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from tether.errors import StoreUnavailable

if TYPE_CHECKING:
    from tether.core.engine import Engine

log = logging.getLogger("tether.runner")
T = TypeVar("T")

MISSING = object()  # what a read-back returns when the write did not happen


async def retry_store(
    engine: Engine,
    call: Callable[[], Awaitable[T]],
    read_back: Callable[[], Awaitable[object]],
    *,
    failed: StoreUnavailable | None = None,
) -> T:
    """Run a store write; while the database is unreachable, try again with backoff (for up to
    settings.store_outage seconds). A write whose acknowledgement was lost is resolved by
    reading it back, never by writing twice: `read_back` returns the outcome if the write
    happened, MISSING if not. `failed`: the first try was made already, and failed so."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + engine.settings.store_outage
    delay = 0.05
    while True:
        try:
            if failed is not None:
                raise failed
            return await call()
        except StoreUnavailable as exc:
            failed = None
            if loop.time() >= give_up:
                raise
            log.warning("the database is unreachable (%s); retrying in %.2fs", exc, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
        try:
            found = await read_back()
        except StoreUnavailable:
            continue
        if found is not MISSING:
            return found  # type: ignore[return-value]


__all__ = ["MISSING", "retry_store"]

"""Whether anything else would run in this turn of the event loop: a driver commits or waits
on the spot only when nothing would. Reads CPython's private ready queue; a loop without one
counts as busy. It runs nothing.
"""

from __future__ import annotations

import asyncio


def others_ready(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether a callback is ready in `loop` (cancelled ones, which the loop only drops, do not
    count: a wake-up taken back is no work)."""
    ready = getattr(loop, "_ready", None)
    if ready is None:
        return True
    return bool(ready) and not all(handle.cancelled() for handle in ready)


__all__ = ["others_ready"]

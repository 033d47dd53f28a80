"""The store's counts (Store.stats) for pages: the runs explorer's counts by status and the
queues page's depths. On a database of a million runs one count scans an index (about 0.1 s on
SQLite), which no page may pay on every request: once a read takes longer than SLOW, pages get
the last figures (at most MAX_AGE old) while one read refreshes them behind. Small databases
are read fresh every time. The server reads them once as it starts (`warm`), so its first
page does not pay for the first read either. /metrics reads its own, at every scrape.
"""

from __future__ import annotations

import asyncio
import time
import weakref

from tether.app import App
from tether.store.port import StoreStats

SLOW = 0.02  # seconds a read of the counts may take before pages stop waiting for it
MAX_AGE = 5.0  # seconds old the figures a page shows may be, once reads are slow


class RecentCounts:
    """The counts of one App's store, read as the module docstring says."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._stats: StoreStats | None = None
        self._read_at = 0.0  # time.monotonic() of the last read's start
        self._slow = False  # the last read took longer than SLOW
        self._refresh: asyncio.Task[StoreStats] | None = None

    def warm(self) -> None:
        """Start the first read behind (the server's start); pages meanwhile wait for it."""
        if self._stats is None and self._refresh is None:
            self._refresh = asyncio.create_task(self._read())
            self._refresh.add_done_callback(self._refreshed)

    async def get(self) -> StoreStats:
        stats = self._stats
        if stats is None and self._refresh is not None:
            # The first read is under way: wait for it rather than read a second time.
            try:
                stats = await asyncio.shield(self._refresh)
            except Exception:  # the warm read failed: read now, which raises why
                stats = None
        if stats is None or not self._slow:
            return await self._read()
        if time.monotonic() - self._read_at > MAX_AGE and self._refresh is None:
            self._refresh = asyncio.create_task(self._read())
            self._refresh.add_done_callback(self._refreshed)
        return stats

    def _refreshed(self, task: asyncio.Task[StoreStats]) -> None:
        self._refresh = None
        if not task.cancelled():
            task.exception()  # retrieved: a failed refresh keeps the old figures, tried again

    async def _read(self) -> StoreStats:
        started = time.monotonic()
        engine = self.app.engine
        stats = await engine.store.stats(engine.clock.now())
        self._stats, self._read_at = stats, started
        self._slow = time.monotonic() - started > SLOW
        return stats


_COUNTS: weakref.WeakKeyDictionary[App, RecentCounts] = weakref.WeakKeyDictionary()


def recent_counts(app: App) -> RecentCounts:
    """The one RecentCounts of `app`, shared by every page of the process."""
    found = _COUNTS.get(app)
    if found is None:
        found = _COUNTS[app] = RecentCounts(app)
    return found

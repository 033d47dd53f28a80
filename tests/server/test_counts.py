"""The counts pages show (server/counts.py): read fresh while reads are fast; once they are
slow, the last figures at once while one read refreshes them behind, never older than
MAX_AGE before a refresh starts; the server reads them once as it starts (warm), and a page
asked meanwhile waits for that read instead of reading again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tether
from tether.server import counts
from tether.server.counts import RecentCounts, recent_counts
from tether.store.port import RunStatus, StoreStats


async def test_fast_reads_are_fresh_and_slow_ones_are_refreshed_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/c.db")
    await app.open()
    try:
        assert recent_counts(app) is recent_counts(app)  # one per App
        seen = RecentCounts(app)
        assert (await seen.get()).runs[RunStatus.PENDING] == 0
        await app.start("elsewhere", id="r1")  # no worker has it: it stays pending
        assert (await seen.get()).runs[RunStatus.PENDING] == 1  # fast: read again

        monkeypatch.setattr(counts, "SLOW", -1.0)  # every read counts as slow from now on
        assert (await seen.get()).runs[RunStatus.PENDING] == 1  # this read finds it slow
        await app.start("elsewhere", id="r2")
        assert (await seen.get()).runs[RunStatus.PENDING] == 1  # the last figures, at once

        monkeypatch.setattr(counts, "MAX_AGE", 0.0)
        assert (await seen.get()).runs[RunStatus.PENDING] == 1  # still those; a read starts
        async with asyncio.timeout(5):
            while (await seen.get()).runs[RunStatus.PENDING] != 2:
                await asyncio.sleep(0.01)
    finally:
        await app.close()


async def test_the_server_reads_the_counts_as_it_starts_and_a_page_waits_for_that_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/w.db")
    await app.open()
    try:
        await app.start("elsewhere", id="r1")
        reads = 0
        let_go = asyncio.Event()
        real = app.engine.store.stats

        async def slow_stats(now: float) -> StoreStats:
            nonlocal reads
            reads += 1
            await let_go.wait()  # a large database's count
            return await real(now)

        monkeypatch.setattr(app.engine.store, "stats", slow_stats)
        seen = RecentCounts(app)
        seen.warm()
        seen.warm()  # one read, however often it is asked to warm
        page = asyncio.create_task(seen.get())  # a page during the first read waits for it
        await asyncio.sleep(0.05)
        assert not page.done()
        let_go.set()
        assert (await page).runs[RunStatus.PENDING] == 1
        assert reads == 1  # the page took the warm read's figures: no second read
    finally:
        await app.close()

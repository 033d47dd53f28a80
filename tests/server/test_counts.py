"""The counts pages show (server/counts.py): read fresh while reads are fast; once they are
slow, the last figures at once while one read refreshes them behind, never older than
MAX_AGE before a refresh starts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tether
from tether.server import counts
from tether.server.counts import RecentCounts, recent_counts
from tether.store.port import RunStatus


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

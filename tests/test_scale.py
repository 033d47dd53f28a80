"""Waiting runs hold nothing: ten thousand of them in one process cost rows, not coroutines or
threads, and any one of them resumes when its event arrives."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import tether
from tether.store.port import RunStatus

RUNS = 10_000


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


async def test_ten_thousand_waiting_runs_hold_no_coroutines_or_threads(tmp_path: Path) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/waiting.db?synchronous=OFF")

    @app.workflow()
    async def waiter(n: int) -> object:
        return await tether.wait_for_event("go")

    threads_before = threading.active_count()
    started = time.monotonic()
    rss_before = rss_bytes()
    async with app:
        for chunk in range(0, RUNS, 500):
            await asyncio.gather(
                *(app.start(waiter, i, id=f"w{i:05d}") for i in range(chunk, chunk + 500))
            )
        worker = app.engine.worker
        assert worker is not None
        held_at_most = 0
        async with asyncio.timeout(120):
            while True:  # every run reaches its wait, then lets go of its coroutine
                held_at_most = max(held_at_most, app.engine.held_waits)
                if not worker.runners:
                    waiting = await app.engine.store.list_runs(statuses=[RunStatus.WAITING],
                                                               limit=RUNS)  # fmt: skip
                    if len(waiting) == RUNS:
                        break
                await asyncio.sleep(0.05)
        grown = rss_bytes() - rss_before
        settled = time.monotonic() - started
        threads = threading.active_count()
        # Any one of them still resumes, by replay, when its event comes.
        await app.send("w04242", "go", {"ok": True})
        assert await (await app.get("w04242")).result(timeout=30) == {"ok": True}
    print(f"\n{RUNS} waiting runs: RSS +{grown / 2**20:.1f} MiB, threads {threads_before} -> "
          f"{threads}, waits held in memory at most {held_at_most}, all waiting after "
          f"{settled:.1f} s")  # fmt: skip
    assert held_at_most <= app.engine.settings.max_held_waits
    # The store's writer thread, the worker's keepalive thread and its own store's writer, and
    # a few pool threads: a constant, whatever the number of waiting runs.
    assert threads <= threads_before + 5
    assert grown < 100 * 2**20

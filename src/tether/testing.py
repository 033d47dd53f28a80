"""The public test kit: a fake clock that makes timers and timeouts instant, a helper that runs
the worker until nothing is left to do, a store of its own (SQLite on a private temporary
file), and histories exported from a database and replayed against current code (golden
histories in a test suite).

It builds on the App and the engine; it adds no engine behaviour of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import json
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from tether.app import App
from tether.core.replay import ReplayOutcome, replay
from tether.errors import ConfigurationError, NonDeterminismError, RunNotFound
from tether.store.memory import MemoryStore
from tether.store.port import Checkpoint, CheckpointStatus, RunStatus

HISTORY_FORMAT = "tether.history/2"  # /2: positions and argument digests
_FORMATS = ("tether.history/1", HISTORY_FORMAT)  # /1: every checkpoint at position = seq


class FakeClock:
    """A clock that moves only when told: `advance()` fires every sleep that falls due, so
    durable timers, retry delays and timeouts take no real time in tests."""

    def __init__(self, start: float | datetime = 1_800_000_000.0) -> None:
        self._now = start.timestamp() if isinstance(start, datetime) else float(start)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), future))
        await future

    def next_due(self) -> float | None:
        """When the earliest pending sleep ends, if any."""
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)  # cancelled sleeps
        return self._sleepers[0][0] if self._sleepers else None

    def advance(self, by: timedelta | float) -> None:
        """Move time forward and end the sleeps that fall due."""
        seconds = by.total_seconds() if isinstance(by, timedelta) else float(by)
        if seconds < 0:
            raise ConfigurationError("a FakeClock only moves forward")
        self.set(self._now + seconds)

    def set(self, when: float) -> None:
        self._now = max(self._now, when)
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)


def fake_app(url: str = "memory://", *, clock: FakeClock | None = None, **options: Any) -> App:
    """An App for tests on a FakeClock (waits always suspend, so `run_until_idle` can move time
    from one due run to the next)."""
    app = App(url, clock=clock or FakeClock(), **options)
    app.engine.settings = dataclasses.replace(app.engine.settings, inline_wait_max=0.0)
    return app


async def run_until_idle(app: App, *, advance: bool = True, timeout: float = 30.0) -> None:
    """Let the in-process worker (`async with app:`) run until no run can go on. With a
    FakeClock and `advance`, time jumps to the next timer whenever everything waits. Held runs
    (their replay diverged) wait for new code, not for time: no jump is made for them."""
    engine = app.engine
    worker = engine.worker
    if worker is None:
        raise ConfigurationError(
            "run_until_idle needs the worker: call it inside `async with app:`"
        )
    clock = engine.clock
    loop = asyncio.get_running_loop()
    claimed_since: float | None = None
    async with asyncio.timeout(timeout):
        while True:
            while worker.runners:
                await asyncio.sleep(0.001)
            pending = await engine.store.list_runs(statuses=[RunStatus.PENDING], limit=1)
            due, mine = await _next_due(app, worker.id)
            # A run this worker claimed whose runner has not started yet: busy, not idle. One
            # left so for long was given up by the worker: its lease expiry is what is due.
            if mine:
                claimed_since = claimed_since or loop.time()
                if loop.time() - claimed_since < _CLAIM_GRACE:
                    await asyncio.sleep(0.001)
                    continue
            claimed_since = None
            if isinstance(clock, FakeClock):
                soonest = clock.next_due()
                due = soonest if due is None else min(due, soonest or due)
            if pending or (due is not None and due <= clock.now()):
                worker.notify()
            elif due is not None and advance and isinstance(clock, FakeClock):
                clock.set(due)
                worker.notify()
            else:
                return
            await asyncio.sleep(0.005)  # let the worker claim what is due


_CLAIM_GRACE = 0.25  # real seconds a claimed run may take to get its runner


async def _next_due(app: App, worker_id: str) -> tuple[float | None, bool]:
    """When the next run of the app's workflows becomes due (a waiting or pending run's
    wake-up, a running one's lease expiry; held runs left out), and whether a run is running
    under this worker's lease (claimed, its runner about to start: the worker is busy)."""
    names = set(app.engine.workflows)
    statuses = [RunStatus.PENDING, RunStatus.WAITING, RunStatus.RUNNING]
    times, mine = [], False
    for run in await app.engine.store.list_runs(statuses=statuses, limit=10_000):
        if run.workflow not in names:
            continue
        mine = mine or (run.status is RunStatus.RUNNING and run.owner == worker_id)
        at = run.lease_expires_at if run.status is RunStatus.RUNNING else run.wake_at
        if at is not None:
            times.append(at)
    return min(times, default=None), mine


# Times: nothing replay looks at.
_NOT_EXPORTED = ("started_at", "finished_at")


async def export_history(app: App, run_id: str) -> dict[str, Any]:
    """A run's recorded history as a JSON-ready dict (what `check_history` replays)."""
    await app.open()
    record = await app.engine.store.get_run(run_id)
    if record is None:
        raise RunNotFound(f"no run has id {run_id!r}; check the id with `tether runs list`")
    checkpoints = await app.engine.store.load_history(run_id)
    return {
        "format": HISTORY_FORMAT,
        "run_id": record.id,
        "workflow": record.workflow,
        "args": json.loads(record.args),
        "status": record.status.value,
        "checkpoints": [
            {k: v for k, v in asdict(c).items() if k not in _NOT_EXPORTED}
            | {"status": c.status.value, "position": c.at}
            for c in checkpoints
        ],
    }


async def check_history(app: App, history: dict[str, Any]) -> ReplayOutcome:
    """Replay an exported history against the workflows registered on `app`, running nothing."""
    if history.get("format") not in _FORMATS:
        raise ConfigurationError(
            f"not a Tether history (format {history.get('format')!r}, expected "
            f"{HISTORY_FORMAT!r}); export one with tether.testing.export_history"
        )
    checkpoints = [
        Checkpoint(**{**c, "status": CheckpointStatus(c["status"])}) for c in history["checkpoints"]
    ]
    args = json.dumps(history["args"])
    return await replay(app.engine, history["run_id"], history["workflow"], args, checkpoints)


async def assert_replays(app: App, history: dict[str, Any]) -> None:
    """Raise NonDeterminismError if the history no longer replays under the current code."""
    outcome = await check_history(app, history)
    if outcome.error is not None:
        raise outcome.error


__all__ = [
    "HISTORY_FORMAT",
    "FakeClock",
    "fake_app",
    "run_until_idle",
    "MemoryStore",
    "NonDeterminismError",
    "ReplayOutcome",
    "assert_replays",
    "check_history",
    "export_history",
]

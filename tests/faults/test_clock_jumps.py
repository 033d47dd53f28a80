"""Jumps of the wall clock, through the injected clock, with a real App on a SQLite file.

+3 days (tether.testing.FakeClock): every timer that fell due fires exactly once (the step after
it runs once), timers not yet due do not fire, an approval whose expiry passed ends `expired`
and not approved (a late decision is refused), one whose expiry did not pass stays pending.
+2 hours while a step runs: the worker claims its own run again and keeps its one execution;
leases passed again and again under stepping runs leave none stuck.

-1 hour (a clock of this module that also moves back, as a system clock stepped by NTP does):
no timer fires twice and none early, no completed step runs again, and no lease is extended
wrongly. Tether keeps absolute times (wake_at, lease_expires_at) in the clock's own terms, so
after the clock moved back a timer is simply further away, and a heartbeat gives the lease
exactly `lease_duration` from the clock's new reading: never the old, later expiry (an hour
longer than a heartbeat gives), and never one already past (which would let a worker adopt a
run that is still executing).
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.faults import figures
from tests.postgres_server import with_schema

import tether
from tether.store.port import CheckpointStatus, RunStatus
from tether.testing import FakeClock, fake_app, run_until_idle

pytestmark = pytest.mark.timeout(60)

T0 = 1_800_000_000.0
HOUR = 3600.0


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class SteppedClock:
    """A Clock (tether.clock.Clock) that the test sets forward or back. A sleep ends when the
    clock reaches the time it was due at: moving the clock back makes it later, not shorter."""

    def __init__(self, start: float = T0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + max(0.0, seconds), next(self._order), future))
        await future

    def jump(self, by: timedelta) -> None:
        self._now += by.total_seconds()
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)


def fast(app: tether.App) -> tether.App:
    """Waits always release the run; the worker looks for due runs every 20 ms."""
    app.engine.settings = dataclasses.replace(
        app.engine.settings, inline_wait_max=0.0, poll_interval=0.02
    )
    return app


async def until(condition: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.01)


def timer_checkpoints(history: list[Any]) -> list[Any]:
    return [c for c in history if c.kind == "sleep"]


async def test_three_days_forward_fires_each_due_timer_once_and_expires_approvals(
    tmp_path: Path,
) -> None:
    clock = FakeClock(T0)
    app = fast(fake_app(f"sqlite:///{tmp_path / 'tether.db'}", clock=clock))
    woke: Counter[str] = Counter()

    @app.step()
    async def after(run: str, timer: str) -> float:
        woke[f"{run}/{timer}"] += 1
        return clock.now()

    @app.workflow()
    async def sleeper(name: str, first_hours: float) -> list[float]:
        await tether.sleep(timedelta(hours=first_hours))  # due within the jump
        times = [await after(name, "first")]
        await tether.sleep_until(at(T0 + 2 * 24 * HOUR))  # due within the jump
        times.append(await after(name, "second"))
        await tether.sleep_until(at(T0 + 4 * 24 * HOUR))  # due a day after it
        times.append(await after(name, "third"))
        return times

    @app.workflow()
    async def ask(days: float) -> list[object]:
        decision = await tether.approval("Deploy?", reviewers=["alice"],
                                         expires_in=timedelta(days=days))  # fmt: skip
        return [decision.status, decision.approved]

    sleepers = {f"s{h}": h for h in (1, 5, 12, 24, 48)}
    async with app:
        for name, hours in sleepers.items():
            await app.start(sleeper, name, hours, id=name)
        short = await app.start(ask, 1, id="ask-1-day")
        long = await app.start(ask, 5, id="ask-5-days")
        await run_until_idle(app, advance=False)
        assert woke == Counter()
        assert len(await app.list_approvals()) == 2

        clock.advance(timedelta(days=3))
        await run_until_idle(app, advance=False)

        fired = sum(woke.values())
        twice = sum(n - 1 for n in woke.values() if n > 1)
        early = sum(woke[f"{name}/third"] for name in sleepers)
        (expired,) = await app.list_approvals(status=None, run_id=short.id)
        (pending,) = await app.list_approvals(status=None, run_id=long.id)
        figures.record("clock +3 days: timers fired", fired)
        figures.record("clock +3 days: timers fired twice (must be 0)", twice)
        figures.record("clock +3 days: timers fired before they were due (must be 0)", early)
        figures.record("clock +3 days: approvals expired", expired.status == "expired")
        figures.record("clock +3 days: approvals expired early (must be 0)",
                       pending.status != "pending")  # fmt: skip
        for name in sleepers:
            assert woke[f"{name}/first"] == 1
            assert woke[f"{name}/second"] == 1
            assert woke[f"{name}/third"] == 0
        assert await short.result(timeout=10) == ["expired", False]
        assert expired.status == "expired"
        assert pending.status == "pending"
        with pytest.raises(tether.ApprovalRefused):  # too late: expiry is not approval
            await app.decide(expired.id, "approve", reviewer="alice",
                             operation_digest=expired.operation_digest)  # fmt: skip
        assert await short.result(timeout=10) == ["expired", False]

        clock.advance(timedelta(days=1, hours=1))  # past the third timer
        await app.decide(pending.id, "approve", reviewer="alice",
                         operation_digest=pending.operation_digest)  # fmt: skip
        await run_until_idle(app, advance=False)
        assert await long.result(timeout=10) == ["approved", True]
        for name in sleepers:
            handle = await app.get(name)
            times = await handle.result(timeout=10)
            assert times == [T0 + 3 * 24 * HOUR] * 2 + [T0 + 4 * 24 * HOUR + HOUR]
            history = await app.engine.store.load_history(name)
            timers = timer_checkpoints(history)
            assert len(timers) == 3
            assert all(c.status is CheckpointStatus.COMPLETED for c in timers)
    assert woke == Counter({f"{n}/{t}": 1 for n in sleepers for t in ("first", "second", "third")})


async def test_an_hour_back_during_sleeps_fires_nothing_twice_and_nothing_early(
    tmp_path: Path,
) -> None:
    clock = SteppedClock(T0)
    app = fast(tether.App(f"sqlite:///{tmp_path / 'tether.db'}", clock=clock))
    ran: Counter[str] = Counter()

    @app.step()
    async def note(what: str) -> float:
        ran[what] += 1
        return clock.now()

    @app.workflow()
    async def nap() -> float:
        await tether.sleep(timedelta(minutes=30))
        return await note("after the 30-minute sleep")

    @app.workflow()
    async def done_before() -> list[float]:
        await tether.sleep(timedelta(minutes=10))
        first = await note("after the 10-minute sleep")
        await tether.wait_for_event("go")
        return [first, await note("after the event")]

    async def status(run_id: str) -> RunStatus | None:
        run = await app.engine.store.get_run(run_id)
        return None if run is None else run.status

    async with app:
        napping = await app.start(nap, id="nap")
        earlier = await app.start(done_before, id="done-before")
        await run_until_idle(app, advance=False)
        clock.jump(timedelta(minutes=10, seconds=1))  # the 10-minute timer is due
        await run_until_idle(app, advance=False)
        assert ran == Counter({"after the 10-minute sleep": 1})
        (slept, *_) = timer_checkpoints(await app.engine.store.load_history(earlier.id))

        clock.jump(timedelta(hours=-1))  # the system clock is stepped back
        await app.send(earlier.id, "go")  # the run replays its fired timer from its history
        assert await earlier.result(timeout=10) == [T0 + 601, T0 + 601 - HOUR]
        (replayed, *_) = timer_checkpoints(await app.engine.store.load_history(earlier.id))
        assert replayed == slept  # recorded once, not fired again

        # The 30-minute timer is due at T0 + 30 min, in the clock's terms: an hour later now.
        for step in (timedelta(hours=1), timedelta(seconds=1198)):  # to T0 + 601, T0 + 1799
            clock.jump(step)
            await run_until_idle(app, advance=False)
            assert ran["after the 30-minute sleep"] == 0
            assert await status(napping.id) is RunStatus.WAITING
        clock.jump(timedelta(seconds=2))
        assert await napping.result(timeout=10) == T0 + 1801
    figures.record("clock -1 hour: timers fired twice (must be 0)",
                   sum(n - 1 for n in ran.values()))  # fmt: skip
    assert ran == Counter({"after the 10-minute sleep": 1, "after the event": 1,
                           "after the 30-minute sleep": 1})  # fmt: skip


async def test_an_hour_back_during_a_held_lease_neither_extends_nor_shortens_it_wrongly(
    tmp_path: Path,
) -> None:
    """The invariant, after every heartbeat at clock reading n, for every lease it renews:
    n <= lease_expires_at <= n + lease_duration (in fact == n + lease_duration). The upper bound
    is "no lease extended wrongly": after the clock moved back an hour, keeping the previous
    expiry would hold the run for an hour and more without a heartbeat. The lower bound keeps the
    run to its worker: the claim loop, reading the same clock, adopts only leases already past,
    so the step that is running never runs a second time."""
    clock = SteppedClock(T0)
    lease = 0.6  # seconds of the clock; heartbeats come every lease / 3 of real time
    app = fast(tether.App(f"sqlite:///{tmp_path / 'tether.db'}", clock=clock,
                          lease_duration=timedelta(seconds=lease)))  # fmt: skip
    # Heartbeats on the loop, through the store this test watches (not the keepalive thread's
    # own handle): the lease arithmetic is the same on both.
    app.engine.settings = dataclasses.replace(app.engine.settings, keepalive_thread=False)
    entered, release = asyncio.Event(), asyncio.Event()
    bodies: Counter[str] = Counter()
    beats: list[tuple[float, float]] = []  # (clock reading, lease given) of each heartbeat

    @app.step()
    async def hold() -> str:
        bodies["hold"] += 1
        entered.set()
        await release.wait()
        return "held"

    @app.workflow()
    async def holder() -> str:
        return await hold()

    store = app.engine.store
    real_heartbeat = store.heartbeat

    async def heartbeat(worker_id: str, leases: Any, lease_until: float, now: float) -> Any:
        reply = await real_heartbeat(worker_id, leases, lease_until, now)
        if leases:
            beats.append((now, lease_until))
        return reply

    store.heartbeat = heartbeat  # type: ignore[method-assign]

    async def expiry() -> tuple[float, int, str | None]:
        run = await store.get_run("holder")
        assert run is not None
        assert run.lease_expires_at is not None
        return run.lease_expires_at, run.epoch, run.owner

    async with app:
        handle = await app.start(holder, id="holder")
        await asyncio.wait_for(entered.wait(), 10)
        before, epoch, owner = await expiry()
        assert before == T0 + lease

        clock.jump(timedelta(hours=-1))
        jumped = len(beats)

        async def two_heartbeats_since() -> bool:
            return len(beats) >= jumped + 2

        await until(two_heartbeats_since)
        after, epoch_after, owner_after = await expiry()
        now = clock.now()
        wrong = int(not now <= after <= now + lease)
        figures.record("clock -1 hour: leases extended or shortened wrongly (must be 0)", wrong)
        assert after == now + lease, (before, after, now)
        assert after < before  # the old expiry, an hour later, was not kept
        assert all(n <= given <= n + lease for n, given in beats[jumped:])
        assert (epoch_after, owner_after) == (epoch, owner)  # not adopted by anyone

        release.set()
        assert await handle.result(timeout=10) == "held"
        run = await store.get_run("holder")
    assert run is not None
    assert run.epoch == epoch
    figures.record("clock -1 hour: steps run twice (must be 0)", bodies["hold"] - 1)
    assert bodies == Counter({"hold": 1})


async def test_hours_forward_during_a_step_keep_one_execution_of_it(tmp_path: Path) -> None:
    """The clock jumps past the lease while a step runs: the worker's own claim loop sees the
    lease expired and claims the run again. It must go on with the execution it has (under the
    new epoch), not start a second one beside it that would run the step's body again."""
    clock = SteppedClock(T0)
    app = fast(tether.App(f"sqlite:///{tmp_path / 'tether.db'}", clock=clock,
                          lease_duration=timedelta(seconds=30)))  # fmt: skip
    entered, release = asyncio.Event(), asyncio.Event()
    bodies: Counter[str] = Counter()

    @app.step()
    async def hold() -> str:
        bodies["hold"] += 1
        entered.set()
        await release.wait()
        return "held"

    @app.step()
    async def after() -> str:
        bodies["after"] += 1
        return "after"

    @app.workflow()
    async def holder() -> list[str]:
        return [await hold(), await after()]

    store = app.engine.store
    async with app:
        handle = await app.start(holder, id="holder")
        await asyncio.wait_for(entered.wait(), 10)
        first = await store.get_run("holder")
        assert first is not None

        clock.jump(timedelta(hours=2))

        async def claimed_again() -> bool:
            run = await store.get_run("holder")
            return run is not None and run.epoch > first.epoch

        await until(claimed_again)  # the claim loop looks every 20 ms; heartbeats every 10 s
        release.set()
        assert await handle.result(timeout=10) == ["held", "after"]
        run = await store.get_run("holder")
    assert run is not None
    assert run.owner is None
    assert run.status is tether.RunStatus.SUCCEEDED
    figures.record("clock +2 hours mid-step: steps run twice (must be 0)", bodies["hold"] - 1)
    assert bodies == Counter({"hold": 1, "after": 1})


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_leases_expiring_again_and_again_under_stepping_runs_leave_none_stuck(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The clock jumps past the lease over and over while 20 runs step: the worker claims its
    own runs again and again, and a write already on its way under the old epoch is fenced
    off after the worker adopted the new one. That execution stops; the worker, which still
    holds the run, starts a new one at once. No run may be left `running` with nobody
    executing it (until its lease would run out, which this clock never lets happen)."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'tether.db'}"
    else:
        url = with_schema(request.getfixturevalue("postgres_url"), f"t_jumps_{tmp_path.name[-8:]}")
    clock = FakeClock(T0)
    app = tether.App(url, clock=clock, lease_duration=timedelta(seconds=10))
    app.engine.settings = dataclasses.replace(app.engine.settings, poll_interval=0.005)

    @app.step()
    async def tick(i: int) -> int:
        await asyncio.sleep(0.0005)
        return i

    @app.workflow()
    async def stepper(n: int) -> int:
        return sum([await tick(i) for i in range(n)])

    async with app:
        handles = [await app.start(stepper, 40) for _ in range(20)]
        for _ in range(60):
            clock.advance(11)  # past every lease
            await asyncio.sleep(0.003)
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 30)
    assert results == [sum(range(40))] * 20

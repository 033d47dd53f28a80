"""Durable waits: timers, events, wait_any, child runs, versioning, cancellation and deadlines,
on every backend (real time) and on a fake clock (instant timers)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

import tether
from tether.store.memory import MemoryStore
from tether.store.port import RunStatus
from tether.testing import FakeClock, fake_app, run_until_idle

MakeApp = Callable[..., tether.App]
HOUR = timedelta(hours=1)


async def status_of(app: tether.App, run_id: str) -> RunStatus:
    return await (await app.get(run_id)).status()


async def until_status(app: tether.App, run_id: str, status: RunStatus) -> None:
    async with asyncio.timeout(10):
        while await status_of(app, run_id) != status:
            await asyncio.sleep(0.005)


# -- timers -----------------------------------------------------------------------------------


async def test_a_durable_sleep_suspends_the_run_and_fires_once_when_due() -> None:
    clock = FakeClock()
    app = fake_app(clock=clock)
    fired: list[float] = []

    @app.step()
    async def note() -> None:
        fired.append(clock.now())

    @app.workflow()
    async def nap() -> str:
        await tether.sleep(HOUR)
        await note()
        return "awake"

    async with app:
        start = clock.now()
        handle = await app.start(nap, id="nap")
        await until_status(app, "nap", RunStatus.WAITING)
        run = (await app.list_runs())[0]
        assert run.status is RunStatus.WAITING
        await run_until_idle(app)
        assert await handle.result(timeout=5) == "awake"
    assert fired == [start + 3600]
    [started_sleep, done_note] = await handle.checkpoints()
    assert (started_sleep.name, started_sleep.kind) == ("sleep", "sleep")
    assert done_note.name == "note"


async def test_a_restart_during_a_sleep_keeps_the_time_left() -> None:
    clock = FakeClock()
    store = MemoryStore()

    def build() -> tether.App:
        app = fake_app(clock=clock, store=store)

        @app.workflow()
        async def nap() -> float:
            await tether.sleep(HOUR)
            return tether.now().timestamp()

        return app

    first = build()
    start = clock.now()
    async with first:
        await first.start("nap", id="nap")
        await until_status(first, "nap", RunStatus.WAITING)
    clock.advance(timedelta(minutes=40))
    second = build()
    async with second:
        await run_until_idle(second)
        woke = await (await second.get("nap")).result(timeout=5)
    assert woke == start + 3600  # not 40 minutes + a new hour


async def test_sleep_until_an_absolute_time_and_bad_durations_are_refused() -> None:
    clock = FakeClock(datetime(2030, 1, 1, tzinfo=UTC))
    app = fake_app(clock=clock)

    @app.workflow()
    async def alarm() -> str:
        await tether.sleep_until(datetime(2030, 1, 2, 7, tzinfo=UTC))
        return tether.now().isoformat()

    @app.workflow()
    async def bad(kind: str) -> None:
        if kind == "negative":
            await tether.sleep(timedelta(seconds=-1))
        else:
            await tether.sleep_until(datetime(2030, 1, 2))  # naive: refused

    async with app:
        handle = await app.start(alarm)
        await run_until_idle(app)
        assert await handle.result(timeout=5) == "2030-01-02T07:00:00+00:00"
        for kind, message in (("negative", "timedelta >= 0"), ("naive", "timezone-aware")):
            with pytest.raises(tether.RunFailed, match=message):
                await (await app.start(bad, kind)).result(timeout=5)


async def test_waiting_outside_a_workflow_is_refused() -> None:
    with pytest.raises(tether.NotInWorkflow):
        await tether.sleep(HOUR)
    with pytest.raises(tether.NotInWorkflow):
        await tether.wait_for_event("x")


# -- events -----------------------------------------------------------------------------------


async def test_events_are_taken_once_each_in_order_even_when_sent_before_the_wait(
    make_app: MakeApp,
) -> None:
    app = make_app()
    gate = asyncio.Event()

    @app.step()
    async def hold() -> None:
        await gate.wait()

    @app.workflow()
    async def inbox() -> list[object]:
        await hold()
        return [await tether.wait_for_event("msg") for _ in range(3)]

    async with app:
        handle = await app.start(inbox, id="inbox")
        await app.send("inbox", "msg", {"n": 1})  # before the run waits: kept in the mailbox
        await app.send("inbox", "other", "ignored")
        await app.send("inbox", "msg", {"n": 2})
        gate.set()
        await asyncio.sleep(0.05)
        await app.send("inbox", "msg", {"n": 3})
        assert await handle.result(timeout=10) == [{"n": 1}, {"n": 2}, {"n": 3}]
        names = [c.name for c in await handle.checkpoints()]
    assert names == ["hold", "event:msg", "event:msg#2", "event:msg#3"]


async def test_an_event_wakes_a_suspended_run(make_app: MakeApp) -> None:
    app = make_app()  # waits over 50 ms suspend in these tests

    @app.workflow()
    async def approve() -> object:
        return await tether.wait_for_event("decision")

    async with app:
        handle = await app.start(approve, id="susp")
        await until_status(app, "susp", RunStatus.WAITING)
        await app.send("susp", "decision", [1, "yes"])
        assert await handle.result(timeout=10) == [1, "yes"]


async def test_wait_for_event_returns_none_when_its_timeout_passes() -> None:
    app = fake_app()

    @app.workflow()
    async def patient() -> object:
        return await tether.wait_for_event("never", timeout=HOUR)

    async with app:
        handle = await app.start(patient)
        await run_until_idle(app)
        assert await handle.result(timeout=5) is None


async def test_events_for_unknown_or_finished_runs_are_refused_with_the_reason(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow()
    async def quick() -> int:
        return 1

    async with app:
        handle = await app.start(quick, id="done")
        await handle.result(timeout=10)
        with pytest.raises(tether.RunNotFound, match="ghost"):
            await app.send("ghost", "k", 1)
        with pytest.raises(tether.EventRefused, match="has finished"):
            await app.send("done", "k", 1)
        with pytest.raises(tether.ConfigurationError, match="event key"):
            await app.send("done", "tether:child:x", 1)


# -- wait_any ---------------------------------------------------------------------------------


def register_racer(app: tether.App) -> None:
    @app.workflow()
    async def helper(delay_hours: int) -> str:
        await tether.sleep(timedelta(hours=delay_hours))
        return f"child after {delay_hours}h"

    @app.workflow()
    async def race(child_hours: int, timer_hours: int) -> list[object]:
        child = await tether.start_child(helper, child_hours)
        winner = await tether.wait_any(
            {"paid": tether.event("payment"), "reminder": tether.timer(timer_hours * HOUR),
             "child": child},
            timeout=timedelta(hours=10),
        )  # fmt: skip
        return [winner.name, winner.value]


@pytest.mark.parametrize(
    ("send", "child_hours", "timer_hours", "expected"),
    [
        (True, 5, 5, ["paid", {"amount": 3}]),
        (False, 5, 2, ["reminder", None]),
        (False, 1, 5, ["child", "child after 1h"]),
        (False, 20, 20, [None, None]),
    ],
    ids=["event-wins", "timer-wins", "child-wins", "timeout-wins"],
)
async def test_wait_any_tells_which_wait_finished_first(
    send: bool, child_hours: int, timer_hours: int, expected: list[object]
) -> None:
    app = fake_app()
    register_racer(app)
    async with app:
        handle = await app.start("race", child_hours, timer_hours, id="race")
        if send:
            await app.send("race", "payment", {"amount": 3})
        await run_until_idle(app)
        assert await handle.result(timeout=5) == expected


# -- child runs -------------------------------------------------------------------------------


async def test_child_runs_have_deterministic_ids_and_their_results_reach_the_parent(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow()
    async def square(x: int) -> int:
        return x * x

    @app.workflow()
    async def boom() -> None:
        raise ValueError("child broke")

    @app.workflow()
    async def parent() -> list[object]:
        handle = await tether.start_child(square, 3)
        direct = await square(4)  # awaiting a workflow runs it as a child
        try:
            await boom()
        except tether.RunFailed as exc:
            failed = exc.error["type"]
        return [handle.id, await handle, direct, failed]

    async with app:
        result = await (await app.start(parent, id="p")).result(timeout=10)
        runs = {r.id: r for r in await app.list_runs()}
    assert result == ["p/child:square", 9, 16, "ValueError"]
    assert {"p/child:square", "p/child:square#2", "p/child:boom"} <= set(runs)


async def test_cancelling_a_parent_cancels_its_waiting_child() -> None:
    app = fake_app()

    @app.workflow()
    async def slow_child() -> None:
        await tether.sleep(timedelta(days=1))

    @app.workflow()
    async def parent() -> None:
        await slow_child()

    async with app:
        handle = await app.start(parent, id="pc")
        await run_until_idle(app, advance=False)
        assert await status_of(app, "pc/child:slow_child") is RunStatus.WAITING
        await handle.cancel()
        with pytest.raises(tether.RunCancelled):
            await handle.result(timeout=5)
        assert await status_of(app, "pc/child:slow_child") is RunStatus.CANCELLED


# -- versioning, deadlines --------------------------------------------------------------------


async def test_patched_is_false_when_replaying_older_history_and_true_for_new_runs() -> None:
    clock = FakeClock()
    store = MemoryStore()
    old = fake_app(clock=clock, store=store)

    @old.step()
    async def step_a() -> str:
        return "a"

    @old.workflow(name="flow")
    async def flow_v1() -> list[str]:
        first = await step_a()
        await tether.sleep(HOUR)
        return [first]

    async with old:
        await old.start(flow_v1, id="old-run")
        await until_status(old, "old-run", RunStatus.WAITING)

    new = fake_app(clock=clock, store=store)

    @new.step()
    async def step_a_again() -> str:
        return "a"

    step_a_again.name = "step_a"

    @new.step()
    async def step_b() -> str:
        return "b"

    @new.workflow(name="flow")
    async def flow_v2() -> list[str]:
        first = await step_a_again()
        if tether.patched("add-b"):
            return [first, await step_b()]  # the new code no longer sleeps
        await tether.sleep(HOUR)
        return [first]

    async with new:
        fresh = await new.start(flow_v2, id="new-run")
        await run_until_idle(new)
        assert await (await new.get("old-run")).result(timeout=5) == ["a"]
        assert await fresh.result(timeout=5) == ["a", "b"]
        names = [c.name for c in await fresh.checkpoints()]
    assert names == ["step_a", "patch:add-b", "step_b"]


async def test_a_workflow_deadline_fails_a_run_that_is_waiting() -> None:
    app = fake_app()

    @app.workflow(timeout=HOUR)
    async def too_slow() -> None:
        await tether.sleep(timedelta(hours=2))

    async with app:
        handle = await app.start(too_slow)
        await run_until_idle(app)
        with pytest.raises(tether.RunFailed, match="WorkflowTimeout"):
            await handle.result(timeout=5)


async def test_cancelling_a_waiting_run_ends_it_at_once(make_app: MakeApp) -> None:
    app = make_app()

    @app.workflow()
    async def waits() -> object:
        return await tether.wait_for_event("never")

    async with app:
        handle = await app.start(waits, id="w")
        await until_status(app, "w", RunStatus.WAITING)
        await handle.cancel()
        assert await status_of(app, "w") is RunStatus.CANCELLED
        with pytest.raises(tether.RunCancelled):
            await handle.result(timeout=5)

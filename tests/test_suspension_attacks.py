"""Attacks on suspension: when a run with several concurrent tasks waits as a whole, how its
end (Suspend, ReplayNow, a cancel, a timeout) reaches every task, and whether wake-ups are
lost or runs hang. Every wait is bounded by a timeout, so a hang fails the test; after each
test the worker must hold no runner and no wait (engine.held_waits == 0, full capacity).

Tests marked xfail(strict=True) show bugs of the library; the reason names the cause.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

import tether
from tether.store.port import RunRecord, RunStatus

MakeApp = Callable[..., tether.App]
# Two of the suite's modes: PostgreSQL, and forced replay on SQLite (which runs every first
# execution too); the memory store runs the same engine code. The suite is kept within its time.
ATTACK_MODES = [("postgres", False), ("sqlite", True)]


@pytest.fixture(params=ATTACK_MODES, ids=[f"{b}{'-replay' if r else ''}" for b, r in ATTACK_MODES])
def mode(request: pytest.FixtureRequest) -> tuple[str, bool]:
    return request.param  # type: ignore[no-any-return]


MS = timedelta(milliseconds=1)
DONE = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.DEAD,
        RunStatus.HELD)  # fmt: skip


def tune(app: tether.App, **settings: Any) -> tether.App:
    app.engine.settings = dataclasses.replace(app.engine.settings, **settings)
    return app


async def until_status(
    handle: tether.RunHandle[Any], *statuses: RunStatus, timeout: float = 8
) -> RunStatus:
    """The run's status once it is one of `statuses`; fails the test after `timeout`."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while (status := await handle.status()) not in statuses:
        if loop.time() > give_up:
            break
        await asyncio.sleep(0.005)
    else:
        return status
    # pytrace=False: plain failures (some tracebacks through asyncio's timeouts make
    # pytest's report crash on Python 3.11.7, "AST constructor recursion depth mismatch")
    pytest.fail(f"run {handle.id!r} is {status.value}, not {[s.value for s in statuses]} "
                f"after {timeout}s", pytrace=False)  # fmt: skip


async def result_of(handle: tether.RunHandle[Any], timeout: float = 10) -> Any:
    """The run's result (its failure raised); fails the test if it does not end in time."""
    try:
        return await handle.result(timeout=timeout)
    except tether.WaitTimeout:
        pass
    run = await handle._engine.store.get_run(handle.id)
    status = run and run.status.value
    pytest.fail(
        f"run {handle.id!r} did not end within {timeout}s: it is {status} "
        f"(wake_on={run and run.wake_on})",
        pytrace=False,
    )


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 5) -> None:
    """Until `check()` is true; fails the test after `timeout`."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while not await check():
        if loop.time() > give_up:
            pytest.fail(f"not within {timeout}s: {what}", pytrace=False)
        await asyncio.sleep(0.005)


def expect(ok: bool, message: str) -> None:
    """A plain failure (see until_status) when not `ok`."""
    if not ok:
        pytest.fail(message, pytrace=False)


async def _true(value: bool) -> bool:
    return value


async def settled(app: tether.App) -> None:
    """The worker executes nothing and holds no wait any more."""
    worker = app.engine.worker
    assert worker is not None
    loop = asyncio.get_running_loop()
    give_up = loop.time() + 5
    while worker.runners or app.engine.held_waits or app.engine.wake_futures:
        if loop.time() > give_up:
            break
        await asyncio.sleep(0.01)
    assert not worker.runners, f"runners left: {sorted(worker.runners)}"
    assert app.engine.held_waits == 0
    assert not app.engine.wake_futures
    assert worker.capacity() == app.engine.settings.concurrency


# -- a branch blocked on an asyncio.Event that a waiting branch sets ------------------------


@pytest.mark.parametrize("late", [False, True], ids=["in-memory", "after-suspension"])
async def test_a_branch_blocked_on_an_asyncio_event_set_after_another_branchs_wait(
    make_app: MakeApp, late: bool
) -> None:
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def shout(x: str) -> str:
        ran[x] += 1
        return x.upper()

    @app.workflow()
    async def flow() -> list[str]:
        ready = asyncio.Event()
        box: list[str] = []

        async def first() -> str:
            got = await tether.wait_for_event("go")
            box.append(got)
            ready.set()
            return str(got)

        async def second() -> str:
            await ready.wait()
            return await shout(box[0])

        return list(await asyncio.gather(first(), second()))

    async with app:
        handle = await app.start(flow, id="f")
        if late:
            await until_status(handle, RunStatus.WAITING)
        await app.send("f", "go", "x")
        assert await result_of(handle, 10) == ["x", "X"]
        await settled(app)
    assert ran == {"x": 1}


async def test_a_chain_of_asyncio_events_between_branches_each_after_a_durable_wait(
    make_app: MakeApp,
) -> None:
    """Three branches, each blocked on the previous one's asyncio.Event, each then waiting for
    its own event: the run suspends at every stage and each stage wakes the next."""
    app = make_app()

    @app.workflow()
    async def chain() -> list[object]:
        gates = [asyncio.Event() for _ in range(3)]

        async def stage(i: int) -> object:
            if i:
                await gates[i - 1].wait()
            got = await tether.wait_for_event(f"k{i}")
            gates[i].set()
            return got

        return list(await asyncio.gather(*(stage(i) for i in reversed(range(3)))))

    async with app:
        handle = await app.start(chain, id="c")
        for i in range(3):
            await until_status(handle, RunStatus.WAITING)
            run = await app.engine.store.get_run("c")
            assert run is not None
            assert run.wake_on == (f"k{i}",)
            await app.send("c", f"k{i}", i)
            if i < 2:
                await until_status(handle, RunStatus.RUNNING, RunStatus.WAITING)
                await asyncio.sleep(0.15)
        assert await result_of(handle, 10) == [2, 1, 0]
        await settled(app)


# -- user code that catches the end of the execution -------------------------------------------


@pytest.mark.parametrize("how", ["reraise", "swallow", "cleanup-sleep", "cleanup-step"])
async def test_a_branch_that_catches_cancelled_error_while_the_run_suspends(
    make_app: MakeApp, how: str
) -> None:
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def cleanup() -> None:
        ran["cleanup"] += 1

    @app.step()
    async def finish(x: object) -> str:
        ran["finish"] += 1
        return f"done {x}"

    @app.workflow()
    async def flow() -> list[object]:
        ready = asyncio.Event()

        async def waiter() -> object:
            got = await tether.wait_for_event("go")
            ready.set()
            return got

        async def blocked() -> object:
            try:
                await ready.wait()
            except asyncio.CancelledError:
                if how == "swallow":
                    return "swallowed"
                if how == "cleanup-sleep":
                    await asyncio.sleep(0.02)
                if how == "cleanup-step":
                    await cleanup()  # refused: the execution ends
                raise
            return await finish("x")

        return list(await asyncio.gather(waiter(), blocked()))

    async with app:
        handle = await app.start(flow, id="f")
        await until_status(handle, RunStatus.WAITING)
        await app.send("f", "go", 1)
        assert await result_of(handle, 10) == [1, "done x"]
        await settled(app)
    assert ran == {"finish": 1}


@pytest.mark.parametrize("where", ["branch", "root"])
async def test_code_that_catches_base_exception_around_a_wait_does_not_change_the_outcome(
    make_app: MakeApp, where: str
) -> None:
    """Catching BaseException (so Suspend) around a wait is wrong, but the execution's end
    decides what happens to the run: the swallowed value is never the run's result."""
    app = make_app()

    @app.workflow()
    async def flow() -> list[object]:
        async def guarded(key: str) -> object:
            try:
                return await tether.wait_for_event(key)
            except BaseException:
                return "swallowed"

        async def plain(key: str) -> object:
            return await tether.wait_for_event(key)

        if where == "branch":
            return list(await asyncio.gather(guarded("a"), plain("b")))
        try:
            return list(await asyncio.gather(plain("a"), plain("b")))
        except BaseException:
            return ["swallowed"]

    async with app:
        handle = await app.start(flow, id="f")
        await until_status(handle, RunStatus.WAITING)
        await app.send("f", "a", "A")
        await until_status(handle, RunStatus.WAITING)
        await asyncio.sleep(0.15)
        assert await handle.status() is RunStatus.WAITING
        await app.send("f", "b", "B")
        assert await result_of(handle, 10) == ["A", "B"]
        await settled(app)


# -- TaskGroup: a branch that raises while the others are parked -------------------------------


async def test_a_task_group_branch_raising_after_a_suspension_fails_the_run(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow()
    async def flow() -> None:
        async def raiser() -> None:
            await tether.sleep(150 * MS)  # the run suspends first, then wakes for this
            raise ValueError("boom")

        async with asyncio.TaskGroup() as group:
            group.create_task(tether.wait_for_event("a"))
            group.create_task(tether.wait_for_event("b"))
            group.create_task(raiser())

    async with app:
        handle = await app.start(flow, id="tg")
        with pytest.raises(tether.RunFailed) as info:
            await result_of(handle, 10)
        await settled(app)
    assert "boom" in str(info.value.error)


def _no_forced_replay(mode: tuple[str, bool]) -> None:
    if mode[1]:
        pytest.skip("forced replay ends the execution after the step, so its task never ends "
                    "in the execution that ran it")  # fmt: skip


@pytest.mark.parametrize("kind", ["taskgroup", "gather"])
async def test_a_slow_step_failing_while_other_branches_are_parked_fails_the_run(
    make_app: MakeApp, mode: tuple[str, bool], kind: str
) -> None:
    _no_forced_replay(mode)
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step(retry=tether.NO_RETRY)
    async def boom() -> None:
        ran["boom"] += 1
        await asyncio.sleep(0.15)  # past the inline hold of the waits beside it
        raise ValueError("boom")

    async def raiser() -> None:
        await boom()

    @app.workflow()
    async def flow() -> None:
        if kind == "gather":
            await asyncio.gather(tether.wait_for_event("a"), tether.wait_for_event("b"), raiser())
            return
        async with asyncio.TaskGroup() as group:
            group.create_task(tether.wait_for_event("a"))
            group.create_task(tether.wait_for_event("b"))
            group.create_task(raiser())

    async with app:
        handle = await app.start(flow, id="tg")
        try:
            with pytest.raises(tether.RunFailed) as info:
                await result_of(handle, 5)
        finally:
            if await handle.status() is RunStatus.WAITING:
                await handle.cancel()
        await settled(app)
    expect("boom" in str(info.value.error) and ran["boom"] == 1, f"{info.value.error} {ran}")


@pytest.mark.parametrize("kind", [
    "first-completed",
    "await-task",  # the root waits on the task itself: runnable() sees it done
])  # fmt: skip
async def test_a_slow_step_beside_a_background_event_wait_lets_the_root_go_on(
    make_app: MakeApp, mode: tuple[str, bool], kind: str
) -> None:
    """The root starts a background wait (an optional signal), then waits for a slow step in a
    task of its own; once the step is done the root returns without the signal."""
    if kind == "first-completed":
        _no_forced_replay(mode)
    app = make_app()

    @app.step()
    async def work() -> str:
        await asyncio.sleep(0.15)  # past the inline hold of the wait beside it
        return "worked"

    @app.workflow()
    async def flow() -> str:
        signal = asyncio.create_task(tether.wait_for_event("signal"))
        job = asyncio.create_task(work())
        if kind == "first-completed":
            await asyncio.wait({signal, job}, return_when=asyncio.FIRST_COMPLETED)
            result = job.result() if job.done() else "signalled"
        else:
            result = await job
        signal.cancel()
        return result

    async with app:
        handle = await app.start(flow, id="bg")
        try:
            result = await result_of(handle, 5)
        finally:
            if await handle.status() is RunStatus.WAITING:
                await handle.cancel()
        await settled(app)
    expect(result == "worked", f"result {result!r}")


# -- a workflow's timeout while several branches are parked ------------------------------------


@pytest.mark.parametrize("hold", [0.05, 5.0], ids=["suspended", "held-in-memory"])
async def test_a_workflow_timeout_fires_while_several_branches_are_parked(
    make_app: MakeApp, hold: float
) -> None:
    app = tune(make_app(), inline_wait_max=hold)

    @app.workflow(timeout=timedelta(milliseconds=400))
    async def slow() -> list[object]:
        return list(await asyncio.gather(
            tether.wait_for_event("a"),
            tether.wait_for_event("b"),
            tether.sleep(timedelta(hours=1)),
        ))  # fmt: skip

    async with app:
        handle = await app.start(slow, id="slow")
        with pytest.raises(tether.RunFailed, match="WorkflowTimeout"):
            await result_of(handle, 10)
        await settled(app)


async def test_a_workflow_with_a_timeout_keeps_the_documented_task_positions(
    make_app: MakeApp,
) -> None:
    """docs/semantics.md: the root's second task is `1/...`, the steps of a gather of helpers
    are named `add@0`, `add@1`; and replay-check agrees with the runner."""
    app = make_app()

    @app.step()
    async def add(x: int) -> int:
        return x + 1

    async def helper(x: int) -> int:
        return await add(x)

    @app.workflow(timeout=timedelta(minutes=5))
    async def timed() -> list[object]:
        got = list(await asyncio.gather(helper(1), helper(2)))
        return [*got, await tether.wait_for_event("go")]

    async with app:
        handle = await app.start(timed, id="t")
        await until_status(handle, RunStatus.WAITING)
        outcomes = await app.replay_check()
        checkpoints = await handle.checkpoints()
        await app.send("t", "go", 3)
        assert await result_of(handle, 10) == [2, 3, 3]
        await settled(app)
    differences = [o.first_difference for o in outcomes]
    expect(differences == [None], f"replay-check disagrees with the runner: {differences}")
    positions = sorted((c.at, c.name) for c in checkpoints)
    expect(positions == [("0/0", "add@0"), ("1/0", "add@1")], f"positions {positions}")


# -- cancelling a run whose waits are parked ---------------------------------------------------


@pytest.mark.parametrize("hold", [0.05, 5.0], ids=["suspended", "held-in-memory"])
@pytest.mark.parametrize("kind", ["gather", "taskgroup", "wait"])
async def test_cancelling_a_run_while_several_waits_are_parked(
    make_app: MakeApp, hold: float, kind: str
) -> None:
    app = tune(make_app(), inline_wait_max=hold)

    @app.workflow()
    async def flow() -> None:
        waits = [tether.wait_for_event("a"), tether.wait_for_event("b"),
                 tether.sleep(timedelta(hours=1))]  # fmt: skip
        if kind == "gather":
            await asyncio.gather(*waits)
        elif kind == "taskgroup":
            async with asyncio.TaskGroup() as group:
                for w in waits:
                    group.create_task(w)
        else:
            await asyncio.wait([asyncio.ensure_future(w) for w in waits])

    async with app:
        handle = await app.start(flow, id="c")
        if hold > 1:
            await until(lambda: _true(app.engine.held_waits > 0), "a wait is held")
            await asyncio.sleep(0.05)
            assert await handle.status() is RunStatus.RUNNING
        else:
            await until_status(handle, RunStatus.WAITING)
        await handle.cancel()
        with pytest.raises(tether.RunCancelled):
            await result_of(handle, 10)
        await settled(app)


@pytest.mark.parametrize("kind", ["gather", "taskgroup"])  # fmt: skip
async def test_a_cancel_that_comes_while_a_suspension_unwinds_the_tasks(
    make_app: MakeApp, mode: tuple[str, bool], kind: str
) -> None:
    """The run decided to suspend; a branch takes a while to unwind (cleanup after its
    cancellation) and the user cancels the run meanwhile: the run ends cancelled."""
    app = make_app()
    unwinding = asyncio.Event()

    @app.workflow()
    async def flow() -> None:
        never = asyncio.Event()

        async def slow_to_unwind() -> None:
            try:
                await never.wait()
            except asyncio.CancelledError:
                unwinding.set()
                await asyncio.sleep(0.3)
                raise

        if kind == "gather":
            await asyncio.gather(tether.wait_for_event("a"), slow_to_unwind())
        else:
            async with asyncio.TaskGroup() as group:
                group.create_task(tether.wait_for_event("a"))
                group.create_task(slow_to_unwind())

    async with app:
        handle = await app.start(flow, id="c")
        await until(lambda: _true(unwinding.is_set()), "the branch unwinds")
        await handle.cancel()
        with pytest.raises(tether.RunCancelled):
            await result_of(handle, 5)
        await settled(app)


@pytest.mark.parametrize("kind", ["gather", "taskgroup"])
async def test_a_cancel_sent_while_the_run_suspends_is_not_lost(
    make_app: MakeApp, mode: tuple[str, bool], kind: str, request: pytest.FixtureRequest
) -> None:
    """handle.cancel() at the moment the run is suspending (several waits parked): the run
    ends cancelled, whichever of the two transactions commits first."""
    app = make_app()
    store = app.engine.store
    original = store.suspend_run
    cancels: list[asyncio.Future[None]] = []
    current: list[tether.RunHandle[Any]] = []

    async def racing(*args: Any, **kwargs: Any) -> None:
        if current:
            cancels.append(asyncio.ensure_future(current.pop().cancel()))
            await asyncio.sleep(0)
        await original(*args, **kwargs)

    store.suspend_run = racing  # type: ignore[method-assign]

    @app.workflow()
    async def flow() -> None:
        waits = [tether.wait_for_event("a"), tether.wait_for_event("b")]
        if kind == "gather":
            await asyncio.gather(*waits)
            return
        async with asyncio.TaskGroup() as group:
            for w in waits:
                group.create_task(w)

    async with app:
        statuses = []
        for i in range(5):
            handle = await app.start(flow, id=f"c{i}")
            current.append(handle)
            await until_status(handle, RunStatus.WAITING, RunStatus.CANCELLED)
            await asyncio.gather(*cancels)
            cancels.clear()
            try:
                await handle.result(timeout=2)
            except tether.RunCancelled:
                statuses.append(RunStatus.CANCELLED)
            except tether.WaitTimeout:
                statuses.append(await handle.status())
                await handle.cancel()  # end it, so that the app can close
        await settled(app)
    expect(statuses == [RunStatus.CANCELLED] * 5, f"after handle.cancel(): {statuses}")


# -- events arriving while the run suspends ----------------------------------------------------


async def test_events_sent_rapidly_to_many_branches_are_each_taken_once_in_order(
    make_app: MakeApp,
) -> None:
    app = make_app()
    branches, each = 4, 6

    @app.workflow()
    async def many() -> list[list[object]]:
        async def branch(i: int) -> list[object]:
            return [await tether.wait_for_event(f"k{i}") for _ in range(each)]

        return list(await asyncio.gather(*(branch(i) for i in range(branches))))

    async with app:
        handle = await app.start(many, id="m")
        for n in range(each):
            for i in range(branches):
                await app.send("m", f"k{i}", n)
            # now and then let the run suspend between the bursts
            await asyncio.sleep(0.07 if n % 2 else 0.0)
        assert await result_of(handle, 10) == [list(range(each))] * branches
        await settled(app)


async def test_an_event_for_one_branch_sent_as_the_run_suspends_wakes_it(
    make_app: MakeApp,
) -> None:
    """Events sent at the moment the hold runs out (the run decides to suspend, or has just
    decided): none is lost, each wakes the run."""
    app = make_app()
    rounds = 8

    @app.workflow()
    async def flow() -> list[object]:
        async def counter() -> list[object]:
            return [await tether.wait_for_event("tick") for _ in range(rounds)]

        async def idle() -> object:
            return await tether.wait_for_event("never", timeout=timedelta(hours=1))

        got = await asyncio.wait_for(asyncio.gather(counter(), idle()), None)
        return list(got[0])

    async with app:
        handle = await app.start(flow, id="s")
        delay = 0.035
        for n in range(rounds):
            await asyncio.sleep(delay)
            await app.send("s", "tick", n)
            delay = 0.045 + 0.004 * n  # around the 50 ms hold

        # the last one; the other branch never ends, so look at the checkpoints
        async def all_taken() -> bool:
            taken = [c for c in await handle.checkpoints() if c.name.startswith("event:tick")]
            return len(taken) == rounds

        await until(all_taken, "every tick taken", timeout=10)
        await handle.cancel()
        with pytest.raises(tether.RunCancelled):
            await result_of(handle, 10)
        await settled(app)


async def test_noise_events_do_not_keep_a_waiting_run_in_memory_past_the_hold(
    make_app: MakeApp,
) -> None:
    """docs: a wait keeps its run in memory for at most inline_wait_max, then it suspends.
    Events for keys nobody waits on must not extend the hold indefinitely."""
    app = make_app()

    @app.workflow()
    async def flow() -> object:
        return await tether.wait_for_event("real")

    async with app:
        handle = await app.start(flow, id="n")
        await until_status(handle, RunStatus.RUNNING, RunStatus.WAITING)
        statuses = set()
        for i in range(40):  # 40 x 20 ms: eight times the 50 ms hold
            await app.send("n", "noise", i)
            await asyncio.sleep(0.02)
            statuses.add(await handle.status())
        await app.send("n", "real", "r")
        assert await result_of(handle, 10) == "r"
        await settled(app)
    expect(RunStatus.WAITING in statuses, f"never suspended in 0.8 s: {statuses}")


# -- wait_any inside gather, retry delays beside events -----------------------------------------


@pytest.mark.parametrize("winner", ["event", "timer"])
async def test_wait_any_inside_gather(make_app: MakeApp, winner: str) -> None:
    app = make_app()

    @app.workflow()
    async def flow() -> list[object]:
        async def race() -> object:
            won = await tether.wait_any(
                {"e": tether.event("x"), "t": tether.timer(timedelta(milliseconds=300))}
            )
            return [won.name, won.value]

        got = await asyncio.gather(race(), tether.wait_for_event("y"),
                                   tether.wait_any({"z": tether.event("z")}))  # fmt: skip
        return [got[0], got[1], got[2].name]

    async with app:
        handle = await app.start(flow, id="w")
        await until_status(handle, RunStatus.WAITING)
        await app.send("w", "z")
        if winner == "event":
            await app.send("w", "x", "ex")
        await asyncio.sleep(0.4)
        await app.send("w", "y", "why")
        expected = ["e", "ex"] if winner == "event" else ["t", None]
        assert await result_of(handle, 10) == [expected, "why", "z"]
        await settled(app)


async def test_a_retry_delay_past_the_hold_beside_an_event_wait(make_app: MakeApp) -> None:
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step(retry=tether.Retry(max_attempts=3, initial_delay=timedelta(seconds=1),
                                 jitter=0.0))  # fmt: skip
    async def flaky() -> str:
        ran["flaky"] += 1
        if ran["flaky"] < 2:
            raise OSError("again")
        return "ok"

    @app.workflow()
    async def flow() -> list[object]:
        return list(await asyncio.gather(flaky(), tether.wait_for_event("e")))

    async with app:
        handle = await app.start(flow, id="r")
        first: list[RunRecord] = []  # the run as it waits, read before the second attempt

        async def waiting() -> bool:
            run = await app.engine.store.get_run("r")
            if run is None or run.status is not RunStatus.WAITING:
                return False
            if ran["flaky"] == 1:  # counted after the read: the record predates the retry
                first.append(run)
            return True

        await until(waiting, "the run waiting")
        # Read before the second attempt began, it waits for both: the event and the retry's
        # time. (A machine stalled for the retry's whole delay of 1 s reads it only after:
        # then that moment is gone, and the rest of the test still checks the outcome.)
        for run in first:
            assert (run.wake_on, run.wake_at is not None) == (("e",), True)
        # the retry runs while the event wait still waits
        await until(lambda: _true(ran["flaky"] == 2), "the second attempt")
        await until_status(handle, RunStatus.WAITING)
        await app.send("r", "e", 7)
        assert await result_of(handle, 10) == ["ok", 7]
        await settled(app)
    assert ran == {"flaky": 2}


# -- many runs, many waits: the held-waits accounting ------------------------------------------


@pytest.mark.parametrize("crowded", [False, True], ids=["roomy", "max_held_waits=3"])
async def test_many_runs_each_with_many_concurrent_waits(make_app: MakeApp, crowded: bool) -> None:
    app = make_app()
    if crowded:
        tune(app, max_held_waits=3, concurrency=4)
    runs, waits = 12, 8

    @app.workflow()
    async def fan(n: int) -> int:
        got = await asyncio.gather(*(tether.wait_for_event(f"k{i}") for i in range(waits)))
        return sum(got) + n

    async with app:
        handles = [await app.start(fan, r, id=f"run{r}") for r in range(runs)]
        for i in range(waits):
            for r in range(runs):
                await app.send(f"run{r}", f"k{i}", i)
            await asyncio.sleep(0.01 * (i % 3))
        results = [await result_of(h, 10) for h in handles]
        await settled(app)
    assert results == [sum(range(waits)) + r for r in range(runs)]


async def test_news_claimed_while_the_suspending_execution_still_ends_runs_the_run(
    make_app: MakeApp,
) -> None:
    # The run suspends, its event comes at once and this worker claims it again while the
    # execution that suspended has not ended yet. That execution goes on no more: taking the
    # claim over (as for a live one) left the run running here, executed by nobody, until
    # its lease ran out (one run in five of the test above, on PostgreSQL).
    app = make_app()
    store = app.engine.store
    suspend = store.suspend_run
    suspended = 0

    async def suspend_then_news(lease: Any, *args: Any) -> None:
        nonlocal suspended
        await suspend(lease, *args)
        suspended += 1
        if suspended == 1:
            await app.send(lease.run_id, "e", 5)
            await asyncio.sleep(0.3)  # the claim loop takes the run again meanwhile

    store.suspend_run = suspend_then_news  # type: ignore[method-assign]

    @app.workflow()
    async def flow() -> int:
        return int(await tether.wait_for_event("e")) + 1

    async with app:
        handle = await app.start(flow, id="n")
        assert await result_of(handle, 5) == 6
        await settled(app)
    assert suspended >= 1


# -- asyncio.sleep beside a durable wait (forbidden, but common) -------------------------------


async def test_an_asyncio_sleep_beside_a_durable_wait_counts_as_waiting(make_app: MakeApp) -> None:
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def after_nap() -> str:
        ran["after_nap"] += 1
        return "napped"

    @app.workflow()
    async def flow() -> list[object]:
        async def napper() -> str:
            await asyncio.sleep(0.2)  # longer than the hold: the run suspends under it
            return await after_nap()

        return list(await asyncio.gather(napper(), tether.wait_for_event("e")))

    async with app:
        handle = await app.start(flow, id="z")
        await until_status(handle, RunStatus.WAITING)
        await asyncio.sleep(0.3)
        assert ran["after_nap"] == 0  # suspended under it (documented)
        await app.send("z", "e", 1)
        assert await result_of(handle, 10) == ["napped", 1]
        await settled(app)
    assert ran == {"after_nap": 1}


async def test_an_asyncio_sleep_before_a_recorded_step_does_not_hold_the_run_on_replay(
    make_app: MakeApp,
) -> None:
    """One branch naps (asyncio.sleep, shorter than the hold) before a step; another waits for
    an event. When the run replays, the event branch reaches the frontier while the napping
    branch has not asked for its recorded step yet: docs say asyncio.sleep counts as waiting
    and is done again on replay, not that the run is held as diverged."""
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def after_nap() -> str:
        ran["after_nap"] += 1
        return "napped"

    @app.workflow()
    async def flow() -> list[object]:
        async def napper() -> list[object]:
            await asyncio.sleep(0.02)
            first = await after_nap()
            return [first, await tether.wait_for_event("second")]

        return list(await asyncio.gather(napper(), tether.wait_for_event("first")))

    async with app:
        handle = await app.start(flow, id="z")
        await until_status(handle, RunStatus.WAITING)
        assert ran["after_nap"] == 1
        await app.send("z", "first", 1)
        await asyncio.sleep(0.3)
        await app.send("z", "second", 2)
        status = await until_status(handle, *DONE, timeout=10)
        run = await app.engine.store.get_run("z")
        expect(status is RunStatus.SUCCEEDED, f"{status.value}: {run and run.error}")
        expect(await result_of(handle, 1) == [["napped", 2], 1], "result")
        await settled(app)
    assert ran == {"after_nap": 1}


# -- nested parks in child runs -----------------------------------------------------------------


async def test_children_each_with_concurrent_waits_under_a_gathering_parent(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow()
    async def kid(n: int) -> list[object]:
        async def pair() -> list[object]:
            return list(
                await asyncio.gather(
                    tether.wait_for_event("a"), tether.sleep(timedelta(milliseconds=80))
                )
            )

        got = await asyncio.gather(pair(), tether.wait_for_event("b"))
        return [n, got[0][0], got[1]]

    @app.workflow()
    async def parent() -> list[object]:
        children = [await tether.start_child(kid, n) for n in range(3)]
        side = asyncio.ensure_future(tether.wait_for_event("p"))
        results = await asyncio.gather(*(c.result() for c in children))
        return [*results, await side]

    async with app:
        handle = await app.start(parent, id="p")
        await until_status(handle, RunStatus.WAITING)
        kids = sorted(r.id for r in await app.list_runs(workflow="kid"))
        assert len(kids) == 3
        for k in kids:
            await app.send(k, "a", f"{k}-a")
        await asyncio.sleep(0.1)
        for k in kids:
            await app.send(k, "b", "b")
        await app.send("p", "p", "pp")
        result = await result_of(handle, 10)
        await settled(app)
    assert result == [[n, f"{kids[n]}-a", "b"] for n in range(3)] + ["pp"]


async def test_cancelling_a_parent_whose_children_park_several_waits(make_app: MakeApp) -> None:
    app = make_app()

    @app.workflow()
    async def kid() -> None:
        await asyncio.gather(tether.wait_for_event("a"), tether.wait_for_event("b"))

    @app.workflow()
    async def parent() -> None:
        await asyncio.gather(kid(), kid(), tether.wait_for_event("p"))

    async with app:
        handle = await app.start(parent, id="p")
        await until_status(handle, RunStatus.WAITING)

        async def kids_wait() -> bool:
            return len(await app.list_runs(workflow="kid", status=RunStatus.WAITING)) == 2

        await until(kids_wait, "both children wait")
        await handle.cancel()
        with pytest.raises(tether.RunCancelled):
            await result_of(handle, 10)
        for run in await app.list_runs(workflow="kid"):
            with pytest.raises(tether.RunCancelled):
                await result_of(await app.get(run.id), 10)
        await settled(app)


# -- recorded helpers and leftover tasks at the end of an execution -----------------------------


async def test_a_recorded_helper_taken_just_before_the_run_suspends(make_app: MakeApp) -> None:
    """A branch calls tether.uuid4() (queued, written with the next checkpoint) and then blocks
    on an asyncio.Event, while another branch waits for an event: the run suspends with a
    recorded helper still queued."""
    app = make_app()

    @app.workflow()
    async def flow() -> list[object]:
        ready = asyncio.Event()

        async def waiter() -> object:
            got = await tether.wait_for_event("go")
            ready.set()
            return got

        async def helper() -> str:
            await asyncio.sleep(0)  # after the waiter parked
            token = str(tether.uuid4())
            await ready.wait()
            return token[:0] + "ok"

        return list(await asyncio.gather(waiter(), helper()))

    async with app:
        handle = await app.start(flow, id="u")
        await until_status(handle, RunStatus.WAITING, timeout=5)
        await app.send("u", "go", 1)
        expect(await result_of(handle, 5) == [1, "ok"], "result")
        await settled(app)


async def test_a_leftover_task_that_waits_durably_in_its_cleanup_after_the_workflow_returned(
    make_app: MakeApp,
) -> None:
    """The workflow returns while a background task waits; the task is cancelled and its
    `finally` waits for an event. docs: tasks still running when the workflow returns are
    cancelled, and a wait holds its run in memory only a short while: the run must end."""
    app = make_app()

    @app.workflow()
    async def flow() -> str:
        started = asyncio.Event()

        async def background() -> None:
            started.set()
            try:
                await tether.wait_for_event("never")
            finally:
                await tether.wait_for_event("cleanup")

        asyncio.ensure_future(background())  # noqa: RUF006 (left behind on purpose)
        await started.wait()
        await tether.sleep(10 * MS)
        return "returned"

    async with app:
        handle = await app.start(flow, id="b")
        try:
            status = await until_status(handle, *DONE, timeout=3)
        finally:
            if await handle.status() is RunStatus.RUNNING:
                await app.send("b", "cleanup")  # unstick it, so that the app can close
        expect(status is RunStatus.SUCCEEDED, f"status {status.value}")
        expect(await result_of(handle, 5) == "returned", "result")
        await settled(app)


# -- wake-ups that come while a wait looks at its mailbox ---------------------------------------


async def test_an_event_sent_while_the_wait_reads_its_mailbox_wakes_it_at_once(
    make_app: MakeApp,
) -> None:
    app = tune(make_app(), inline_wait_max=3.0)  # a hold long enough to see a late wake-up
    store = app.engine.store
    original = store.take_event
    looked = asyncio.Event()

    async def slow_take_event(*args: Any, **kwargs: Any) -> str | None:
        taken = await original(*args, **kwargs)
        if taken is None and not looked.is_set():
            looked.set()
            await asyncio.sleep(0.05)  # a database round trip: the answer comes back late
        return taken

    store.take_event = slow_take_event  # type: ignore[method-assign]

    @app.workflow()
    async def flow() -> object:
        return await tether.wait_for_event("k")

    async with app:
        handle = await app.start(flow, id="w")
        await until(lambda: _true(looked.is_set()), "the wait looked at its mailbox")
        await app.send("w", "k", "v")  # after the read, before the wait parks
        loop = asyncio.get_running_loop()
        sent = loop.time()
        try:
            result = await result_of(handle, 1.0)
        finally:
            waited = loop.time() - sent
            await result_of(handle, 10)
        await settled(app)
    expect(result == "v" and waited < 1.0, f"{result!r} after {waited:.2f}s")


# -- a queue between a waiting producer and a consumer --------------------------------------------


async def test_a_queue_fed_by_a_waiting_branch_and_drained_by_a_stepping_branch(
    make_app: MakeApp,
) -> None:
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def process(item: int) -> int:
        ran[f"process({item})"] += 1
        return item * 10

    @app.workflow()
    async def flow() -> list[int]:
        queue: asyncio.Queue[int] = asyncio.Queue()

        async def producer() -> None:
            for _ in range(3):
                await queue.put(await tether.wait_for_event("item"))

        async def consumer() -> list[int]:
            return [await process(await queue.get()) for _ in range(3)]

        got = await asyncio.gather(producer(), consumer())
        return list(got[1])

    async with app:
        handle = await app.start(flow, id="q")
        for i in range(3):
            await until_status(handle, RunStatus.WAITING)
            await app.send("q", "item", i)
            await asyncio.sleep(0.1)
        assert await result_of(handle, 10) == [0, 10, 20]
        await settled(app)
    assert len(ran) == 3, ran
    assert all(n == 1 for n in ran.values()), ran


async def test_a_branch_handed_its_step_outcome_then_waiting_on_a_queue_lets_the_run_suspend(
    make_app: MakeApp,
) -> None:
    # The waiting branch's mailbox read ends in the same loop turn as the step's write (two
    # I/Os ending together, as they now and then do on PostgreSQL): the step's outcome waits
    # for its turn while that branch runs; once it parks on its event again, a look hands the
    # outcome over. The stepping branch then waits on a plain asyncio.Queue and nothing else
    # would look again: the run stayed in memory, running, for ever (the test above failed
    # so 1 run in 8).
    app = make_app()
    store = app.engine.store
    write, take = store.write_checkpoint, store.take_event
    stepping = asyncio.Event()
    written = asyncio.Event()

    async def write_then_release(lease: Any, checkpoint: Any, now: float) -> None:
        await write(lease, checkpoint, now)
        if checkpoint.name.startswith("quick") and checkpoint.result is not None:
            written.set()  # the read below ends now too

    async def take_with_the_write(*args: Any) -> Any:
        taken = await take(*args)
        if stepping.is_set() and not written.is_set():
            await written.wait()
        return taken

    store.write_checkpoint = write_then_release  # type: ignore[method-assign]
    store.take_event = take_with_the_write  # type: ignore[method-assign]

    @app.step()
    async def quick() -> int:
        stepping.set()
        app.engine.wake("h")  # the waiting branch reads its mailbox again meanwhile
        await asyncio.sleep(0.05)
        return 1

    @app.workflow()
    async def flow() -> list[int]:
        queue: asyncio.Queue[int] = asyncio.Queue()

        async def feeder() -> None:
            await queue.put(await tether.wait_for_event("item"))

        async def taker() -> list[int]:
            await asyncio.sleep(0.05)  # the feeder parks on its event first
            first = await quick()
            return [first, await queue.get()]

        got = await asyncio.gather(feeder(), taker())
        return list(got[1])

    async with app:
        handle = await app.start(flow, id="h")
        await until_status(handle, RunStatus.WAITING)
        await app.send("h", "item", 2)
        assert await result_of(handle, 10) == [1, 2]
        await settled(app)

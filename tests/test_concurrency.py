"""Concurrency inside a workflow: gather, TaskGroup, create_task and asyncio.wait over steps,
helper coroutines, child runs and waits replay to the same calls however the tasks
interleave, on every backend and in the forced-replay mode (which replays the run from the
store after every checkpoint). Step bodies sleep for varied times so that steps complete in
another order than they were called: positions must not follow completion order.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import pytest

import tether
from tether.store.port import RunStatus

MakeApp = Callable[..., tether.App]

# Sleeps that make later calls finish first.
SLOW = {1: 0.06, 2: 0.0, 10: 0.03, 20: 0.01, 100: 0.0, 200: 0.04}


def _steps(app: tether.App, ran: Counter[str]) -> tuple[tether.Step[[int], int], ...]:
    @app.step()
    async def add(x: int) -> int:
        ran[f"add({x})"] += 1
        await asyncio.sleep(SLOW.get(x, 0.0))
        return x + 1

    @app.step()
    async def double(x: int) -> int:
        ran[f"double({x})"] += 1
        await asyncio.sleep(SLOW.get(x // 2, 0.0))
        return x * 2

    return add, double


async def test_a_gather_of_helpers_gets_each_call_its_own_result(make_app: MakeApp) -> None:
    app = make_app()
    ran: Counter[str] = Counter()
    add, double = _steps(app, ran)

    async def branch(x: int) -> int:
        return await double(await add(x))

    @app.workflow()
    async def fan() -> list[int]:
        return list(await asyncio.gather(branch(1), branch(10), branch(100)))

    async with app:
        result = await (await app.start(fan, id="fan")).result(timeout=20)
        checkpoints = await (await app.get("fan")).checkpoints()
    assert result == [4, 22, 202]
    assert all(n == 1 for n in ran.values()), ran  # each body once, also under forced replay
    assert sorted(c.name for c in checkpoints) == sorted(
        [f"{s}@{i}" for i in range(3) for s in ("add", "double")]
    )
    assert sorted(c.at for c in checkpoints) == sorted(f"{i}/{j}" for i in range(3) for j in (0, 1))


async def test_same_named_helpers_in_tasks_replay_to_their_own_calls(make_app: MakeApp) -> None:
    """The report's case: two branches call the same steps; completion order differs from
    task order on the first execution, and every replay gives each call its own result."""
    app = make_app()
    ran: Counter[str] = Counter()
    add, _ = _steps(app, ran)

    async def branch(x: int) -> int:
        a = await add(x)
        return await add(a * 2)

    @app.workflow()
    async def two() -> list[int]:
        got = await asyncio.gather(branch(1), branch(10))
        await tether.sleep(timedelta(milliseconds=80))  # suspends: replays all of the above
        return list(got)

    async with app:
        assert await (await app.start(two, id="two")).result(timeout=20) == [5, 23]
    assert all(n == 1 for n in ran.values()), ran


async def test_task_groups_create_task_and_asyncio_wait_of_nested_helpers_replay(
    make_app: MakeApp,
) -> None:
    app = make_app()
    ran: Counter[str] = Counter()
    add, double = _steps(app, ran)

    async def inner(x: int) -> int:
        return await add(x)

    async def outer(x: int) -> int:
        # Tasks created inside tasks: the path nests.
        first, second = await asyncio.gather(inner(x), inner(x * 2))
        return await double(first + second)

    @app.workflow()
    async def nested() -> dict[str, object]:
        async with asyncio.TaskGroup() as group:
            a = group.create_task(outer(1))
            b = group.create_task(outer(10))
        c = asyncio.create_task(add(200))
        d = asyncio.ensure_future(double(20))
        done, _ = await asyncio.wait({c, d})
        direct = await asyncio.gather(add(3), double(3))  # step coroutines: slots at call time
        return {"a": a.result(), "b": b.result(), "cd": sorted(t.result() for t in done),
                "direct": list(direct)}  # fmt: skip

    async with app:
        result = await (await app.start(nested, id="nested")).result(timeout=20)
    assert result == {"a": 10, "b": 64, "cd": [40, 201], "direct": [4, 6]}
    assert all(n == 1 for n in ran.values()), ran


async def test_a_gather_of_child_runs_outliving_the_inline_hold_replays(make_app: MakeApp) -> None:
    app = make_app()
    ran: Counter[str] = Counter()
    add, _ = _steps(app, ran)

    @app.workflow()
    async def kid(x: int) -> int:
        await tether.sleep(timedelta(milliseconds=120))  # past the test's 50 ms inline hold
        return await add(x)

    @app.workflow()
    async def parent() -> list[int]:
        return list(await asyncio.gather(kid(1), kid(10), kid(100)))

    async with app:
        assert await (await app.start(parent, id="p")).result(timeout=20) == [2, 11, 101]
        children = sorted(r.id for r in await app.list_runs(workflow="kid"))
    assert children == ["p/child:kid@0", "p/child:kid@1", "p/child:kid@2"]
    assert all(n == 1 for n in ran.values()), ran


async def test_a_gather_of_event_waits_stores_every_wake_key(make_app: MakeApp) -> None:
    app = make_app()

    @app.workflow()
    async def both() -> list[object]:
        return list(await asyncio.gather(tether.wait_for_event("a"), tether.wait_for_event("b")))

    async with app:
        handle = await app.start(both, id="both")
        await _until_status(handle, RunStatus.WAITING)
        run = await app.engine.store.get_run("both")
        assert run is not None
        assert sorted(run.wake_on) == ["a", "b"]  # the union of the waits' keys
        await app.send("both", "b", "bee")  # the second branch's event first
        await asyncio.sleep(0.2)
        assert await handle.status() is not RunStatus.SUCCEEDED
        await app.send("both", "a", "ay")
        assert await handle.result(timeout=10) == ["ay", "bee"]


async def test_an_event_raced_against_a_durable_timer_wakes_by_whichever_comes(
    make_app: MakeApp,
) -> None:
    app = make_app()

    async def timer() -> str:
        await tether.sleep(timedelta(seconds=30))
        return "timer"

    async def event() -> str:
        await tether.wait_for_event("go")
        return "event"

    @app.workflow()
    async def race() -> str:
        a = asyncio.create_task(event())
        b = asyncio.create_task(timer())
        done, pending = await asyncio.wait({a, b}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return next(iter(done)).result()  # type: ignore[no-any-return]

    async with app:
        handle = await app.start(race, id="race")
        await _until_status(handle, RunStatus.WAITING)
        run = await app.engine.store.get_run("race")
        assert run is not None
        assert run.wake_on == ("go",)
        assert run.wake_at is not None  # the timer's deadline too: whichever comes first
        await app.send("race", "go")
        assert await handle.result(timeout=10) == "event"


async def test_a_timer_raced_against_an_event_fires_when_no_event_comes(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow()
    async def race() -> list[object]:
        got = await asyncio.gather(
            tether.wait_for_event("never", timeout=timedelta(milliseconds=150)),
            tether.sleep(timedelta(milliseconds=100)),
        )
        return list(got)

    async with app:
        assert await (await app.start(race, id="t")).result(timeout=10) == [None, None]


async def test_a_wait_in_one_branch_does_not_stop_a_step_in_another(make_app: MakeApp) -> None:
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def slow() -> str:
        ran["slow"] += 1
        await asyncio.sleep(0.3)  # far past the 50 ms inline hold of the wait beside it
        return "slow"

    @app.workflow()
    async def mixed() -> list[object]:
        return list(await asyncio.gather(slow(), tether.wait_for_event("e")))

    async with app:
        handle = await app.start(mixed, id="mixed")
        await _until_status(handle, RunStatus.WAITING)
        assert ran["slow"] == 1
        assert [c.name for c in await handle.checkpoints() if c.kind == "step"] == ["slow"]
        await app.send("mixed", "e", 1)
        assert await handle.result(timeout=10) == ["slow", 1]
    assert ran["slow"] == 1  # it finished before the run suspended, and never ran again


async def test_a_retry_delay_in_one_branch_waits_for_the_other_branchs_step(
    make_app: MakeApp,
) -> None:
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step(retry=tether.Retry(max_attempts=3, initial_delay=timedelta(milliseconds=80),
                                 jitter=0.0))  # fmt: skip
    async def flaky() -> str:
        ran["flaky"] += 1
        if ran["flaky"] < 2:
            raise OSError("try again")
        return "flaky"

    @app.step()
    async def slow() -> str:
        ran["slow"] += 1
        await asyncio.sleep(0.25)
        return "slow"

    @app.workflow()
    async def pair() -> list[str]:
        return list(await asyncio.gather(flaky(), slow()))

    async with app:
        assert await (await app.start(pair, id="pair")).result(timeout=10) == ["flaky", "slow"]
    assert ran == {"flaky": 2, "slow": 1}


async def test_a_step_replayed_with_other_arguments_holds_the_run(make_app: MakeApp) -> None:
    data = {"items": [1, 2, 3]}

    def register(app: tether.App) -> None:
        @app.step()
        async def charge(item: int) -> str:
            return f"charged {item}"

        @app.workflow(name="loop")
        async def loop() -> list[str]:
            out = [await charge(i) for i in data["items"][:1]]
            await tether.wait_for_event("go")
            out += [await charge(i) for i in data["items"][1:]]
            return out

    first = make_app()
    register(first)
    async with first:
        handle = await first.start("loop", id="args")
        await _until_status(handle, RunStatus.WAITING)
    data["items"] = [7, 2, 3]  # the data the workflow read changed between runs
    second = make_app()
    register(second)
    async with second:
        await second.send("args", "go")
        handle = await second.get("args")
        await _until_status(handle, RunStatus.HELD)
        run = await second.engine.store.get_run("args")
        outcomes = await second.replay_check()
    assert run is not None
    error = json.loads(run.error or "{}")
    assert "with other arguments" in error["message"]
    assert '"args":[1]' in error["message"]
    assert '"args":[7]' in error["message"]
    assert [o.run_id for o in outcomes if not o.ok] == ["args"]


async def _until_status(handle: tether.RunHandle[object], status: RunStatus) -> None:
    async with asyncio.timeout(15):
        while (await handle.status()) is not status:
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("kind", ["gather", "taskgroup"])
async def test_an_unhandled_failure_in_one_branch_fails_the_run_once(
    make_app: MakeApp, kind: str
) -> None:
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step(retry=tether.NO_RETRY)
    async def boom() -> None:
        ran["boom"] += 1
        raise ValueError("boom")

    @app.step()
    async def fine() -> str:
        ran["fine"] += 1
        await asyncio.sleep(0.02)
        return "fine"

    @app.workflow()
    async def failing() -> None:
        if kind == "gather":
            await asyncio.gather(boom(), fine())
        else:
            async with asyncio.TaskGroup() as group:
                group.create_task(boom())
                group.create_task(fine())

    async with app:
        with pytest.raises(tether.RunFailed) as info:
            await (await app.start(failing, id="f")).result(timeout=10)
    assert "ValueError: boom" in info.value.error["traceback"]  # a TaskGroup's: in a group
    assert ran["boom"] == 1


async def test_a_rename_deployed_then_rolled_back_while_a_run_waits_for_an_approval(
    make_app: MakeApp,
) -> None:
    ran: Counter[str] = Counter()

    def deploy(app: tether.App, step_name: str) -> None:
        @app.step(name=step_name)
        async def prepare() -> str:
            ran[step_name] += 1
            return "ready"

        @app.workflow()
        async def change() -> str:
            await prepare()
            decision = await tether.approval("Ship it?", reviewers=["ann"])
            return decision.status

        @app.workflow()
        async def release() -> str:
            return await change()

    good = make_app()
    deploy(good, "prepare")
    async with good:
        await good.start("release", id="rel")
        [pending] = await _approvals(good)
    bad = make_app()
    deploy(bad, "prepare_v2")  # a renamed step: the recorded history no longer replays
    async with bad:
        await bad.decide(pending.id, "approve", reviewer="ann",
                         operation_digest=pending.operation_digest)  # fmt: skip
        child = await bad.get("rel/child:change")
        await _until_status(child, RunStatus.HELD)
        assert [a.status for a in await bad.list_approvals(status=None)] == ["approved"]
        parent = await bad.engine.store.get_run("rel")
        events = await bad.engine.store.events_after(0)
        assert parent is not None
        assert not parent.status.terminal
        assert [e.key for e in events if e.run_id == "rel"] == []  # not told: no child's end
    rollback = make_app()
    deploy(rollback, "prepare")
    async with rollback:
        assert await (await rollback.get("rel")).result(timeout=10) == "approved"
    assert ran == {"prepare": 1}  # never run again, and the bad deploy ran nothing


async def _approvals(app: tether.App) -> list[tether.Approval]:
    async with asyncio.timeout(10):
        while not (found := await app.list_approvals()):
            await asyncio.sleep(0.01)
    return found

"""Adversarial tests of replay under concurrency inside a workflow: branches that end in
another order on the first execution than on replay, the same helper in many tasks, task
counts taken from recorded values, failures that cancel siblings, shield and wait_for around
steps, nested gathers in task groups, children of children, crashes mid-gather, and code
changes inside branches. Every test counts step bodies through side-effect counters and checks
that each call got its own result; the `make_app` tests run on SQLite normally and in the
forced-replay mode (which replays the run from the store after every checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path

import pytest

import tether
from tether.store.port import CheckpointStatus, RunStatus
from tether.store.sqlite import SqliteStore

MakeApp = Callable[..., tether.App]
MS = timedelta(milliseconds=1)


@pytest.fixture(params=[("sqlite", False), ("sqlite", True)], ids=["sqlite", "sqlite-replay"])
def mode(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """SQLite only (this file's budget), normally and in the forced-replay mode."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
async def plain_app(tmp_path: Path) -> AsyncIterator[Callable[[], tether.App]]:
    """Apps on one SQLite file, never in forced-replay mode: some replay bugs only show when
    the first execution really ran the branches concurrently (forced replay restarts the run
    after every checkpoint, before workflow code could observe which branch ended first)."""
    made: list[tether.App] = []

    def make() -> tether.App:
        app = tether.App(store=SqliteStore(f"sqlite:///{tmp_path}/plain.db"), force_replay=False)
        app.engine.settings = dataclasses.replace(
            app.engine.settings, inline_wait_max=0.05, poll_interval=0.05
        )
        made.append(app)
        return app

    yield make
    for app in made:
        await app.close()


async def _until_status(handle: tether.RunHandle[object], status: RunStatus) -> None:
    async with asyncio.timeout(15):
        while (await handle.status()) is not status:
            await asyncio.sleep(0.01)


async def _until_recorded(handle: tether.RunHandle[object], names: set[str]) -> None:
    """Until every checkpoint named in `names` is recorded as completed."""
    async with asyncio.timeout(15):
        while True:
            done = {c.name for c in await handle.checkpoints()
                    if c.status is CheckpointStatus.COMPLETED}  # fmt: skip
            if names <= done:
                return
            assert await handle.status() is not RunStatus.HELD, f"{handle.id!r} was held"
            await asyncio.sleep(0.01)


# -- ordering: branches that end in other orders ----------------------------------------------


async def test_branches_woken_in_reverse_order_replay_to_their_own_calls(
    make_app: MakeApp,
) -> None:
    """Three helpers each run a step, wait for their own event, then run a step on the
    payload. The events come last-branch-first, with the run suspended in between (each
    wake replays everything before it), so completion order is the reverse of task order."""
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def prepare(i: int) -> str:
        ran[f"prepare({i})"] += 1
        await asyncio.sleep(0.03 * (3 - i))  # later branches prepare first
        return f"p{i}"

    @app.step()
    async def finish(i: int, prepared: str, payload: str) -> str:
        ran[f"finish({i})"] += 1
        return f"{prepared}:{payload}:{i}"

    async def branch(i: int) -> str:
        prepared = await prepare(i)
        payload = await tether.wait_for_event(f"go-{i}")
        return await finish(i, prepared, payload)

    @app.step()
    async def total(parts: list[str]) -> str:
        ran["total"] += 1
        return "|".join(parts)

    @app.workflow()
    async def fan() -> str:
        parts = await asyncio.gather(branch(0), branch(1), branch(2))
        return await total(list(parts))

    async with app:
        handle = await app.start(fan, id="rev")
        await _until_recorded(handle, {"prepare@0", "prepare@1", "prepare@2"})
        await _until_status(handle, RunStatus.WAITING)
        for i in (2, 1, 0):
            await app.send("rev", f"go-{i}", f"e{i}")
            await _until_recorded(handle, {f"finish@{i}"})
            if i:
                await _until_status(handle, RunStatus.WAITING)  # suspended: the next replays
                outcomes = await app.replay_check()  # the replay-only mode agrees
                assert [o.ok for o in outcomes] == [True]
        assert await handle.result(timeout=15) == "p0:e0:0|p1:e1:1|p2:e2:2"
        checkpoints = await handle.checkpoints()
    assert all(n == 1 for n in ran.values()), ran
    assert len(ran) == 7
    finishes = {c.at: json.loads(c.result or "null") for c in checkpoints
                if c.name.startswith("finish")}  # fmt: skip
    assert finishes == {"0/2": "p0:e0:0", "1/2": "p1:e1:1", "2/2": "p2:e2:2"}


async def test_durable_sleeps_of_different_lengths_in_gathered_branches(make_app: MakeApp) -> None:
    """The longest sleep is in the first branch: the run wakes for each timer in the reverse
    order of the branches and replays the others' completed sleeps and steps each time."""
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def after(i: int) -> int:
        ran[f"after({i})"] += 1
        return i * 10

    async def branch(i: int, ms: int) -> int:
        await tether.sleep(ms * MS)
        return await after(i)

    @app.workflow()
    async def naps() -> list[int]:
        got = await asyncio.gather(branch(0, 300), branch(1, 180), branch(2, 70))
        return [*got, await after(99)]

    async with app:
        assert await (await app.start(naps, id="naps")).result(timeout=15) == [0, 10, 20, 990]
    assert ran == {"after(0)": 1, "after(1)": 1, "after(2)": 1, "after(99)": 1}


async def test_two_branches_waiting_on_one_key_each_take_one_event(make_app: MakeApp) -> None:
    """Both branches wait for key "k"; two events come, with a suspension between. Each event
    is taken once, by one branch, and the step after it sees that branch's payload on every
    replay."""
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def use(branch: int, payload: str) -> str:
        ran[f"use({branch},{payload})"] += 1
        return f"{branch}={payload}"

    async def branch(i: int) -> str:
        return await use(i, await tether.wait_for_event("k"))

    @app.workflow()
    async def both() -> list[str]:
        return list(await asyncio.gather(branch(0), branch(1)))

    async with app:
        handle = await app.start(both, id="k2")
        await _until_status(handle, RunStatus.WAITING)
        await app.send("k2", "k", "first")
        async with asyncio.timeout(15):
            while not ran:
                await asyncio.sleep(0.01)
        await _until_status(handle, RunStatus.WAITING)
        await app.send("k2", "k", "second")
        result = await handle.result(timeout=15)
    assert sorted(p.split("=")[1] for p in result) == ["first", "second"]
    assert [p.split("=")[0] for p in result] == ["0", "1"]
    # each use ran once, with the payload its branch took (the same in every replay)
    assert ran == Counter({f"use({p.replace('=', ',')})": 1 for p in result})


async def test_an_asyncio_event_between_branches_replays(make_app: MakeApp) -> None:
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def produce() -> int:
        ran["produce"] += 1
        await asyncio.sleep(0.05)
        return 7

    @app.step()
    async def consume(x: int) -> int:
        ran["consume"] += 1
        return x * 3

    @app.workflow()
    async def pair() -> list[int]:
        ready = asyncio.Event()
        box: list[int] = []

        async def producer() -> int:
            box.append(await produce())
            ready.set()
            await tether.sleep(80 * MS)  # suspends: the consumer's step is replayed later
            return box[0]

        async def consumer() -> int:
            await ready.wait()
            return await consume(box[0])

        return list(await asyncio.gather(consumer(), producer()))

    async with app:
        assert await (await app.start(pair, id="ev")).result(timeout=15) == [21, 7]
    assert ran == {"produce": 1, "consume": 1}


# -- the same helper from many tasks, nested structures, loops -----------------------------


async def test_the_same_helper_from_different_tasks_and_depths(make_app: MakeApp) -> None:
    """One helper that itself gathers two step calls, run from the root, from a create_task,
    from a TaskGroup task and from a task two levels down; steps slowed so that the deepest
    call finishes first. Every call gets its own result, and each body runs once."""
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def part(tag: str, k: int) -> str:
        ran[f"part({tag},{k})"] += 1
        await asyncio.sleep({"root": 0.06, "task": 0.04, "group": 0.02}.get(tag, 0.0))
        return f"{tag}.{k}"

    async def helper(tag: str) -> str:
        a, b = await asyncio.gather(part(tag, 1), part(tag, 2))
        return f"{a}+{b}"

    async def deeper() -> str:
        inner = asyncio.create_task(helper("deep"))
        await tether.sleep(70 * MS)  # suspends beside the helper's steps
        return await inner

    @app.workflow()
    async def many() -> list[str]:
        t = asyncio.create_task(helper("task"))
        async with asyncio.TaskGroup() as group:
            g = group.create_task(helper("group"))
            d = group.create_task(deeper())
        mine = await helper("root")
        return [mine, await t, g.result(), d.result()]

    async with app:
        result = await (await app.start(many, id="many")).result(timeout=15)
        names = sorted(c.name for c in await (await app.get("many")).checkpoints()
                       if c.kind == "step")  # fmt: skip
    assert result == ["root.1+root.2", "task.1+task.2", "group.1+group.2", "deep.1+deep.2"]
    assert len(ran) == 8, ran
    assert all(n == 1 for n in ran.values()), ran
    assert len(set(names)) == 8  # eight distinct checkpoints, none shared


async def test_task_counts_from_recorded_results_and_helpers_replay(make_app: MakeApp) -> None:
    """The number of tasks comes from a step's result and from tether.random(); each task's
    own recorded random value goes to its own step, on every replay."""
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def how_many() -> int:
        ran["how_many"] += 1
        return 4

    @app.step()
    async def work(i: int, r: float) -> float:
        ran[f"work({i})"] += 1
        await asyncio.sleep(0.01 * (4 - i))
        return r

    async def one(i: int) -> tuple[float, float]:
        r = tether.random()  # recorded in this task
        await tether.sleep((30 + 25 * i) * MS)  # suspensions between the tasks' ends
        return r, await work(i, r)

    @app.workflow()
    async def loop() -> dict[str, object]:
        n = await how_many()
        extra = 1 + int(tether.random() * 3)  # 1..3 more, recorded
        tasks = [asyncio.create_task(one(i)) for i in range(n + extra)]
        pairs = [await t for t in tasks]
        return {"count": len(pairs), "extra": extra, "pairs": pairs}

    async with app:
        result = await (await app.start(loop, id="loop")).result(timeout=20)
    count = result["count"]
    assert count == 4 + result["extra"]
    assert all(r == w for r, w in result["pairs"])  # each step got its own task's value
    assert len({r for r, _ in result["pairs"]}) == count  # and the values differ
    assert ran == Counter({"how_many": 1, **{f"work({i})": 1 for i in range(count)}})


async def test_a_gather_nested_in_a_task_group_with_events_out_of_order(
    make_app: MakeApp,
) -> None:
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def leaf(g: int, j: int, payload: str) -> str:
        ran[f"leaf({g},{j})"] += 1
        return f"{g}{j}{payload}"

    async def wait_then_leaf(g: int, j: int) -> str:
        return await leaf(g, j, await tether.wait_for_event(f"e{g}{j}"))

    async def group_member(g: int) -> list[str]:
        return list(await asyncio.gather(*(wait_then_leaf(g, j) for j in range(2))))

    @app.step()
    async def after(parts: list[str]) -> int:
        ran["after"] += 1
        return len(parts)

    @app.workflow()
    async def tree() -> dict[str, object]:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(group_member(g)) for g in range(2)]
        parts = [p for t in tasks for p in t.result()]
        return {"parts": parts, "n": await after(parts)}

    async with app:
        handle = await app.start(tree, id="tree")
        for key in ("e11", "e00", "e10", "e01"):  # not in task order
            await _until_status(handle, RunStatus.WAITING)
            await app.send("tree", key, key.upper())
            await asyncio.sleep(0.02)
        result = await handle.result(timeout=15)
        leaves = {c.at for c in await handle.checkpoints() if c.name.startswith("leaf")}
    assert result == {"parts": ["00E00", "01E01", "10E10", "11E11"], "n": 4}
    assert ran == Counter({"after": 1, **{f"leaf({g},{j})": 1 for g in (0, 1) for j in (0, 1)}})
    assert leaves == {"0/0/1", "0/1/1", "1/0/1", "1/1/1"}  # task path, then the step's seq


# -- failures and cancellation --------------------------------------------------------------


async def test_an_orphan_of_a_failed_gather_is_recorded_once_and_replayed(
    make_app: MakeApp,
) -> None:
    """gather raises the first failure and leaves the other branch running: its step ends
    later, is recorded once, and its result is still the one the workflow reads."""
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step(retry=tether.NO_RETRY)
    async def fail_fast() -> None:
        ran["fail_fast"] += 1
        raise ValueError("no")

    @app.step()
    async def keep_going(x: int) -> int:
        ran["keep_going"] += 1
        await asyncio.sleep(0.15)
        return x + 1

    @app.step()
    async def meanwhile() -> str:
        ran["meanwhile"] += 1
        return "meanwhile"

    @app.workflow()
    async def orphan() -> list[object]:
        survivor = asyncio.ensure_future(keep_going(41))
        with contextlib.suppress(ValueError):
            await asyncio.gather(fail_fast(), survivor)
        m = await meanwhile()
        await tether.sleep(60 * MS)
        return [m, await survivor]

    async with app:
        assert await (await app.start(orphan, id="o")).result(timeout=15) == ["meanwhile", 42]
    assert ran == {"fail_fast": 1, "keep_going": 1, "meanwhile": 1}


async def test_a_failed_child_among_gathered_children_of_children(make_app: MakeApp) -> None:
    """A parent gathers two children; each gathers two grandchildren that wait past the inline
    hold; one grandchild fails, its parent catches it. Every body once, ids by position."""
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def leaf_step(x: int) -> int:
        ran[f"leaf({x})"] += 1
        if x == 11:
            raise RuntimeError("grandchild 11 fails")
        return x

    @app.workflow()
    async def grandchild(x: int) -> int:
        await tether.sleep(70 * MS)
        return await leaf_step(x)

    @app.workflow()
    async def child(x: int) -> list[object]:
        got = await asyncio.gather(grandchild(x * 10), grandchild(x * 10 + 1),
                                   return_exceptions=True)  # fmt: skip
        return [g if isinstance(g, int) else type(g).__name__ for g in got]

    @app.workflow()
    async def parent() -> list[object]:
        return list(await asyncio.gather(child(1), child(2)))

    leaf_step.retry = tether.NO_RETRY
    async with app:
        result = await (await app.start(parent, id="p")).result(timeout=20)
        ids = sorted(r.id for r in await app.list_runs(workflow="grandchild"))
        failed = [r.id for r in await app.list_runs(workflow="grandchild")
                  if r.status is RunStatus.FAILED]  # fmt: skip
    assert result == [[10, "RunFailed"], [20, 21]]
    assert ran == {"leaf(10)": 1, "leaf(11)": 1, "leaf(20)": 1, "leaf(21)": 1}
    assert ids == [f"p/child:child@{i}/child:grandchild@{j}" for i in (0, 1) for j in (0, 1)]
    assert failed == ["p/child:child@0/child:grandchild@1"]


# -- shield, wait_for ---------------------------------------------------------------------------


async def test_a_shielded_step_outlives_its_cancelled_waiter(make_app: MakeApp) -> None:
    """A task awaits shield(step) and is cancelled (on a durable event) while the body runs;
    the step goes on, is recorded once, and the root reads its result after another step."""
    app = make_app()
    ran: Counter[str] = Counter()
    release = asyncio.Event()

    @app.step()
    async def long_job(x: int) -> int:
        ran["long_job"] += 1
        await release.wait()
        return x * 2

    @app.step()
    async def after() -> str:
        ran["after"] += 1
        return "after"

    @app.workflow()
    async def shielded() -> list[object]:
        job = asyncio.ensure_future(long_job(21))

        async def watcher() -> int:
            return await asyncio.shield(job)

        watching = asyncio.create_task(watcher())
        await tether.wait_for_event("stop-watching")
        watching.cancel()
        a = await after()
        return [a, await job]

    async with app:
        handle = await app.start(shielded, id="sh")
        async with asyncio.timeout(10):
            while not ran["long_job"]:
                await asyncio.sleep(0.01)
        await app.send("sh", "stop-watching")
        await asyncio.sleep(0.1)
        release.set()
        assert await handle.result(timeout=15) == ["after", 42]
    assert ran == {"long_job": 1, "after": 1}


async def test_wait_for_around_steps_that_finish_in_time_replays(make_app: MakeApp) -> None:
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def quick(x: int) -> int:
        ran[f"quick({x})"] += 1
        await asyncio.sleep(0.01 * x)
        return x

    async def helper(x: int) -> int:
        got = await asyncio.wait_for(quick(x), timeout=5)
        await tether.sleep(60 * MS)
        return got + await asyncio.wait_for(asyncio.shield(quick(x + 10)), timeout=5)

    @app.workflow()
    async def timed() -> list[int]:
        return list(await asyncio.gather(helper(3), helper(1)))

    async with app:
        assert await (await app.start(timed, id="wf")).result(timeout=15) == [16, 12]
    assert ran == {"quick(3)": 1, "quick(1)": 1, "quick(13)": 1, "quick(11)": 1}


async def test_wait_for_timing_out_a_slow_step_then_a_fallback_replays(make_app: MakeApp) -> None:
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def hopeless() -> str:
        ran["hopeless"] += 1
        await asyncio.sleep(30)  # always past the timeout
        return "never"

    @app.step()
    async def fallback() -> str:
        ran["fallback"] += 1
        return "fallback"

    @app.workflow()
    async def timed() -> str:
        try:
            got = await asyncio.wait_for(hopeless(), timeout=0.05)
        except TimeoutError:
            got = await fallback()
        await tether.sleep(80 * MS)  # suspends: the above replays
        return got

    async with app:
        handle = await app.start(timed, id="wft")
        async with asyncio.timeout(10):
            while not (await handle.status()).terminal:
                assert await handle.status() is not RunStatus.HELD, (
                    json.loads((await app.engine.store.get_run("wft")).error or "{}")  # type: ignore[union-attr]
                )
                await asyncio.sleep(0.01)
        assert await handle.result(timeout=1) == "fallback"
    assert ran["fallback"] == 1


# -- the replay frontier and tasks that finish in the same loop turn ------------------------


async def test_a_failing_branch_cancels_its_sibling_and_the_recovery_replays(
    make_app: MakeApp, mode: tuple[str, bool], request: pytest.FixtureRequest
) -> None:
    """slow() is created first and is still running when boom() fails: the group cancels it
    (unrecorded). On replay slow() is new and parks at the frontier while boom() re-raises."""
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step(retry=tether.NO_RETRY)
    async def boom() -> None:
        ran["boom"] += 1
        await asyncio.sleep(0.02)
        raise KeyError("boom")

    @app.step()
    async def slow() -> str:
        ran["slow"] += 1
        await asyncio.sleep(0.3)
        return "slow"

    @app.step()
    async def recover(what: str) -> str:
        ran["recover"] += 1
        return f"recovered from {what}"

    @app.workflow()
    async def guarded() -> str:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(slow())
                group.create_task(boom())
        except* KeyError as caught:
            note = await recover(type(caught.exceptions[0]).__name__)
        await tether.sleep(80 * MS)  # suspends: the group's failure is replayed
        return note + "; " + await recover("sleep")

    async with app:
        handle = await app.start(guarded, id="g")
        await _until_ended_not_held(app, handle)
        result = await handle.result(timeout=1)
    assert result == "recovered from KeyError; recovered from sleep"
    assert ran == {"boom": 1, "slow": 1, "recover": 2}


async def test_a_failing_branch_created_first_cancels_its_sibling_and_replays(
    make_app: MakeApp,
) -> None:
    """The same with the failing branch created first: its done-callbacks run before the
    sibling's park schedules a look, and the run replays."""
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step(retry=tether.NO_RETRY)
    async def boom() -> None:
        ran["boom"] += 1
        await asyncio.sleep(0.02)
        raise KeyError("boom")

    @app.step()
    async def slow() -> str:
        ran["slow"] += 1
        await asyncio.sleep(0.3)
        return "slow"

    @app.step()
    async def recover() -> str:
        ran["recover"] += 1
        return "recovered"

    @app.workflow()
    async def guarded() -> str:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(boom())
                group.create_task(slow())
        except* KeyError:
            note = await recover()
        await tether.sleep(80 * MS)
        return note

    async with app:
        handle = await app.start(guarded, id="g1")
        await _until_ended_not_held(app, handle)
        assert await handle.result(timeout=1) == "recovered"
    assert ran == {"boom": 1, "slow": 1, "recover": 1}


async def test_an_event_raced_against_a_step_replays(make_app: MakeApp) -> None:
    """An approval event raced against an automatic step (FIRST_COMPLETED): the step wins,
    the event wait is cancelled, a step records the winner, then the run suspends."""
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def automatic() -> str:
        ran["automatic"] += 1
        await asyncio.sleep(0.02)
        return "auto"

    @app.step()
    async def record(winner: str) -> str:
        ran[f"record({winner})"] += 1
        return winner

    @app.workflow()
    async def race() -> str:
        human = asyncio.create_task(tether.wait_for_event("approve"))
        machine = asyncio.create_task(automatic())
        done, pending = await asyncio.wait({human, machine}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        winner = await record("human" if human in done else "machine")
        await tether.sleep(80 * MS)  # suspends: the race replays
        return winner

    async with app:
        handle = await app.start(race, id="race")
        await _until_ended_not_held(app, handle)
        assert await handle.result(timeout=1) == "machine"
    assert ran == {"automatic": 1, "record(machine)": 1}


async def test_replay_check_of_a_waiting_run_whose_race_a_step_won(
    plain_app: Callable[[], tether.App],
) -> None:
    app = plain_app()

    @app.step()
    async def automatic() -> str:
        await asyncio.sleep(0.02)
        return "auto"

    @app.step()
    async def record(winner: str) -> str:
        return winner

    @app.workflow()
    async def race() -> str:
        human = asyncio.create_task(tether.wait_for_event("approve"))
        machine = asyncio.create_task(automatic())
        done, pending = await asyncio.wait({human, machine}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        winner = await record("human" if human in done else "machine")
        await tether.wait_for_event("finish")
        return winner

    async with app:
        handle = await app.start(race, id="rc")
        await _until_status(handle, RunStatus.WAITING)
        assert [c.name for c in await handle.checkpoints()] == ["automatic", "record"]
        outcomes = await app.replay_check()
        assert [(o.run_id, o.first_difference) for o in outcomes] == [("rc", None)]
        await app.send("rc", "finish")
        assert await handle.result(timeout=10) == "machine"


async def test_a_step_that_wins_a_race_against_an_event_without_inline_holds(
    tmp_path: Path,
) -> None:
    app = tether.App(store=SqliteStore(f"sqlite:///{tmp_path}/nohold.db"), force_replay=False)
    app.engine.settings = dataclasses.replace(
        app.engine.settings, inline_wait_max=0.0, poll_interval=0.05
    )
    ran: Counter[str] = Counter()

    @app.step()
    async def automatic() -> str:
        ran["automatic"] += 1
        await asyncio.sleep(0.02)
        return "auto"

    @app.workflow()
    async def race() -> str:
        human = asyncio.create_task(tether.wait_for_event("approve"))
        machine = asyncio.create_task(automatic())
        done, pending = await asyncio.wait({human, machine}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return "human" if human in done else str(machine.result())

    async with app:
        handle = await app.start(race, id="nohold")
        try:
            assert await handle.result(timeout=3) == "auto"
        finally:
            run = await app.engine.store.get_run("nohold")
    assert ran == {"automatic": 1}, (run.status, run.wake_on) if run else None


async def _until_ended_not_held(app: tether.App, handle: tether.RunHandle[object]) -> None:
    """Until the run ends; fails at once (with its error) if it is held."""
    async with asyncio.timeout(15):
        while not (status := await handle.status()).terminal:
            if status is RunStatus.HELD:
                run = await app.engine.store.get_run(handle.id)
                assert run is not None
                pytest.fail(f"run {handle.id!r} was held: {json.loads(run.error or '{}')}")
            await asyncio.sleep(0.01)


# -- completion order observed by workflow code ----------------------------------------------


@pytest.mark.parametrize("observer", ["as_completed", "queue", "first_completed"])
async def test_code_that_observes_which_branch_ended_first_replays(
    plain_app: Callable[[], tether.App], observer: str
) -> None:
    app = plain_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def job(i: int) -> int:
        ran[f"job({i})"] += 1
        await asyncio.sleep(0.15 if i == 0 else 0.0)  # the first-created ends last
        return i

    @app.step()
    async def log(what: str) -> str:
        ran[f"log({what})"] += 1
        return what

    @app.workflow()
    async def observed() -> list[str]:
        order: list[str] = []
        if observer == "as_completed":
            jobs = [asyncio.create_task(job(0)), asyncio.create_task(job(1))]
            for next_done in asyncio.as_completed(jobs):
                order.append(await log(str(await next_done)))
        elif observer == "queue":
            queue: asyncio.Queue[int] = asyncio.Queue()

            async def produce(i: int) -> None:
                await queue.put(await job(i))

            async def consume() -> None:
                for _ in range(2):
                    order.append(await log(str(await queue.get())))

            await asyncio.gather(produce(0), produce(1), consume())
        else:
            slow = asyncio.create_task(job(0))
            fast = asyncio.create_task(job(1))
            done, _ = await asyncio.wait({slow, fast}, return_when=asyncio.FIRST_COMPLETED)
            order.append(await log("slow" if slow in done else "fast"))
            order.append(await log(str(sum(await asyncio.gather(slow, fast)))))  # both end
        await tether.wait_for_event("finish")  # suspends: everything above replays
        return order

    async with app:
        handle = await app.start(observed, id="obs")
        await _until_status(handle, RunStatus.WAITING)
        await app.send("obs", "finish")
        await _until_ended_not_held(app, handle)
        result = await handle.result(timeout=1)
    assert result == (["fast", "1"] if observer == "first_completed" else ["1", "0"])
    assert all(n == 1 for n in ran.values()), ran


# -- versioning inside a branch --------------------------------------------------------------


async def test_patched_in_a_branch_of_a_gather_the_run_already_passed(make_app: MakeApp) -> None:
    ran: Counter[str] = Counter()

    def deploy(app: tether.App, *, patched: bool) -> None:
        @app.step()
        async def work(tag: str) -> str:
            ran[f"work({tag})"] += 1
            return tag

        @app.step()
        async def extra() -> str:
            ran["extra"] += 1
            return "extra"

        @app.step()
        async def final(parts: list[str]) -> str:
            ran["final"] += 1
            return "+".join(parts)

        async def branch(tag: str) -> str:
            got = await work(tag)
            if patched and tag == "a" and tether.patched("extra-in-a"):
                got += await extra()
            return got

        @app.workflow(name="versioned")
        async def versioned() -> str:
            parts = await asyncio.gather(branch("a"), branch("b"))
            done = await final(list(parts))
            await tether.wait_for_event("go")
            return done

    old = make_app()
    deploy(old, patched=False)
    async with old:
        handle = await old.start("versioned", id="ver")
        await _until_status(handle, RunStatus.WAITING)
    new = make_app()
    deploy(new, patched=True)
    async with new:
        await new.send("ver", "go")
        handle = await new.get("ver")
        await _until_ended_not_held(new, handle)
        assert await handle.result(timeout=1) == "a+b"  # the old path: recorded before it
    assert ran == {"work(a)": 1, "work(b)": 1, "final": 1}


# -- a cancelled branch on replay ------------------------------------------------------------


async def test_a_branch_cancelled_by_a_recorded_failure_takes_no_event_on_replay(
    make_app: MakeApp,
) -> None:
    """A branch waiting for "k" is cancelled when its sibling's step fails; the root then
    waits for "k" itself. When "k" comes, the replay re-raises the failure at once: the
    cancelled branch must not take the event the root waits for."""
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step(retry=tether.NO_RETRY)
    async def boom() -> None:
        ran["boom"] += 1
        raise KeyError("boom")

    async def failing() -> None:
        await boom()

    async def side() -> object:
        got = await tether.wait_for_event("k")
        ran["side got k"] += 1
        return got

    @app.workflow()
    async def fallback() -> object:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(failing())
                group.create_task(side())
        except* KeyError:
            pass
        return await tether.wait_for_event("k")

    async with app:
        handle = await app.start(fallback, id="cb")
        await _until_status(handle, RunStatus.WAITING)
        await app.send("cb", "k", "for the root")
        await _until_ended_not_held(app, handle)
        assert await handle.result(timeout=1) == "for the root"
        names = [c.name for c in await handle.checkpoints()]
    assert ran["boom"] == 1
    assert ran["side got k"] == 0
    assert names == ["boom@0", "event:k"]


# -- crashes mid-gather ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gather", "taskgroup"])
async def test_a_crash_mid_gather_runs_again_only_the_unfinished_branch(
    make_app: MakeApp, kind: str
) -> None:
    """The worker stops (a crash, as far as the run knows) while branch 1's step runs and
    branches 0 and 2 have recorded theirs; the next worker replays 0 and 2 and runs only 1."""
    ran: Counter[str] = Counter()
    blocked = asyncio.Event()

    def deploy(app: tether.App, *, block: bool) -> None:
        @app.step()
        async def work(i: int) -> int:
            ran[f"work({i})"] += 1
            if i == 1 and block:
                blocked.set()
                await asyncio.sleep(3600)  # interrupted by the first worker's stop
            await asyncio.sleep(0.01 * i)
            return i * i

        @app.step()
        async def tally(i: int, sq: int) -> str:
            ran[f"tally({i})"] += 1
            return f"{i}:{sq}"

        async def branch(i: int) -> str:
            inner = asyncio.create_task(work(i))  # its slot is the branch's (taken at call)
            return await tally(i, await inner)

        @app.workflow(name="crashy")
        async def crashy() -> list[str]:
            if kind == "gather":
                return list(await asyncio.gather(*(branch(i) for i in range(3))))
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(branch(i)) for i in range(3)]
            return [t.result() for t in tasks]

    first = make_app()
    deploy(first, block=True)
    async with first:
        handle = await first.start("crashy", id="crash")
        await asyncio.wait_for(blocked.wait(), 10)
        await _until_recorded(handle, {"work@0", "work@2"})
    second = make_app()
    deploy(second, block=False)
    async with second:
        result = await (await second.get("crash")).result(timeout=15)
    assert result == ["0:0", "1:1", "2:4"]
    assert ran["work(0)"] == 1
    assert ran["work(2)"] == 1
    assert ran["work(1)"] == 2  # interrupted, then run again (at-least-once)
    assert all(ran[f"tally({i})"] == 1 for i in range(3)), ran


async def test_a_crash_mid_gather_of_a_child_a_step_and_an_event_wait(make_app: MakeApp) -> None:
    """The worker stops while the step runs, after the child run ended and while the event
    wait waits; the next worker joins the ended child, runs only the step again, and the
    event sent to it reaches the wait."""
    ran: Counter[str] = Counter()
    blocked = asyncio.Event()

    def deploy(app: tether.App, *, block: bool) -> None:
        @app.step()
        async def kid_step(x: int) -> int:
            ran["kid_step"] += 1
            return x * 2

        @app.workflow(name="kid")
        async def kid(x: int) -> int:
            await tether.sleep(60 * MS)
            return await kid_step(x)

        @app.step()
        async def work() -> str:
            ran["work"] += 1
            if block:
                blocked.set()
                await asyncio.sleep(3600)
            return "w"

        @app.workflow(name="mixed")
        async def mixed() -> list[object]:
            return list(await asyncio.gather(kid(5), work(), tether.wait_for_event("e")))

    first = make_app()
    deploy(first, block=True)
    async with first:
        await first.start("mixed", id="mx")
        await asyncio.wait_for(blocked.wait(), 10)
        await _until_status(await first.get("mx/child:kid@0"), RunStatus.SUCCEEDED)
    second = make_app()
    deploy(second, block=False)
    async with second:
        await second.send("mx", "e", "payload")
        assert await (await second.get("mx")).result(timeout=15) == [10, "w", "payload"]
        assert [r.id for r in await second.list_runs(workflow="kid")] == ["mx/child:kid@0"]
    assert ran == {"kid_step": 1, "work": 2}


async def test_a_recursive_tree_of_tasks_replays_each_leaf_once(make_app: MakeApp) -> None:
    """Helpers that spawn helpers three levels deep (2 x 2 x 2 leaves), each leaf a step and
    a durable sleep whose length reverses the leaves' order; every result goes to its path."""
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def leaf(path: str) -> str:
        ran[path] += 1
        return path[::-1]

    async def node(path: str, depth: int) -> list[str]:
        if depth == 3:
            await tether.sleep((120 - 12 * int(path, 2)) * MS)
            return [await leaf(path)]
        left, right = await asyncio.gather(node(path + "0", depth + 1),
                                           node(path + "1", depth + 1))  # fmt: skip
        return left + right

    @app.workflow()
    async def tree() -> list[str]:
        return await node("", 0)

    async with app:
        result = await (await app.start(tree, id="rtree")).result(timeout=15)
    paths = [f"{i:03b}" for i in range(8)]
    assert result == [p[::-1] for p in paths]
    assert ran == Counter(dict.fromkeys(paths, 1))


async def test_a_branch_appended_to_the_gather_of_a_waiting_run_runs_only_its_step(
    make_app: MakeApp,
) -> None:
    ran: Counter[str] = Counter()

    def deploy(app: tether.App, tags: list[str]) -> None:
        @app.step()
        async def work(tag: str) -> str:
            ran[f"work({tag})"] += 1
            return tag.upper()

        @app.workflow(name="growing")
        async def growing() -> str:
            parts = await asyncio.gather(*(work(t) for t in tags))
            await tether.wait_for_event("go")
            return "".join(parts)

    old = make_app()
    deploy(old, ["a", "b"])
    async with old:
        await _until_status(await old.start("growing", id="grow"), RunStatus.WAITING)
    new = make_app()
    deploy(new, ["a", "b", "c"])  # a branch after the recorded ones: allowed
    async with new:
        await new.send("grow", "go")
        assert await (await new.get("grow")).result(timeout=15) == "ABC"
    assert ran == {"work(a)": 1, "work(b)": 1, "work(c)": 1}


# -- code changes inside branches -------------------------------------------------------------


@pytest.mark.parametrize("change", ["fewer", "swapped", "extra_task_first", "renamed", "deeper"])
async def test_a_code_change_inside_branches_holds_the_run_before_any_effect(
    make_app: MakeApp, change: str
) -> None:
    ran: Counter[str] = Counter()

    def deploy(app: tether.App, change: str | None) -> None:
        @app.step(name="work_v2" if change == "renamed" else "work")
        async def work(tag: str) -> str:
            ran[f"work({tag})"] += 1
            return tag.upper()

        @app.step()
        async def final(parts: list[str]) -> str:
            ran["final"] += 1
            return "".join(parts)

        async def branch(tag: str) -> str:
            if change == "deeper":  # the same step, one task further down
                return await asyncio.create_task(_call(work, tag))
            return await work(tag)

        async def nothing() -> None:
            return None

        @app.workflow(name="changing")
        async def changing() -> str:
            if change == "extra_task_first":
                await asyncio.create_task(nothing())  # no checkpoint, but a task in front
            tags = {"fewer": ["a"], "swapped": ["b", "a"]}.get(change or "", ["a", "b"])
            parts = await asyncio.gather(*(branch(t) for t in tags))
            await tether.wait_for_event("go")
            return await final(list(parts))

    old = make_app()
    deploy(old, None)
    async with old:
        await _until_status(await old.start("changing", id="chg"), RunStatus.WAITING)
    assert ran == {"work(a)": 1, "work(b)": 1}
    ran.clear()
    new = make_app()
    deploy(new, change)
    async with new:
        await new.send("chg", "go")
        await _until_status(await new.get("chg"), RunStatus.HELD)
        run = await new.engine.store.get_run("chg")
    assert run is not None
    assert not run.status.terminal
    assert json.loads(run.error or "{}")["type"] == "tether.errors.NonDeterminismError"
    assert ran == {}  # the changed code ran no step body
    back = make_app()  # rolled back: the old code finishes the run, running only `final`
    deploy(back, None)
    async with back:
        assert await (await back.get("chg")).result(timeout=15) == "AB"
    assert ran == {"final": 1}


async def _call(step: tether.Step[[str], str], tag: str) -> str:
    return await step(tag)

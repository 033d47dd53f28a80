"""Attacks on the position guarantee of concurrent workflow code (docs/semantics.md, "Positions
and concurrency", "Concurrent waits", "Divergence holds the run"): task trees built in odd ways,
tasks that talk through asyncio primitives, tasks cancelled by the workflow, waits, approvals
and child runs in several tasks, recorded helpers in tasks, old histories replayed under
`tether.patched`, and many branches at once. Every test asserts the exact result and that each
step body completed exactly once, on every backend and in forced-replay mode (which replays the
run from the store after every checkpoint). Step bodies sleep for varied times so that they
complete in another order than they were called.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import tether
from tether.store.port import CheckpointStatus, RunStatus

MakeApp = Callable[..., tether.App]
# Two of the suite's modes: PostgreSQL, and forced replay on SQLite (which runs every first
# execution too); the memory store runs the same engine code. The suite is kept within its time.
ATTACK_MODES = [("postgres", False), ("sqlite", True)]


@pytest.fixture(params=ATTACK_MODES, ids=[f"{b}{'-replay' if r else ''}" for b, r in ATTACK_MODES])
def mode(request: pytest.FixtureRequest) -> tuple[str, bool]:
    return request.param  # type: ignore[no-any-return]


SUSPEND = timedelta(milliseconds=80)  # past the tests' 50 ms inline hold: the run suspends
ENDED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.HELD, RunStatus.DEAD,
         RunStatus.CANCELLED)  # fmt: skip


class Kit:
    """Steps that count their bodies: `started` when a body begins, `ran` when it completes."""

    def __init__(self, app: tether.App) -> None:
        self.started: Counter[str] = Counter()
        self.ran: Counter[str] = Counter()
        kit = self

        @app.step()
        async def work(tag: str, delay: float = 0.0) -> str:
            kit.started[tag] += 1
            # By default shorter tags sleep longer: later (deeper) calls tend to finish first.
            await asyncio.sleep(delay if delay else (7 - len(tag) % 7) * 0.004)
            kit.ran[tag] += 1
            return tag.upper()

        @app.step(retry=tether.NO_RETRY)
        async def boom(tag: str, delay: float = 0.0) -> str:
            kit.started[tag] += 1
            await asyncio.sleep(delay)
            kit.ran[tag] += 1
            raise ValueError(f"bad {tag}")

        self.work = work
        self.boom = boom

    def once(self, *tags: str) -> None:
        """Exactly these bodies completed, each exactly once."""
        assert dict(self.ran) == dict.fromkeys(tags, 1), self.ran


async def until_status(
    handle: tether.RunHandle[Any], *statuses: RunStatus, seconds: float = 10
) -> RunStatus:
    async with asyncio.timeout(seconds):
        while (status := await handle.status()) not in statuses:
            await asyncio.sleep(0.01)
    return status


async def outcome(handle: tether.RunHandle[Any]) -> Any:
    """The run's result; a held (or dead) run fails the test at once, naming its divergence."""
    status = await until_status(handle, *ENDED)
    if status in (RunStatus.HELD, RunStatus.DEAD):
        info = await handle.info()
        pytest.fail(f"run {handle.id} is {status.value}: {(info.error or {}).get('message')}")
    return await handle.result(timeout=1)


async def until(predicate: Callable[[], bool], seconds: float = 10) -> None:
    async with asyncio.timeout(seconds):
        while not predicate():
            await asyncio.sleep(0.005)


async def approvals(app: tether.App, run_id: str, count: int) -> list[tether.Approval]:
    async with asyncio.timeout(10):
        while len(found := await app.list_approvals(run_id=run_id)) < count:
            await asyncio.sleep(0.01)
    return found


# -- task trees ---------------------------------------------------------------------------------


async def test_gather_inside_a_task_group_inside_create_task(make_app: MakeApp) -> None:
    app = make_app()
    kit = Kit(app)
    work = kit.work

    async def leaf(tag: str) -> str:
        return await work(tag)

    async def middle(tag: str) -> str:
        a, b = await asyncio.gather(leaf(tag + "a"), leaf(tag + "bb"))
        return await work(f"{a}+{b}")

    async def top(tag: str) -> str:
        async with asyncio.TaskGroup() as group:
            first = group.create_task(middle(tag + "1"))
            second = group.create_task(middle(tag + "22"))
        return await work(f"[{first.result()},{second.result()}]")

    @app.workflow()
    async def forest() -> list[str]:
        left = asyncio.create_task(top("L"))
        right = asyncio.create_task(top("R"))
        got = [await right, await left]
        await tether.sleep(SUSPEND)  # suspends: everything above replays
        return got

    async with app:
        handle = await app.start(forest, id="forest")
        result = await outcome(handle)
        checkpoints = await handle.checkpoints()
    assert result == ["[R1A+R1BB,R22A+R22BB]", "[L1A+L1BB,L22A+L22BB]"]
    leaves = [f"{s}{m}{x}" for s in "LR" for m in ("1", "22") for x in ("a", "bb")]
    middles = [f"{s}{m}A+{s}{m}BB" for s in "LR" for m in ("1", "22")]
    tops = ["[L1A+L1BB,L22A+L22BB]", "[R1A+R1BB,R22A+R22BB]"]
    kit.once(*leaves, *middles, *tops)
    steps = sorted(c.at for c in checkpoints if c.kind == "step")
    # The root's tasks 0 and 1 (the tops), their group's tasks, the gathers' tasks below them.
    assert steps == sorted([f"{t}/{g}/{x}/0" for t in (0, 1) for g in (0, 1) for x in (0, 1)]
                           + [f"{t}/{g}/0" for t in (0, 1) for g in (0, 1)]
                           + [f"{t}/0" for t in (0, 1)])  # fmt: skip
    by_position = {c.at: c.name for c in checkpoints}
    assert by_position["1/0/1/0"] == "work@1.0.1"  # R's first middle's second leaf


async def test_recursive_helpers_that_create_tasks_that_create_tasks(make_app: MakeApp) -> None:
    app = make_app()
    kit = Kit(app)

    async def tree(depth: int, tag: str) -> str:
        if depth == 0:
            return await kit.work(tag)
        kids = [asyncio.create_task(tree(depth - 1, tag + c)) for c in "xy"]
        if depth == 2:  # a TaskGroup level in between
            async with asyncio.TaskGroup() as group:
                more = group.create_task(tree(depth - 1, tag + "z"))
            kids.append(more)
        got = await asyncio.gather(*kids)
        return await kit.work(f"{tag}({','.join(got)})")

    @app.workflow()
    async def recurse() -> str:
        got = await tree(3, "r")
        await tether.sleep(SUSPEND)
        return got

    tags: list[str] = []

    def expect(depth: int, tag: str) -> str:  # what tree() computes, without tasks
        if depth == 0:
            tags.append(tag)
            return tag.upper()
        got = [expect(depth - 1, tag + c) for c in ("xyz" if depth == 2 else "xy")]
        tags.append(f"{tag}({','.join(got)})")
        return tags[-1].upper()

    async with app:
        result = await outcome(await app.start(recurse, id="rec"))
    assert result == expect(3, "r")
    assert result.startswith("R(RX(RXX(RXXX,RXXY),RXY(RXYX,RXYY),RXZ(RXZX,RXZY)),RY(")
    kit.once(*tags)
    assert len(tags) == 1 + 2 + 6 + 12


async def test_sixty_concurrent_branches_each_get_their_own_results(make_app: MakeApp) -> None:
    app = make_app()
    kit = Kit(app)
    n = 60

    async def branch(i: int) -> str:
        first = await kit.work(f"a{i}", delay=((i * 7) % 11) * 0.002)
        return await kit.work(f"{first}-b{i}", delay=((i * 5) % 7) * 0.002)

    @app.workflow()
    async def many() -> list[str]:
        got = await asyncio.gather(*(branch(i) for i in range(n)))
        await tether.sleep(SUSPEND)
        return list(got)

    async with app:
        handle = await app.start(many, id="many")
        result = await outcome(handle)
        checkpoints = await handle.checkpoints()
    assert result == [f"A{i}-B{i}" for i in range(n)]
    kit.once(*[f"a{i}" for i in range(n)], *[f"A{i}-b{i}" for i in range(n)])
    steps = {c.at: c.name for c in checkpoints if c.kind == "step"}
    assert steps == {f"{i}/{j}": f"work@{i}" + ("#2" if j else "") for i in range(n)
                     for j in (0, 1)}  # fmt: skip


# -- asyncio's combinators ----------------------------------------------------------------------


async def test_asyncio_wait_first_exception_then_cancelling_the_rest(make_app: MakeApp) -> None:
    app = make_app()
    kit = Kit(app)

    @app.workflow()
    async def first_error() -> list[str]:
        failing = asyncio.create_task(kit.boom("b", delay=0.03))
        slow = asyncio.create_task(kit.work("slow", delay=0.4))
        quick = asyncio.create_task(kit.work("q", delay=0.001))
        done, pending = await asyncio.wait({failing, slow, quick},
                                           return_when=asyncio.FIRST_EXCEPTION)  # fmt: skip
        assert failing in done
        assert quick in done
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        after = await kit.work("after")
        await tether.sleep(SUSPEND)
        return [repr(failing.exception()), quick.result(), after]

    async with app:
        result = await outcome(await app.start(first_error, id="fe"))
    assert result == ["ValueError('bad b')", "Q", "AFTER"]
    assert kit.started["slow"] == 1  # started once; never again on replay
    assert {t: n for t, n in kit.ran.items() if t != "slow"} == {"b": 1, "q": 1, "after": 1}
    assert kit.ran["slow"] <= 1  # forced replay lets it finish; else it is cancelled


async def test_gather_with_return_exceptions_keeps_each_failure_in_its_place(
    make_app: MakeApp,
) -> None:
    app = make_app()
    kit = Kit(app)

    async def helper() -> str:
        await kit.work("h1")
        return await kit.boom("h2", delay=0.01)

    @app.workflow()
    async def mixed() -> list[str]:
        got = await asyncio.gather(kit.work("x", delay=0.03), kit.boom("y", delay=0.02), helper(),
                                   kit.work("z"), return_exceptions=True)  # fmt: skip
        await tether.sleep(SUSPEND)
        return [g if isinstance(g, str) else f"{type(g).__name__}:{g}" for g in got]

    async with app:
        handle = await app.start(mixed, id="mixed")
        result = await outcome(handle)
        checkpoints = await handle.checkpoints()
    assert result == ["X", "ValueError:bad y", "ValueError:bad h2", "Z"]
    kit.once("x", "y", "h1", "h2", "z")
    failed = sorted(c.name for c in checkpoints if c.status is CheckpointStatus.FAILED)
    assert failed == ["boom", "boom@2"]  # the root's own call, and the helper's (gather task 2)


async def test_shield_and_wait_for_around_steps_and_helpers(make_app: MakeApp) -> None:
    app = make_app()
    kit = Kit(app)

    async def pair() -> str:
        a = await kit.work("p1", delay=0.02)
        return a + await kit.work("p2")

    @app.workflow()
    async def guarded() -> list[str]:
        shielded = asyncio.shield(kit.work("shielded", delay=0.03))
        bounded = asyncio.wait_for(kit.work("bounded", delay=0.01), timeout=5)
        both = await asyncio.gather(shielded, bounded, asyncio.wait_for(pair(), timeout=5))
        await tether.sleep(SUSPEND)
        return list(both)

    async with app:
        result = await outcome(await app.start(guarded, id="guard"))
    assert result == ["SHIELDED", "BOUNDED", "P1P2"]
    kit.once("shielded", "bounded", "p1", "p2")


async def test_wait_for_a_step_that_times_out_then_a_fallback(make_app: MakeApp) -> None:
    app = make_app()
    kit = Kit(app)

    @app.workflow()
    async def fallback() -> str:
        try:
            return await asyncio.wait_for(kit.work("slow", delay=1.0), timeout=0.1)
        except TimeoutError:
            got = await kit.work("fallback")
        await tether.sleep(SUSPEND)  # suspends: the replay meets the timeout again
        return got

    async with app:
        result = await outcome(await app.start(fallback, id="wf-timeout"))
    assert result == "FALLBACK"
    assert kit.started["slow"] == 1
    kit.once("fallback")


# -- tasks that talk to each other --------------------------------------------------------------


async def test_branches_talking_through_an_event_and_a_bounded_queue(make_app: MakeApp) -> None:
    app = make_app()
    kit = Kit(app)

    @app.workflow()
    async def talk() -> dict[str, object]:
        queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=1)
        done = asyncio.Event()

        async def producer() -> str:
            for i in range(4):
                await queue.put(await kit.work(f"p{i}", delay=0.004 * (4 - i)))
            await queue.put(None)
            return "produced"

        async def consumer() -> list[str]:
            out = []
            while (item := await queue.get()) is not None:
                out.append(await kit.work(f"c{item}", delay=0.003 * len(out)))
            done.set()
            return out

        async def watcher() -> str:
            await done.wait()
            return await kit.work("w")

        got = await asyncio.gather(watcher(), consumer(), producer())
        await tether.sleep(SUSPEND)
        return {"w": got[0], "c": got[1], "p": got[2]}

    async with app:
        result = await outcome(await app.start(talk, id="talk"))
    assert result == {"w": "W", "c": ["CP0", "CP1", "CP2", "CP3"], "p": "produced"}
    kit.once("p0", "p1", "p2", "p3", "cP0", "cP1", "cP2", "cP3", "w")


async def test_an_asyncio_event_set_after_a_durable_wait_in_another_branch(
    make_app: MakeApp,
) -> None:
    app = make_app()
    kit = Kit(app)

    @app.workflow()
    async def relay() -> list[str]:
        ready = asyncio.Event()
        box: list[str] = []

        async def receiver() -> str:
            payload = await tether.wait_for_event("in")
            box.append(await kit.work(f"got-{payload}"))
            ready.set()
            return "received"

        async def sender() -> str:
            await ready.wait()  # waits on another task: the run may suspend under it
            return await kit.work(f"send-{box[0]}")

        got = await asyncio.gather(sender(), receiver())
        return list(got)

    async with app:
        handle = await app.start(relay, id="relay")
        await until_status(handle, RunStatus.WAITING)
        await app.send("relay", "in", "x")
        assert await outcome(handle) == ["SEND-GOT-X", "received"]
    kit.once("got-x", "send-GOT-X")


# -- cancellation and tasks left behind ---------------------------------------------------------


async def test_a_branch_cancelled_by_the_workflow_after_another_completes(
    make_app: MakeApp,
) -> None:
    app = make_app()
    kit = Kit(app)

    async def loser() -> str:
        await kit.work("l1", delay=0.3)
        return await kit.work("l2", delay=0.3)

    @app.workflow()
    async def cancel_one() -> list[str]:
        winner = asyncio.create_task(kit.work("win", delay=0.02))
        other = asyncio.create_task(loser())
        first = await winner
        other.cancel()
        try:
            await other
            how = "finished"
        except asyncio.CancelledError:
            how = "cancelled"
        after = await kit.work("after")
        await tether.sleep(SUSPEND)
        return [first, after, how]

    async with app:
        result = await outcome(await app.start(cancel_one, id="cancel-one"))
    assert result == ["WIN", "AFTER", "cancelled"]
    assert kit.ran["win"] == kit.ran["after"] == 1
    assert kit.ran["l2"] == 0
    assert kit.ran["l1"] <= 1  # forced replay lets l1 finish


async def test_a_task_cancelled_before_its_first_turn_on_replay(make_app: MakeApp) -> None:
    app = make_app()
    kit = Kit(app)

    async def side() -> str:
        await kit.work("side", delay=0.001)
        await tether.wait_for_event("never")
        return "unreachable"

    @app.workflow()
    async def early_cancel() -> str:
        background = asyncio.create_task(side())
        got = await kit.work("main", delay=0.15)  # side() records its step meanwhile
        background.cancel()
        await tether.sleep(SUSPEND)  # suspends: the replay cancels side() before it runs
        return got

    async with app:
        assert await outcome(await app.start(early_cancel, id="early")) == "MAIN"
    kit.once("side", "main")


async def test_a_workflow_returning_while_a_fire_and_forget_task_runs_steps(
    make_app: MakeApp,
) -> None:
    """A replay (forced, or after a crash once both tasks recorded a step) hands the root's
    recorded step back only after the task's, which came first: the task's step is asked for
    again before the root returns."""
    app = make_app()
    kit = Kit(app)

    async def chores() -> None:
        await kit.work("bg1", delay=0.001)
        await kit.work("bg2", delay=0.5)  # still running when the workflow returns

    @app.workflow()
    async def fire_and_forget() -> str:
        asyncio.create_task(chores())  # noqa: RUF006
        return await kit.work("fg", delay=0.05)

    async with app:
        assert await outcome(await app.start(fire_and_forget, id="ff")) == "FG"
    assert kit.ran["bg1"] == 1
    assert kit.ran["fg"] == 1
    assert kit.ran["bg2"] <= 1  # cancelled with the task (forced replay lets it finish)


# -- waits in several tasks ---------------------------------------------------------------------


async def test_event_waits_with_timeouts_in_several_branches(make_app: MakeApp) -> None:
    app = make_app()
    ms = timedelta(milliseconds=1)

    @app.workflow()
    async def timeouts() -> list[object]:
        got = await asyncio.gather(
            tether.wait_for_event("a", timeout=100 * ms),  # times out first
            tether.wait_for_event("b", timeout=8000 * ms),  # sent once a and c timed out
            tether.wait_for_event("c", timeout=250 * ms),  # times out second
            tether.wait_for_event("d", timeout=8000 * ms),  # sent at once
        )
        return list(got)

    async with app:
        handle = await app.start(timeouts, id="timeouts")
        await app.send("timeouts", "d", "dee")

        async def timed_out() -> set[str]:
            return {c.name for c in await handle.checkpoints()
                    if c.status is CheckpointStatus.COMPLETED}  # fmt: skip

        async with asyncio.timeout(10):
            while not {"event:a@0", "event:c@2"} <= await timed_out():
                await asyncio.sleep(0.01)
        assert await handle.status() is not RunStatus.SUCCEEDED
        await app.send("timeouts", "b", "bee")
        assert await outcome(handle) == [None, "bee", None, "dee"]
        done = {c.name: c.result for c in await handle.checkpoints()}
    assert done["event:a@0"] == done["event:c@2"] == '{"key": "tether:timeout", "value": null}'


async def test_events_sent_before_the_run_ever_waits(make_app: MakeApp) -> None:
    app = make_app()
    kit = Kit(app)

    @app.workflow()
    async def early() -> dict[str, object]:
        gate = await kit.work("gate", delay=0.05)

        async def twice() -> list[object]:
            return [await tether.wait_for_event("x"), await tether.wait_for_event("x")]

        got = await asyncio.gather(
            twice(), tether.wait_for_event("y"), tether.wait_for_event("z"),
            tether.wait_for_event("z"),
        )  # fmt: skip
        await tether.sleep(SUSPEND)
        return {"gate": gate, "x": got[0], "y": got[1], "z": sorted(got[2:])}  # type: ignore[type-var]

    # Started and sent to before any worker runs: every event is in the mailbox first.
    handle = await app.start(early, id="early-events")
    for key, payload in [("z", "z1"), ("x", "x1"), ("y", "why"), ("x", "x2"), ("z", "z2"),
                         ("x", "x3")]:  # fmt: skip
        await app.send("early-events", key, payload)
    async with app:
        result = await outcome(handle)
    assert result == {"gate": "GATE", "x": ["x1", "x2"], "y": "why", "z": ["z1", "z2"]}
    kit.once("gate")


async def test_two_approvals_asked_at_once_in_two_branches(make_app: MakeApp) -> None:
    app = make_app()
    kit = Kit(app)

    @app.workflow()
    async def two_asks() -> list[str]:
        async def ask(i: int) -> str:
            decision = await tether.approval(f"Ship {i}?", reviewers=["ann"],
                                             operation={"tool": "ship", "i": i})  # fmt: skip
            if not decision.approved:
                return f"{i}:{decision.status}"
            return f"{i}:{decision.status}:{await kit.work(f'ship{i}')}"

        return list(await asyncio.gather(ask(0), ask(1)))

    async with app:
        handle = await app.start(two_asks, id="asks")
        asked = {a.title: a for a in await approvals(app, "asks", 2)}
        assert sorted(asked) == ["Ship 0?", "Ship 1?"]
        assert len({a.id for a in asked.values()}) == 2
        one, zero = asked["Ship 1?"], asked["Ship 0?"]
        await app.decide(one.id, "approve", reviewer="ann", operation_digest=one.operation_digest)
        await until(lambda: kit.ran["ship1"] == 1)  # its branch goes on; the other waits
        assert not (await handle.status()).terminal
        await app.decide(zero.id, "reject", reviewer="ann", operation_digest=zero.operation_digest)
        assert await outcome(handle) == ["0:rejected", "1:approved:SHIP1"]
        assert len(await app.list_approvals(status=None, run_id="asks")) == 2  # never re-asked
    kit.once("ship1")


async def test_child_runs_raced_with_events_by_wait_any_in_two_branches(
    make_app: MakeApp,
) -> None:
    app = make_app()
    kit = Kit(app)

    @app.workflow()
    async def kid(tag: str, hold: bool) -> str:
        if hold:
            await tether.wait_for_event("release")
        return await kit.work(tag, delay=0.02)

    @app.workflow()
    async def racer() -> list[str]:
        async def race(i: int, hold: bool) -> str:
            child = await tether.start_child(kid, f"k{i}", hold)
            won = await tether.wait_any({"child": child, "stop": tether.event(f"stop{i}")},
                                        timeout=timedelta(seconds=30))  # fmt: skip
            return f"{won.name}:{won.value}"

        got = await asyncio.gather(race(0, False), race(1, True))
        await tether.sleep(SUSPEND)
        return list(got)

    async with app:
        handle = await app.start(racer, id="racer")
        await app.send("racer", "stop1", "halt")
        assert await outcome(handle) == ["child:K0", "stop:halt"]
        kids = sorted(r.id for r in await app.list_runs(workflow="kid"))
        assert kids == ["racer/child:kid@0", "racer/child:kid@1"]
        held = await app.get("racer/child:kid@1")
        assert not (await held.status()).terminal  # the race's loser goes on
        await app.send("racer/child:kid@1", "release")
        assert await outcome(held) == "K1"
    kit.once("k0", "k1")


# -- recorded helpers and patches in tasks ------------------------------------------------------


async def test_recorded_helpers_in_branches_replay_to_their_own_values(make_app: MakeApp) -> None:
    app = make_app()
    seen: list[str] = []

    @app.step()
    async def echo(value: str, delay: float) -> str:
        await asyncio.sleep(delay)
        seen.append(value)
        return value

    async def branch(i: int) -> str:
        u = tether.uuid4()
        when = tether.now()
        r = tether.random()
        await asyncio.sleep(0)  # the branches interleave between helpers and steps
        first = await echo(f"{i}:{u}", 0.004 * (5 - i))  # diverges on replay if u changed
        return await echo(f"{first}|{when.isoformat()}|{r}|{tether.uuid4()}", 0.002 * i)

    @app.workflow()
    async def helpers() -> list[str]:
        top = str(tether.uuid4())
        got = await asyncio.gather(*(branch(i) for i in range(5)))
        await tether.sleep(SUSPEND)
        return [top, *got]

    async with app:
        handle = await app.start(helpers, id="helpers")
        result = await outcome(handle)
        kinds = Counter(c.kind for c in await handle.checkpoints())
    assert len(seen) == 10, seen  # each body once
    assert len(set(seen)) == 10, seen
    assert sorted(result[1:]) == sorted(v for v in seen if "|" in v)
    assert [v.split(":")[0] for v in result[1:]] == ["0", "1", "2", "3", "4"]
    assert len(set(result)) == 6
    assert kinds == {"uuid4": 11, "now": 5, "random": 5, "step": 10, "sleep": 1}


async def test_a_recorded_helper_queued_just_before_every_task_waits(make_app: MakeApp) -> None:
    """A helper queued (not yet written) when the run suspends as a whole is written with the
    suspension, and replays to the value the branch saw."""
    app = make_app()
    kit = Kit(app)
    seen: list[str] = []

    @app.step()
    async def use(value: str) -> str:
        seen.append(value)
        return value

    @app.workflow()
    async def queued() -> list[str]:
        handoff: asyncio.Queue[str] = asyncio.Queue()
        go = asyncio.Event()

        async def late_helper() -> str:
            tag = await handoff.get()
            u = str(tether.uuid4())  # queued after the other branch's last write
            await go.wait()
            return await use(f"{tag}:{u}")

        async def waiter() -> None:
            handoff.put_nowait(await kit.work("w"))
            await tether.wait_for_event("go")
            go.set()

        got, _ = await asyncio.gather(late_helper(), waiter())
        return [got]

    async with app:
        handle = await app.start(queued, id="queued")
        await until_status(handle, RunStatus.WAITING, seconds=2)
        await app.send("queued", "go")
        result = await outcome(handle)
    assert len(seen) == 1
    assert result == seen
    assert seen[0].startswith("W:")
    kit.once("w")


async def test_patched_in_several_branches_of_a_new_run(make_app: MakeApp) -> None:
    app = make_app()
    kit = Kit(app)

    async def branch(i: int) -> str:
        if tether.patched("v2"):
            return await kit.work(f"new{i}", delay=0.003 * (3 - i))
        return await kit.work(f"old{i}")

    @app.workflow()
    async def patched() -> list[str]:
        got = await asyncio.gather(branch(0), branch(1), branch(2))
        await tether.sleep(SUSPEND)
        return list(got)

    async with app:
        handle = await app.start(patched, id="patched")
        assert await outcome(handle) == ["NEW0", "NEW1", "NEW2"]
        marks = sorted(c.name for c in await handle.checkpoints() if c.kind == "patch")
    assert marks == ["patch:v2@0", "patch:v2@1", "patch:v2@2"]
    kit.once("new0", "new1", "new2")


@pytest.mark.parametrize("shape", ["sequential", "gather"])
async def test_patched_in_a_branch_replaying_a_history_from_before_the_change(
    make_app: MakeApp, shape: str, request: pytest.FixtureRequest
) -> None:
    """Old code: two branches each run a step, then the root runs a step and waits. New code
    adds a patched step at the end of each branch. The run's history shows the branches were
    past that point (the root's step came after them), so `patched` must be False."""
    ran: Counter[str] = Counter()

    def deploy(app: tether.App, new: bool) -> None:
        @app.step()
        async def work(tag: str) -> str:
            ran[tag] += 1
            await asyncio.sleep(0.01 if tag == "b0" else 0.0)
            return tag.upper()

        async def branch(i: int) -> str:
            got = await work(f"b{i}")
            if new and tether.patched("extra"):
                got += await work(f"extra{i}")
            return got

        @app.workflow(name="pw")
        async def pw() -> list[str]:
            if shape == "gather":
                got = list(await asyncio.gather(branch(0), branch(1)))
            else:
                got = [await branch(0), await branch(1)]
            after = await work("after")
            await tether.wait_for_event("go")
            return [*got, after]

    old = make_app()
    deploy(old, new=False)
    async with old:
        handle = await old.start("pw", id="pw")
        await until_status(handle, RunStatus.WAITING)
    new = make_app()
    deploy(new, new=True)
    async with new:
        await new.send("pw", "go")
        assert await outcome(await new.get("pw")) == ["B0", "B1", "AFTER"]
    assert ran == {"b0": 1, "b1": 1, "after": 1}


# -- when the run suspends ----------------------------------------------------------------------

HOWS = ["await-task", "gather", "task-group", "asyncio-wait"]


async def _awaited(how: str, step: Any) -> str:
    """Await a step call the way `how` says."""
    if how == "await-task":
        return await asyncio.create_task(step)  # type: ignore[no-any-return]
    if how == "gather":
        [got] = await asyncio.gather(step)
        return got  # type: ignore[no-any-return]
    if how == "task-group":
        async with asyncio.TaskGroup() as group:
            task = group.create_task(step)
    else:
        task = asyncio.create_task(step)
        await asyncio.wait({task})
    return task.result()  # type: ignore[no-any-return]


@pytest.mark.parametrize("how", HOWS)
async def test_a_step_ending_beside_a_parked_wait_lets_the_workflow_go_on(
    make_app: MakeApp, how: str, request: pytest.FixtureRequest
) -> None:
    """One task waits for an event that only comes later; the root awaits a step (that ends
    past the inline hold) and then runs another one. The run must not suspend while the root
    can go on: the second step runs before the event is sent."""
    app = make_app()
    kit = Kit(app)

    @app.workflow()
    async def beside() -> list[str]:
        waiter = asyncio.create_task(tether.wait_for_event("late"))
        first = await _awaited(how, kit.work("slow", delay=0.12))
        second = await kit.work("next")
        return [first, second, await waiter]

    async with app:
        handle = await app.start(beside, id="beside")
        await until(lambda: kit.ran["slow"] == 1)
        try:
            await until(lambda: kit.ran["next"] == 1, seconds=0.7)
        finally:
            await app.send("beside", "late", "ok")
        assert await outcome(handle) == ["SLOW", "NEXT", "ok"]
    kit.once("slow", "next")


@pytest.mark.parametrize("how", HOWS)
async def test_replaying_steps_awaited_beside_a_parked_wait_is_no_divergence(
    make_app: MakeApp, how: str, request: pytest.FixtureRequest
) -> None:
    """The same shape with quick steps (no suspension before the root waits for the event):
    the replay after the event must succeed."""
    app = make_app()
    kit = Kit(app)

    @app.workflow()
    async def beside() -> list[str]:
        waiter = asyncio.create_task(tether.wait_for_event("late"))
        first = await _awaited(how, kit.work("quick", delay=0.001))
        second = await kit.work("next", delay=0.001)
        return [first, second, await waiter]

    async with app:
        handle = await app.start(beside, id="beside")
        if await until_status(handle, RunStatus.WAITING, *ENDED) is RunStatus.WAITING:
            await app.send("beside", "late", "ok")
        assert await outcome(handle) == ["QUICK", "NEXT", "ok"]
    kit.once("quick", "next")

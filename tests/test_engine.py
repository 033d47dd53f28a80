"""The engine on every backend, in normal and forced-replay mode: steps, checkpoints, replay,
retries, idempotency, at-most-once steps, leases, cancellation."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import tether
from tether.store.port import CheckpointStatus, Lease, NewRun, RunStatus

MakeApp = Callable[..., tether.App]
FAST = tether.Retry(max_attempts=3, initial_delay=timedelta(milliseconds=1), jitter=0)


async def wait_for_status(app: tether.App, run_id: str, status: RunStatus) -> None:
    async with asyncio.timeout(10):
        while (await (await app.get(run_id)).status()) != status:
            await asyncio.sleep(0.01)


async def test_result_of_a_run_executing_here_waits_for_its_end_without_reading_it(
    make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process executing a run is told of its end: result() does not read the run's row
    first (one read per run saved), and still returns its result."""
    app = make_app()
    release = asyncio.Event()

    @app.step()
    async def held() -> int:
        await release.wait()
        return 7

    @app.workflow()
    async def flow() -> int:
        return await held() + 1

    async with app:
        reads: list[str] = []
        get_run = app.engine.store.get_run

        async def counted(run_id: str) -> object:
            reads.append(run_id)
            return await get_run(run_id)

        monkeypatch.setattr(app.engine.store, "get_run", counted)
        handle = await app.start(flow, id="here")
        waiting = asyncio.create_task(handle.result())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        assert reads == []
        release.set()
        assert await waiting == 8
        assert reads == []


async def test_result_of_a_run_that_already_ended_here_reads_it_at_once(
    make_app: MakeApp,
) -> None:
    """Its end came before the caller waited: result() reads the row at once rather than
    waiting for a wake-up that already happened (or for its poll, a quarter second)."""
    app = make_app()

    @app.step()
    async def one() -> int:
        return 1

    @app.workflow()
    async def flow() -> int:
        return await one()

    async with app:
        handle = await app.start(flow, id="ended")
        await wait_for_status(app, "ended", RunStatus.SUCCEEDED)
        # The row can show the end before the task that wrote it has read its answer and let
        # the run go: wait for that too, so the end is over here before the caller waits.
        async with asyncio.timeout(10):
            while app.engine.executing_here("ended"):
                await asyncio.sleep(0.001)
        async with asyncio.timeout(0.2):
            assert await handle.result() == 1


async def test_workflow_runs_its_steps_and_returns_their_result(make_app: MakeApp) -> None:
    app = make_app()

    @app.step()
    async def double(x: int) -> int:
        return 2 * x

    @app.step()
    def add(a: int, b: int) -> int:  # a sync step runs in a thread
        return a + b

    @app.workflow()
    async def pipeline(x: int) -> dict[str, int]:
        y = await double(x)
        z = await add(y, 1)
        return {"y": y, "z": z}

    async with app:
        handle = await app.start(pipeline, 20, id="r1")
        assert await handle.result() == {"y": 40, "z": 41}
        assert await handle.status() == RunStatus.SUCCEEDED
        names = [c.name for c in await handle.checkpoints()]
        assert names == ["double", "add"]


async def test_result_waits_across_several_polls_for_a_run_that_takes_a_while(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.step()
    async def slow() -> str:
        await asyncio.sleep(0.6)  # longer than the handle's 0.25 s poll interval
        return "late"

    @app.workflow()
    async def flow() -> str:
        return await slow()

    async with app:
        handle = await app.start(flow)
        with pytest.raises(tether.WaitTimeout, match="goes on"):
            await handle.result(timeout=0.3)
        assert await handle.result(timeout=10) == "late"


async def test_repeated_steps_are_named_by_occurrence(make_app: MakeApp) -> None:
    app = make_app()

    @app.step()
    async def inc(x: int) -> int:
        return x + 1

    @app.workflow()
    async def count(n: int) -> int:
        x = 0
        for _ in range(n):
            x = await inc(x)
        return x

    async with app:
        handle = await app.start(count, 3)
        assert await handle.result() == 3
        cps = await handle.checkpoints()
        assert [c.name for c in cps] == ["inc", "inc#2", "inc#3"]
        assert [c.seq for c in cps] == [0, 1, 2]
        assert all(c.status is CheckpointStatus.COMPLETED for c in cps)


async def test_a_completed_step_is_not_executed_again_when_another_worker_resumes_the_run(
    make_app: MakeApp,
) -> None:
    calls: Counter[str] = Counter()
    gate = asyncio.Event()

    def register(app: tether.App, block: bool) -> tether.Workflow[[str], str]:
        @app.step()
        async def fetch(q: str) -> str:
            calls["fetch"] += 1
            return q.upper()

        @app.step()
        async def slow(x: str) -> str:
            calls["slow"] += 1
            if block:
                gate.set()
                await asyncio.sleep(3600)  # interrupted by the first app's shutdown
            return x + "!"

        @app.workflow()
        async def flow(q: str) -> str:
            a = await fetch(q)
            return await slow(a)

        return flow

    first = make_app()
    flow1 = register(first, block=True)
    async with first:
        await first.start(flow1, "hi", id="resume-me")
        await asyncio.wait_for(gate.wait(), 10)
    # The first worker stopped mid-step: its run was released with one checkpoint recorded.
    second = make_app()
    flow2 = register(second, block=False)
    async with second:
        handle = await second.get("resume-me")
        assert await handle.result(timeout=10) == "HI!"
    assert calls["fetch"] == 1
    assert calls["slow"] == 2  # interrupted once (at-least-once), then completed
    assert flow2.name == flow1.name


async def test_a_changed_step_sequence_holds_the_run_and_a_rollback_finishes_it(
    make_app: MakeApp,
) -> None:
    gate = asyncio.Event()
    done: list[str] = []

    def v1(app: tether.App, *, slow: bool) -> tether.Workflow[[], int]:
        @app.step()
        async def a() -> int:
            done.append("a")
            return 1

        @app.step()
        async def wait_here() -> int:
            gate.set()
            if slow:
                await asyncio.sleep(3600)
            done.append("wait_here")
            return 2

        @app.workflow(name="flow")
        async def flow_v1() -> int:
            return await a() + await wait_here()

        return flow_v1

    first = make_app()
    flow_v1 = v1(first, slow=True)
    async with first:
        await first.start(flow_v1, id="nd")
        await asyncio.wait_for(gate.wait(), 10)

    second = make_app()

    @second.step()
    async def b() -> int:  # the new code calls another step first
        return 10

    @second.workflow(name="flow")
    async def flow_v2() -> int:
        return await b()

    async with second:
        handle = await second.get("nd")
        async with asyncio.timeout(10):
            while (await handle.status()) is not RunStatus.HELD:
                await asyncio.sleep(0.01)
        with pytest.raises(tether.WaitTimeout):
            await handle.result(timeout=0.2)  # held is not an end: callers keep waiting
        run = await second.engine.store.get_run("nd")
    assert run is not None
    assert run.status is RunStatus.HELD
    assert run.finished_at is None
    error = json.loads(run.error or "{}")
    assert error["type"] == "tether.errors.NonDeterminismError"
    assert error["position"] == "0"
    assert "recorded 'a' at position 0" in error["message"]
    assert "this code asked for 'b'" in error["message"]
    assert "Recorded: ['a']" in error["message"]

    third = make_app()  # the bad deploy rolled back: the old code replays the run
    v1(third, slow=False)
    async with third:
        assert await (await third.get("nd")).result(timeout=10) == 3
    assert done == ["a", "wait_here"]  # `a` ran once, before the bad deploy


async def test_new_steps_appended_after_the_recorded_history_are_allowed(
    make_app: MakeApp,
) -> None:
    gate = asyncio.Event()
    first = make_app()

    @first.step()
    async def one() -> int:
        return 1

    @first.step()
    async def hang() -> int:
        gate.set()
        await asyncio.sleep(3600)
        return 0

    @first.workflow(name="flow")
    async def v1() -> int:
        await one()
        return await hang()

    async with first:
        await first.start(v1, id="append")
        await asyncio.wait_for(gate.wait(), 10)

    second = make_app()

    @second.step()
    async def one_again() -> int:  # same recorded name, the body must not run
        raise AssertionError("a recorded step ran again")

    one_again.name = "one"

    @second.step()
    async def two() -> int:
        return 2

    @second.workflow(name="flow")
    async def v2() -> int:
        return await one_again() + await two()

    async with second:
        assert await (await second.get("append")).result(timeout=10) == 3


async def test_recorded_helpers_return_the_same_values_after_a_restart(
    make_app: MakeApp,
) -> None:
    gate = asyncio.Event()
    seen: list[tuple[str, str, float]] = []

    def register(app: tether.App, block: bool) -> None:
        @app.step()
        async def pause(x: str) -> str:
            if block:
                gate.set()
                await asyncio.sleep(3600)
            return x

        @app.workflow()
        async def helpers() -> list[object]:
            stamp = tether.now()
            token = tether.uuid4()
            r = tether.random()
            seen.append((stamp.isoformat(), str(token), r))
            await pause("x")
            return [stamp.isoformat(), str(token), r]

    first = make_app()
    register(first, block=True)
    async with first:
        await first.start("helpers", id="h")
        await asyncio.wait_for(gate.wait(), 10)
    second = make_app()
    register(second, block=False)
    async with second:
        result = await (await second.get("h")).result(timeout=10)
    assert len({s for s in seen}) == 1, seen  # every execution saw the same values
    assert result == list(seen[0])
    assert 0 <= seen[0][2] < 1


async def test_a_failing_step_is_retried_and_its_attempts_recorded(make_app: MakeApp) -> None:
    app = make_app()
    attempts = Counter[str]()

    @app.step(retry=FAST)
    async def flaky() -> str:
        attempts["flaky"] += 1
        if attempts["flaky"] < 3:
            raise ConnectionResetError("try again")
        return "ok"

    @app.workflow()
    async def flow() -> str:
        return await flaky()

    async with app:
        handle = await app.start(flow)
        assert await handle.result(timeout=10) == "ok"
        [cp] = await handle.checkpoints()
        assert cp.attempts == 3
    assert attempts["flaky"] == 3


async def test_permanent_errors_and_unlisted_errors_are_not_retried(make_app: MakeApp) -> None:
    app = make_app()
    calls = Counter[str]()

    @app.step(retry=FAST)
    async def refuse() -> None:
        calls["refuse"] += 1
        raise tether.PermanentError("card declined")

    @app.step(
        retry=tether.Retry(max_attempts=5, initial_delay=timedelta(0), retry_on=(TimeoutError,))
    )
    async def wrong() -> None:
        calls["wrong"] += 1
        raise KeyError("not retried: only TimeoutError is")

    @app.workflow()
    async def flow(which: str) -> None:
        await (refuse() if which == "refuse" else wrong())

    async with app:
        with pytest.raises(tether.RunFailed) as one:
            await (await app.start(flow, "refuse")).result(timeout=10)
        with pytest.raises(tether.RunFailed) as two:
            await (await app.start(flow, "wrong")).result(timeout=10)
    assert one.value.error["type"] == "tether.errors.PermanentError"
    assert two.value.error["type"] == "KeyError"
    assert calls == {"refuse": 1, "wrong": 1}


async def test_exhausted_retries_fail_the_run_with_the_last_error(make_app: MakeApp) -> None:
    app = make_app()
    calls = Counter[str]()

    @app.step(retry=FAST)
    async def broken() -> None:
        calls["broken"] += 1
        raise ValueError(f"attempt {calls['broken']}")

    @app.workflow()
    async def flow() -> None:
        await broken()

    async with app:
        handle = await app.start(flow)
        with pytest.raises(tether.RunFailed, match="ValueError: attempt 3"):
            await handle.result(timeout=10)
        [cp] = await handle.checkpoints()
    assert calls["broken"] == 3
    assert cp.status is CheckpointStatus.FAILED
    assert cp.attempts == 3
    assert json.loads(cp.error or "{}")["message"] == "attempt 3"


async def test_a_recorded_step_error_is_raised_again_on_replay_without_running_the_step(
    make_app: MakeApp,
) -> None:
    calls = Counter[str]()
    gate = asyncio.Event()

    def register(app: tether.App, block: bool) -> None:
        @app.step(retry=tether.NO_RETRY)
        async def lookup(key: str) -> str:
            calls["lookup"] += 1
            raise LookupError(f"no {key}")

        @app.step()
        async def hang() -> None:
            if block:
                gate.set()
                await asyncio.sleep(3600)

        @app.workflow()
        async def flow() -> str:
            try:
                await lookup("k")
            except LookupError as exc:
                outcome = f"handled {exc}"
            await hang()
            return outcome

    first = make_app()
    register(first, block=True)
    async with first:
        await first.start("flow", id="err")
        await asyncio.wait_for(gate.wait(), 10)
    second = make_app()
    register(second, block=False)
    async with second:
        assert await (await second.get("err")).result(timeout=10) == "handled no k"
    assert calls["lookup"] == 1


async def test_a_long_retry_delay_releases_the_run_and_keeps_the_attempt_count(
    make_app: MakeApp,
) -> None:
    app = make_app()
    calls = Counter[str]()

    @app.step(
        retry=tether.Retry(
            max_attempts=3, initial_delay=timedelta(milliseconds=300), backoff=1, jitter=0
        )
    )
    async def flaky() -> int:
        calls["flaky"] += 1
        if calls["flaky"] < 3:
            raise OSError("busy")
        return calls["flaky"]

    @app.workflow()
    async def flow() -> int:
        return await flaky()

    async with app:
        handle = await app.start(flow)
        # 300 ms is over the 50 ms the test settings allow in-process: the run waits released.
        await wait_for_status(app, handle.id, RunStatus.WAITING)
        [cp] = await handle.checkpoints()
        assert cp.status is CheckpointStatus.RETRYING
        assert cp.attempts == 1
        assert cp.retry_at is not None
        assert cp.started_at is not None
        assert cp.retry_at - cp.started_at >= 0.3
        assert await handle.result(timeout=10) == 3
        [cp] = await handle.checkpoints()
        assert cp.attempts == 3


async def test_a_step_that_runs_past_its_timeout_fails_with_step_timeout(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.step(timeout=timedelta(milliseconds=20), retry=tether.NO_RETRY)
    async def slow() -> None:
        await asyncio.sleep(10)

    @app.workflow()
    async def flow() -> None:
        await slow()

    async with app:
        with pytest.raises(tether.RunFailed) as info:
            await (await app.start(flow)).result(timeout=10)
    assert info.value.error["type"] == "tether.errors.StepTimeout"
    assert "ran past its timeout" in info.value.error["message"]


async def test_idempotency_key_is_stable_across_attempts_and_distinct_per_step_and_run(
    make_app: MakeApp,
) -> None:
    app = make_app()
    keys: list[tuple[str, str]] = []

    @app.step(retry=FAST)
    async def effect(tag: str) -> str:
        keys.append((tag, tether.idempotency_key()))
        if sum(1 for t, _ in keys if t == tag) == 1:
            raise OSError("first attempt fails")
        return tether.idempotency_key()

    @app.step()
    def sync_effect() -> str:
        return tether.idempotency_key()

    @app.workflow()
    async def flow() -> list[str]:
        return [await effect("a"), await effect("b"), await sync_effect()]

    async with app:
        r1 = await (await app.start(flow, id="k1")).result(timeout=10)
        r2 = await (await app.start(flow, id="k2")).result(timeout=10)
    by_tag: dict[str, set[str]] = {}
    for tag, key in keys:
        by_tag.setdefault(tag, set()).add(key)
    assert all(len(v) == 2 for v in by_tag.values())  # one key per step of each run
    assert len(set(r1) | set(r2)) == 6  # different for every step and run
    assert all(k.startswith("tether-") for k in r1)
    with pytest.raises(tether.NotInWorkflow):
        tether.idempotency_key()


async def test_at_most_once_step_interrupted_is_reconciled_not_rerun(make_app: MakeApp) -> None:
    gate = asyncio.Event()
    effects: list[str] = []
    seen_keys: list[str] = []

    def register(app: tether.App, block: bool) -> None:
        def lookup(amount: int) -> object:
            seen_keys.append(tether.idempotency_key())
            found = [e for e in effects if e == tether.idempotency_key()]
            return {"refund": amount, "found": True} if found else tether.NOT_DONE

        @app.step(at_most_once=True, reconcile=lookup, timeout=timedelta(seconds=10))
        async def refund(amount: int) -> dict[str, object]:
            effects.append(tether.idempotency_key())
            if block:
                gate.set()
                await asyncio.sleep(3600)
            return {"refund": amount, "found": False}

        @app.workflow()
        async def flow() -> dict[str, object]:
            return await refund(5)

    first = make_app()
    register(first, block=True)
    async with first:
        await first.start("flow", id="amo")
        await asyncio.wait_for(gate.wait(), 10)
    second = make_app()
    register(second, block=False)
    async with second:
        result = await (await second.get("amo")).result(timeout=10)
    assert result == {"refund": 5, "found": True}
    assert len(effects) == 1  # the body never ran a second time
    assert seen_keys == effects


async def test_at_most_once_step_without_reconcile_fails_with_outcome_unknown(
    make_app: MakeApp,
) -> None:
    gate = asyncio.Event()
    calls = Counter[str]()

    def register(app: tether.App, block: bool) -> None:
        @app.step(at_most_once=True, timeout=timedelta(seconds=10))
        async def publish() -> str:
            calls["publish"] += 1
            if block:
                gate.set()
                await asyncio.sleep(3600)
            return "published"

        @app.workflow()
        async def flow() -> str:
            return await publish()

    first = make_app()
    register(first, block=True)
    async with first:
        await first.start("flow", id="unknown")
        await asyncio.wait_for(gate.wait(), 10)
    second = make_app()
    register(second, block=False)
    async with second:
        with pytest.raises(tether.RunFailed) as info:
            await (await second.get("unknown")).result(timeout=10)
    assert info.value.error["type"] == "tether.errors.StepOutcomeUnknown"
    assert "idempotency key tether-" in info.value.error["message"]
    assert calls["publish"] == 1


async def test_starting_an_existing_id_returns_that_run_and_other_arguments_conflict(
    make_app: MakeApp,
) -> None:
    app = make_app()
    calls = Counter[str]()

    @app.step()
    async def work(x: dict[str, int]) -> int:
        calls["work"] += 1
        return sum(x.values())

    @app.workflow()
    async def flow(x: dict[str, int]) -> int:
        return await work(x)

    async with app:
        h1 = await app.start(flow, {"a": 1, "b": 2}, id="same")
        h2 = await app.start(flow, {"b": 2, "a": 1}, id="same")  # same arguments, other order
        assert h1.id == h2.id == "same"
        assert await h2.result(timeout=10) == 3
        with pytest.raises(tether.IdempotencyConflict, match="same"):
            await app.start(flow, {"a": 5}, id="same")
        assert len(await app.list_runs()) == 1
    assert calls["work"] == 1


async def test_a_payload_over_the_limit_is_refused_before_any_write(make_app: MakeApp) -> None:
    app = make_app(max_payload=1000)

    @app.step()
    async def big() -> str:
        return "x" * 2000

    @app.workflow()
    async def flow(data: str) -> str:
        return await big()

    async with app:
        with pytest.raises(tether.PayloadTooLarge):
            await app.start(flow, "y" * 2000, id="too-big")
        assert await app.list_runs() == []
        handle = await app.start(flow, "small")
        with pytest.raises(tether.RunFailed, match="PayloadTooLarge"):
            await handle.result(timeout=10)


async def test_an_unserializable_result_fails_the_step_clearly_and_the_worker_goes_on(
    make_app: MakeApp,
) -> None:
    app = make_app()
    calls = Counter[str]()

    @app.step(retry=FAST)
    async def opaque() -> object:
        calls["opaque"] += 1
        return object()

    @app.step()
    async def fine() -> int:
        return 7

    @app.workflow()
    async def bad() -> object:
        return await opaque()

    @app.workflow()
    async def good() -> int:
        return await fine()

    async with app:
        with pytest.raises(tether.RunFailed) as info:
            await (await app.start(bad)).result(timeout=10)
        assert await (await app.start(good)).result(timeout=10) == 7
    assert info.value.error["type"] == "tether.errors.SerializationError"
    assert "object" in info.value.error["message"]
    assert calls["opaque"] == 1  # the same value fails the same way: not retried


@dataclass
class Report:
    title: str
    pages: int


async def test_dataclass_arguments_and_results_are_rebuilt_from_type_hints(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.step()
    async def write(title: str) -> Report:
        return Report(title, 3)

    @app.workflow()
    async def flow(seed: Report) -> Report:
        assert isinstance(seed, Report)
        report = await write(seed.title)
        assert isinstance(report, Report)
        return Report(report.title, report.pages + seed.pages)

    async with app:
        assert await (await app.start(flow, Report("t", 1))).result(timeout=10) == Report("t", 4)


async def test_cancelling_a_running_run_interrupts_its_step_and_ends_it_cancelled(
    make_app: MakeApp,
) -> None:
    app = make_app()
    started = asyncio.Event()
    interrupted = asyncio.Event()

    @app.step()
    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            interrupted.set()
            raise

    @app.workflow()
    async def flow() -> None:
        await forever()

    async with app:
        handle = await app.start(flow)
        await asyncio.wait_for(started.wait(), 10)
        await handle.cancel()
        with pytest.raises(tether.RunCancelled):
            await handle.result(timeout=10)
        assert interrupted.is_set()
        assert await handle.status() == RunStatus.CANCELLED


async def test_cancelling_a_pending_run_ends_it_before_it_starts(make_app: MakeApp) -> None:
    app = make_app()

    @app.workflow()
    async def flow() -> None:
        raise AssertionError("a cancelled run must not start")

    handle = await app.start(flow)  # no worker yet: the run waits as pending
    await handle.cancel()
    async with app:
        with pytest.raises(tether.RunCancelled):
            await handle.result(timeout=10)


async def test_a_worker_that_lost_its_lease_stops_and_the_new_owner_finishes(
    make_app: MakeApp,
) -> None:
    first, second = make_app(), make_app()
    entered = asyncio.Event()
    release = asyncio.Event()
    bodies = Counter[str]()

    for app in (first, second):

        @app.step()
        async def step_one() -> str:
            bodies["one"] += 1
            if bodies["one"] == 1:  # the first owner's body hangs until after the takeover
                entered.set()
                await release.wait()
            return "done"

        @app.workflow(name="flow")
        async def flow() -> str:
            return await step_one()

    async with first:
        await first.start("flow", id="fenced")
        await asyncio.wait_for(entered.wait(), 10)
        # Another worker takes the run over (as after an expired lease): epoch goes up. Then
        # it is released again, for whichever worker claims it next (the first one too).
        store = second.engine.store
        await second.open()
        run = await store.get_run("fenced")
        assert run is not None
        assert run.owner is not None
        now = first.engine.clock.now()
        [taken] = await store.claim_runs("thief", ["flow"], now + 3600, now + 3601, 1)
        assert taken.epoch == run.epoch + 1
        await store.release_worker("thief", 0.0)
        async with second:
            assert await (await second.get("fenced")).result(timeout=10) == "done"
            release.set()  # now the old owner's step finishes and tries to record
            old_worker = first.engine.worker
            assert old_worker is not None
            async with asyncio.timeout(10):  # the old owner learns it lost the run and stops
                while "fenced" in old_worker.runners:
                    await asyncio.sleep(0.01)
            cps = await (await second.get("fenced")).checkpoints()
    assert bodies["one"] == 2  # at-least-once: the first body's outcome was fenced off
    assert [c.name for c in cps] == ["step_one"]
    assert run.epoch == 1


async def test_the_old_lease_is_rejected_by_the_store_after_a_takeover(make_app: MakeApp) -> None:
    app = make_app()
    await app.open()
    store = app.engine.store
    await store.create_run(NewRun("x", "wf", "{}"), 1.0, owner="w1", lease_until=2.0)
    [claimed] = await store.claim_runs("w2", ["wf"], 3.0, 20.0, 10)
    assert claimed.epoch == 2
    with pytest.raises(tether.LeaseLost, match="w1"):
        await store.finish_run(Lease("x", "w1", 1), RunStatus.SUCCEEDED, "1", None, 4.0)


async def test_a_workflow_past_its_timeout_fails_with_workflow_timeout(make_app: MakeApp) -> None:
    app = make_app()

    @app.step()
    async def slow() -> None:
        await asyncio.sleep(10)

    @app.workflow(timeout=timedelta(milliseconds=100))
    async def flow() -> None:
        await slow()

    async with app:
        with pytest.raises(tether.RunFailed, match="WorkflowTimeout"):
            await (await app.start(flow)).result(timeout=10)


async def test_a_run_that_timed_out_resumes_with_its_timeout_counted_from_the_resume(
    make_app: MakeApp,
) -> None:
    app = make_app()
    pause = 10.0

    @app.step()
    async def slow() -> str:
        await asyncio.sleep(pause)
        return "done"

    # Long enough for the resume below, a close and an open to fit in it on a loaded machine
    # (it counts from the resume); 300 ms did not always.
    @app.workflow(timeout=timedelta(milliseconds=1500))
    async def flow() -> str:
        return await slow()

    async with app:
        handle = await app.start(flow, id="timed-out")
        with pytest.raises(tether.RunFailed, match="WorkflowTimeout"):
            await handle.result(timeout=10)
    pause = 0.0  # the fix: the step is fast now
    # Resumed while no worker runs (the App open, its worker stopped), so what the resume
    # wrote is read before any worker can take the run.
    await app.open()
    try:
        resumed = await app.resume("timed-out")
        info = await resumed.info()
    finally:
        await app.close()
    assert info.status is tether.RunStatus.PENDING
    async with app:  # a worker again: the timeout counts from the resume, not from the start
        assert await (await app.get("timed-out")).result(timeout=10) == "done"


async def test_concurrent_steps_take_positions_in_call_order(make_app: MakeApp) -> None:
    app = make_app()

    @app.step()
    async def echo(x: int, delay: float) -> int:
        await asyncio.sleep(delay)
        return x

    @app.workflow()
    async def fan() -> list[int]:
        return list(await asyncio.gather(echo(1, 0.03), echo(2, 0.0), echo(3, 0.01)))

    async with app:
        handle = await app.start(fan)
        assert await handle.result(timeout=10) == [1, 2, 3]
        assert [c.name for c in await handle.checkpoints()] == ["echo", "echo#2", "echo#3"]


async def test_helpers_outside_a_workflow_raise_not_in_workflow() -> None:
    for helper in (tether.now, tether.uuid4, tether.random, tether.idempotency_key):
        with pytest.raises(tether.NotInWorkflow, match="inside"):
            helper()


async def test_a_step_awaited_outside_a_workflow_runs_as_a_plain_call() -> None:
    app = tether.App("memory://")

    @app.step()
    def add(a: int, b: int) -> int:
        return a + b

    assert await add(1, 2) == 3


def test_the_sync_twin_starts_runs_and_waits_for_results(tmp_path: object) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/sync.db")

    @app.step()
    def square(x: int) -> int:
        return x * x

    @app.workflow()
    async def flow(x: int) -> int:
        return await square(x) + await tether.wait_for_event("extra")

    with app.sync as client:
        handle = client.start(flow, 9, id="s1")
        client.send("s1", "extra", 0)
        assert handle.result(timeout=10) == 81
        assert handle.status() == RunStatus.SUCCEEDED
        assert [r.id for r in client.list_runs()] == ["s1"]
        assert client.get("s1").result() == 81


async def test_a_failed_run_resumes_after_a_fix_and_only_the_failed_step_runs_again(
    make_app: MakeApp,
) -> None:
    app = make_app()
    ran: list[str] = []
    fixed = False

    @app.step()
    async def fetch() -> int:
        ran.append("fetch")
        return 20

    @app.step(retry=tether.NO_RETRY)
    async def publish(n: int) -> int:
        ran.append("publish")
        if not fixed:
            raise ValueError("the endpoint is down")
        return n + 1

    @app.workflow()
    async def pipeline() -> int:
        return await publish(await fetch())

    async with app:
        handle = await app.start(pipeline, id="resumable")
        with pytest.raises(tether.RunFailed, match="the endpoint is down"):
            await handle.result(timeout=10)
        fixed = True
        resumed = await app.resume("resumable")
        assert await resumed.result(timeout=10) == 21
        with pytest.raises(
            tether.ConfigurationError, match="is succeeded; only a failed, dead or held run"
        ):
            await app.resume("resumable")
        with pytest.raises(tether.RunNotFound):
            await app.resume("nope")
        [fetched, published] = await handle.checkpoints()
    assert ran == ["fetch", "publish", "publish"]
    assert (fetched.name, fetched.attempts) == ("fetch", 1)
    assert (published.status, published.attempts) == (tether.CheckpointStatus.COMPLETED, 2)


async def test_resume_retries_only_the_failure_that_ended_the_run_not_a_caught_one(
    make_app: MakeApp,
) -> None:
    app = make_app()
    ran: list[str] = []
    fixed = False

    @app.step(retry=tether.NO_RETRY)
    async def lookup() -> str:
        ran.append("lookup")
        if fixed:  # after the fix it would succeed: a retry would change the recorded path
            return "found"
        raise LookupError("not there")

    @app.step(retry=tether.NO_RETRY)
    async def publish(how: str) -> str:
        ran.append(f"publish({how})")
        if not fixed:
            raise ValueError("the endpoint is down")
        return f"published {how}"

    @app.workflow()
    async def pipeline() -> str:
        try:
            how = await lookup()
        except LookupError:
            how = "fallback"  # handled: this failure is part of the run's path
        return await publish(how)

    async with app:
        handle = await app.start(pipeline, id="caught")
        with pytest.raises(tether.RunFailed, match="the endpoint is down"):
            await handle.result(timeout=10)
        run = await app.engine.store.get_run("caught")
        assert run is not None
        assert json.loads(run.error or "{}")["position"] == "1"  # publish's
        fixed = True
        resumed = await app.resume("caught")
        assert await resumed.result(timeout=10) == "published fallback"
        [looked, published] = await handle.checkpoints()
    assert ran == ["lookup", "publish(fallback)", "publish(fallback)"]
    assert (looked.status, looked.attempts) == (tether.CheckpointStatus.FAILED, 1)
    assert (published.status, published.attempts) == (tether.CheckpointStatus.COMPLETED, 2)


async def test_replay_check_reports_its_progress_run_by_run(make_app: MakeApp) -> None:
    app = make_app()

    @app.workflow()
    async def plain(n: int) -> int:
        return n

    progress: list[tuple[int, int | None]] = []
    async with app:
        for n in range(3):
            await (await app.start(plain, n, id=f"p{n}")).result(timeout=10)
        assert await app.replay_check() == []  # by default the unfinished runs only
        outcomes = await app.replay_check(
            finished=True, on_progress=lambda done, total: progress.append((done, total))
        )
    assert [o.ok for o in outcomes] == [True, True, True]
    assert progress == [(1, 3), (2, 3), (3, 3)]


def _define_flow(app: tether.App, value: int) -> Any:
    # Each call defines the same function again, as a notebook cell run twice does.
    @app.workflow(name="cell")
    async def flow() -> int:
        return value

    return flow


def _other_flow(app: tether.App) -> Any:
    @app.workflow(name="cell")
    async def flow() -> int:
        return 0

    return flow


async def test_a_workflow_defined_again_replaces_the_old_one_and_another_of_its_name_is_refused(
    tmp_path: Path,
) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/t.db")
    _define_flow(app, 1)
    again = _define_flow(app, 2)  # a cell run twice: the new code replaces the old
    assert app.engine.workflows["cell"] is again
    with pytest.raises(tether.ConfigurationError, match=r"two workflows are named 'cell'.*"
                       r"_define_flow.<locals>.flow and .*_other_flow.<locals>.flow"):  # fmt: skip
        _other_flow(app)
    async with app:
        assert await (await app.start(again)).result(timeout=10) == 2

"""Attacks on the at-most-once guarantee and on lease handling (docs/semantics.md, "At-most-once
steps" and "Leases and clocks"): an attempt whose outcome is unknown is never retried blindly;
another worker reconciles only once the previous attempt is over for certain; an async body is
never resumed past its deadline; a sync body past its timeout is waited for.

Every test counts effects (keyed by idempotency key) and reconcile calls precisely. Tests that
show a real defect are marked xfail(strict=True) with the root cause in their reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
import types
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import tether
from tether.clock import DatabaseClock
from tether.errors import StoreUnavailable
from tether.store.port import CheckpointStatus

MakeApp = Callable[..., tether.App]
# Two of the suite's modes: PostgreSQL, and forced replay on SQLite (which runs every first
# execution too); the memory store runs the same engine code. The suite is kept within its time.
ATTACK_MODES = [("postgres", False), ("sqlite", True)]


@pytest.fixture(params=ATTACK_MODES, ids=[f"{b}{'-replay' if r else ''}" for b, r in ATTACK_MODES])
def mode(request: pytest.FixtureRequest) -> tuple[str, bool]:
    return request.param  # type: ignore[no-any-return]


SHORT = timedelta(seconds=0.3)
NOW_RETRY = tether.Retry(max_attempts=3, initial_delay=timedelta(0))


class Receiver:
    """The receiver of an effect: effects keyed by idempotency key (thread-safe appends), and
    a reconcile hook that looks them up (every call recorded)."""

    def __init__(self) -> None:
        self.effects: list[str] = []
        self.asked: list[str] = []

    def effect(self) -> None:
        self.effects.append(tether.idempotency_key())

    def lookup(self, *args: object, **kwargs: object) -> object:
        key = tether.idempotency_key()
        self.asked.append(key)
        return "found" if key in self.effects else tether.NOT_DONE


def settings(app: tether.App, **changes: Any) -> None:
    app.engine.settings = dataclasses.replace(app.engine.settings, **changes)


async def wait_thread_event(event: threading.Event, timeout: float = 10.0) -> None:
    assert await asyncio.to_thread(event.wait, timeout), "timed out"


# -- validation -----------------------------------------------------------------------------


async def test_timeout_equal_to_the_lease_is_refused_and_just_below_is_accepted() -> None:
    app = tether.App("memory://", lease_duration=timedelta(seconds=2))
    with pytest.raises(tether.ConfigurationError, match="not shorter than the lease"):
        app.step(at_most_once=True, timeout=timedelta(seconds=2))(lambda: None)
    with pytest.raises(tether.ConfigurationError, match="not shorter than the lease"):
        app.step(at_most_once=True, timeout=timedelta(seconds=2, microseconds=1))(lambda: None)
    ok = app.step(at_most_once=True, timeout=timedelta(seconds=2) - timedelta(microseconds=1))(
        lambda: None
    )
    assert ok.timeout is not None
    assert ok.timeout < 2.0
    for bad in (timedelta(0), timedelta(seconds=-1)):
        with pytest.raises(tether.ConfigurationError, match="positive timedelta"):
            app.step(at_most_once=True, timeout=bad)(lambda: None)
    with pytest.raises(tether.ConfigurationError, match="only applies with at_most_once"):
        app.step(reconcile=lambda: None, timeout=SHORT)(lambda: None)
    with pytest.raises(tether.ConfigurationError, match="in_doubt= takes a tuple"):
        app.step(at_most_once=True, timeout=SHORT, in_doubt=[ConnectionError])(  # type: ignore[arg-type]
            lambda: None
        )
    # A timeout is compared to the lease only with at_most_once: a plain step may be longer.
    app.step(timeout=timedelta(seconds=60))(lambda: None)
    for lease in (timedelta(0), timedelta(seconds=-1)):
        with pytest.raises(tether.ConfigurationError, match="lease_duration must be positive"):
            tether.App("memory://", lease_duration=lease)


async def test_a_transaction_step_cannot_be_declared_at_most_once() -> None:
    app = tether.App("memory://")
    with pytest.raises(TypeError):
        app.transaction(at_most_once=True)  # type: ignore[call-overload]


# -- reconcile hooks ------------------------------------------------------------------------


async def test_a_reconcile_hook_that_raises_fails_the_step_without_running_the_body_again(
    make_app: MakeApp,
) -> None:
    app = make_app()
    rx = Receiver()
    bodies: list[int] = []
    broken = [True]

    def lookup() -> object:
        rx.asked.append(tether.idempotency_key())
        if broken[0]:
            raise RuntimeError("the receiver's status API is down")
        return "found" if tether.idempotency_key() in rx.effects else tether.NOT_DONE

    @app.step(at_most_once=True, reconcile=lookup, timeout=SHORT, retry=NOW_RETRY)
    async def publish() -> str:
        bodies.append(1)
        rx.effect()
        await asyncio.sleep(30)  # the answer never comes: the attempt times out in doubt
        return "answered"

    @app.workflow()
    async def flow() -> str:
        return await publish()

    async with app:
        handle = await app.start(flow, id="hook-raises")
        with pytest.raises(tether.RunFailed) as info:
            await handle.result(timeout=10)
        assert info.value.error["type"] == "RuntimeError"
        assert len(bodies) == 1
        assert len(rx.effects) == 1
        assert len(rx.asked) == 1
        # The marker is still the step's record: a resume asks the hook again (once).
        broken[0] = False
        await app.resume("hook-raises")
        assert await handle.result(timeout=10) == "found"
    assert len(bodies) == 1
    assert len(rx.effects) == 1
    assert len(rx.asked) == 2


async def test_a_reconcile_hook_error_the_workflow_catches_replays_the_same_way(
    make_app: MakeApp,
) -> None:
    """The hook's failure is handed to the workflow but not recorded (the marker stays
    STARTED): the workflow catches it and goes on to another step, then waits (suspends). The
    replay that resumes it must take the same path: not stuck behind the unrecorded marker,
    not held as diverged, not asking the hook again to go down another branch."""
    app = make_app()
    rx = Receiver()
    calls = {"hook": 0}

    def lookup() -> object:
        calls["hook"] += 1
        if calls["hook"] == 1:
            raise RuntimeError("status API down")
        return "found" if tether.idempotency_key() in rx.effects else tether.NOT_DONE

    @app.step(at_most_once=True, reconcile=lookup, timeout=SHORT, retry=tether.NO_RETRY)
    async def publish() -> str:
        rx.effect()
        await asyncio.sleep(30)
        return "answered"

    @app.step()
    async def fallback() -> str:
        return "fallback"

    @app.workflow()
    async def flow() -> str:
        try:
            outcome = await publish()
        except RuntimeError:
            outcome = await fallback()
        await tether.wait_for_event("go")  # suspends: the resumption replays the history
        return outcome

    async with app:
        handle = await app.start(flow, id="hook-caught")
        deadline = time.monotonic() + 5
        while (status := await handle.status()) is not tether.RunStatus.WAITING:
            assert status is not tether.RunStatus.HELD, (await handle.info()).error
            assert time.monotonic() < deadline, status
            await asyncio.sleep(0.02)
        await app.send("hook-caught", "go", None)
        deadline = time.monotonic() + 5
        while not (status := await handle.status()).terminal:
            assert status is not tether.RunStatus.HELD, (await handle.info()).error
            assert time.monotonic() < deadline, status
            await asyncio.sleep(0.02)
        assert await handle.result(timeout=1) == "fallback"
    assert len(rx.effects) == 1
    assert calls["hook"] == 1


async def test_not_done_with_retries_exhausted_fails_the_step_with_its_timeout(
    make_app: MakeApp,
) -> None:
    app = make_app()
    rx = Receiver()
    bodies: list[int] = []

    @app.step(at_most_once=True, reconcile=rx.lookup, timeout=SHORT, retry=tether.NO_RETRY)
    async def publish() -> str:
        bodies.append(1)
        await asyncio.sleep(30)  # times out before any effect
        rx.effect()
        return "answered"

    @app.workflow()
    async def flow() -> str:
        return await publish()

    async with app:
        with pytest.raises(tether.RunFailed) as info:
            await (await app.start(flow, id="exhausted")).result(timeout=10)
    assert info.value.error["type"] == "tether.errors.StepTimeout"
    assert bodies == [1]
    assert rx.effects == []
    assert len(rx.asked) == 1


async def test_not_done_after_a_stop_counts_the_attempt_for_the_retry_policy(
    make_app: MakeApp,
) -> None:
    rx = Receiver()
    bodies: list[str] = []
    began = asyncio.Event()

    def register(app: tether.App, block: bool) -> None:
        @app.step(at_most_once=True, reconcile=rx.lookup, timeout=timedelta(seconds=5),
                  retry=tether.NO_RETRY)  # fmt: skip
        async def publish() -> str:
            bodies.append(tether.idempotency_key())
            if block:
                began.set()
                await asyncio.sleep(3600)  # interrupted before its effect
            rx.effect()
            return "published"

        @app.workflow()
        async def flow() -> str:
            return await publish()

    first = make_app()
    register(first, block=True)
    async with first:
        await first.start("flow", id="no-retry")
        await asyncio.wait_for(began.wait(), 10)
    second = make_app()
    register(second, block=False)
    async with second:
        handle = await second.get("no-retry")
        with pytest.raises(tether.RunFailed):
            await handle.result(timeout=10)
    assert len(rx.asked) == 1
    assert len(bodies) == 1  # NO_RETRY: one attempt, the one that was interrupted
    assert rx.effects == []


async def test_a_reconciled_value_that_does_not_fit_the_type_is_never_handed_to_the_workflow(
    make_app: MakeApp,
) -> None:
    app = make_app()
    settings(app, failure_backoff=0.01, max_failure_backoff=0.01)

    def lookup() -> object:
        return {"not": "an int"}

    @app.step(at_most_once=True, reconcile=lookup, timeout=SHORT)
    async def count() -> int:
        await asyncio.sleep(30)
        return 1

    @app.workflow()
    async def flow() -> str:
        try:
            return str(await count())
        except Exception as exc:  # must never see a value this code cannot rebuild
            return f"caught {type(exc).__name__}"

    async with app:
        handle = await app.start(flow, id="misfit")
        with pytest.raises(tether.RunDead):
            await handle.result(timeout=10)


# -- in-doubt errors ------------------------------------------------------------------------


async def test_a_sync_body_raising_connection_error_is_reconciled_before_its_retry(
    make_app: MakeApp,
) -> None:
    app = make_app()
    rx = Receiver()
    attempts: list[int] = []

    @app.step(at_most_once=True, reconcile=rx.lookup, timeout=SHORT, retry=NOW_RETRY)
    def publish() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionRefusedError("refused before anything was sent")
        rx.effect()
        return "published"

    @app.step(at_most_once=True, reconcile=rx.lookup, timeout=SHORT, retry=NOW_RETRY)
    def publish_then_drop() -> str:
        rx.effect()
        raise ConnectionResetError("the answer was lost")  # the effect happened

    @app.workflow()
    async def flow() -> list[str]:
        return [await publish(), await publish_then_drop()]

    async with app:
        assert await (await app.start(flow, id="sync-conn")).result(timeout=10) == [
            "published",
            "found",
        ]
    assert len(attempts) == 2
    assert len(rx.effects) == 2
    assert len(set(rx.effects)) == 2
    assert len(rx.asked) == 2  # once per in-doubt attempt, never for the clean one


async def test_two_at_most_once_steps_in_gather_are_each_reconciled_once(
    make_app: MakeApp,
) -> None:
    app = make_app()
    rx = Receiver()
    bodies: list[str] = []

    @app.step(at_most_once=True, reconcile=rx.lookup, timeout=SHORT, retry=NOW_RETRY)
    async def publish(n: int) -> str:
        bodies.append(tether.idempotency_key())
        if n == 1:
            rx.effect()
            await asyncio.sleep(30)  # times out after its effect: found
        if n == 2 and bodies.count(tether.idempotency_key()) == 1:
            raise ConnectionResetError("dropped before sending")  # not done: retried
        if n == 2:
            rx.effect()
        return f"published {n}"

    @app.step(at_most_once=True, reconcile=rx.lookup, timeout=SHORT)
    async def plain(n: int) -> str:
        rx.effect()
        return f"plain {n}"

    @app.workflow()
    async def flow() -> list[str]:
        return list(await asyncio.gather(publish(1), publish(2), plain(3)))

    async with app:
        result = await (await app.start(flow, id="gather")).result(timeout=10)
    assert result == ["found", "published 2", "plain 3"]
    assert len(rx.effects) == 3
    assert len(set(rx.effects)) == 3
    assert sorted(rx.asked) == sorted(set(rx.asked))
    assert len(rx.asked) == 2
    assert len(bodies) == 3  # publish(1) once, publish(2) twice


# -- cancellation ---------------------------------------------------------------------------


async def test_a_run_cancelled_during_an_at_most_once_body_leaves_it_unresolved_not_rerun(
    make_app: MakeApp,
) -> None:
    app = make_app()
    rx = Receiver()
    began = asyncio.Event()

    @app.step(at_most_once=True, reconcile=rx.lookup, timeout=timedelta(seconds=5))
    async def publish() -> str:
        rx.effect()
        began.set()
        await asyncio.sleep(30)
        return "answered"

    @app.workflow()
    async def flow() -> str:
        return await publish()

    async with app:
        handle = await app.start(flow, id="cancel-amo")
        await asyncio.wait_for(began.wait(), 10)
        await handle.cancel()
        with pytest.raises(tether.RunCancelled):
            await handle.result(timeout=10)
        with pytest.raises(tether.ConfigurationError, match="cancelled"):
            await app.resume("cancel-amo")
        checkpoints = await handle.checkpoints()
    assert [c.status for c in checkpoints] == [CheckpointStatus.STARTED]
    assert len(rx.effects) == 1
    assert rx.asked == []


# -- deadlines --------------------------------------------------------------------------------


async def test_a_body_that_catches_the_deadline_error_and_goes_on_is_its_own_outcome(
    make_app: MakeApp,
) -> None:
    """Bounded throws TimeoutError into the body at its first resumption past the deadline; a
    body that swallows it goes on (sync code cannot be stopped) and its value is recorded.
    Nothing else runs the effect: the outcome is known, there is no reconciliation."""
    app = make_app()
    rx = Receiver()
    answer, waiting = asyncio.Event(), asyncio.Event()
    caught: list[str] = []

    @app.step(at_most_once=True, reconcile=rx.lookup, timeout=SHORT, retry=NOW_RETRY)
    async def publish() -> str:
        if not caught:
            waiting.set()
            try:
                await answer.wait()
            except TimeoutError:
                caught.append("deadline")
        rx.effect()
        return "went on"

    @app.workflow()
    async def flow() -> str:
        return await publish()

    async with app:
        handle = await app.start(flow, id="swallow")
        await asyncio.wait_for(waiting.wait(), 10)
        answer.set()
        time.sleep(SHORT.total_seconds() + 0.2)  # the loop stalls past the deadline
        assert await handle.result(timeout=10) == "went on"
    assert caught == ["deadline"]
    assert len(rx.effects) == 1
    assert rx.asked == []


async def test_a_body_that_swallows_the_deadline_and_awaits_again_meets_it_again(
    make_app: MakeApp,
) -> None:
    app = make_app()
    rx = Receiver()
    answer, waiting = asyncio.Event(), asyncio.Event()
    caught: list[str] = []
    passes: list[int] = []

    @app.step(at_most_once=True, reconcile=rx.lookup, timeout=SHORT, retry=NOW_RETRY)
    async def publish() -> str:
        passes.append(1)
        if len(passes) == 1:
            waiting.set()
            try:
                await answer.wait()
            except TimeoutError:
                caught.append("deadline")
            await asyncio.sleep(0)  # resumed past its deadline again: thrown again
            caught.append("went on")  # never reached
        rx.effect()
        return "published"

    @app.workflow()
    async def flow() -> str:
        return await publish()

    async with app:
        handle = await app.start(flow, id="swallow-again")
        await asyncio.wait_for(waiting.wait(), 10)
        answer.set()
        time.sleep(SHORT.total_seconds() + 0.2)
        assert await handle.result(timeout=10) == "published"
    assert caught == ["deadline"]
    assert len(passes) == 2
    assert len(rx.effects) == 1
    assert len(rx.asked) == 1


async def test_a_body_that_never_awaits_past_its_timeout_keeps_its_outcome(
    make_app: MakeApp,
) -> None:
    """A CPU-bound stretch cannot be interrupted: it finishes, and what it returns is the
    attempt's outcome (known: not reconciled, not run again)."""
    app = make_app()
    rx = Receiver()

    @app.step(at_most_once=True, reconcile=rx.lookup, timeout=SHORT, retry=NOW_RETRY)
    async def crunch() -> str:
        end = time.monotonic() + SHORT.total_seconds() + 0.2
        while time.monotonic() < end:
            pass
        rx.effect()
        return "crunched"

    @app.step(at_most_once=True, reconcile=rx.lookup, timeout=SHORT, retry=NOW_RETRY)
    async def crunch_then_await() -> str:
        if not rx.asked:
            end = time.monotonic() + SHORT.total_seconds() + 0.2
            while time.monotonic() < end:
                pass
            await asyncio.sleep(0)  # resumed past its deadline: TimeoutError, in doubt
        rx.effect()
        return "crunched later"

    @app.workflow()
    async def flow() -> list[str]:
        return [await crunch(), await crunch_then_await()]

    async with app:
        result = await (await app.start(flow, id="cpu")).result(timeout=10)
    assert result == ["crunched", "crunched later"]
    assert len(rx.effects) == 2
    assert len(set(rx.effects)) == 2
    assert len(rx.asked) == 1  # only the second, after its deadline met it: not done


async def test_a_body_never_runs_after_the_deadline_its_marker_records(
    make_app: MakeApp,
) -> None:
    app = make_app()
    rx = Receiver()
    store = app.engine.store
    original = store.write_checkpoint
    deadlines: list[float] = []
    stamps: list[float] = []

    async def slow_marker(lease: Any, checkpoint: Any, now: float) -> None:
        await original(lease, checkpoint, now)
        if checkpoint.status is CheckpointStatus.STARTED:
            deadlines.append(checkpoint.retry_at)
            await asyncio.sleep(SHORT.total_seconds() + 0.2)  # its acknowledgement is slow

    store.write_checkpoint = slow_marker  # type: ignore[method-assign]

    @app.step(at_most_once=True, reconcile=rx.lookup, timeout=SHORT, retry=tether.NO_RETRY)
    async def publish() -> str:
        stamps.append(app.engine.clock.now())
        rx.effect()
        return "published"

    @app.workflow()
    async def flow() -> str:
        return await publish()

    async with app:
        with contextlib.suppress(tether.RunFailed):
            await (await app.start(flow, id="late-body")).result(timeout=10)
    assert deadlines
    assert all(stamp <= deadlines[0] for stamp in stamps), (stamps, deadlines)


async def test_a_partitioned_worker_with_a_late_marker_ack_does_not_double_the_effect(
    make_app: MakeApp,
) -> None:
    rx = Receiver()
    lease = timedelta(seconds=0.9)
    timeout = timedelta(seconds=0.4)
    partitioned: set[str] = set()
    marked = asyncio.Event()

    def register(app: tether.App) -> None:
        # Another attempt may follow one reconciled as not done (the Retry decides).
        @app.step(at_most_once=True, reconcile=rx.lookup, timeout=timeout, retry=NOW_RETRY)
        async def publish() -> str:
            rx.effect()
            await asyncio.sleep(0.05)
            return "published"

        @app.workflow()
        async def flow() -> str:
            return await publish()

    first = make_app(lease_duration=lease)
    settings(first, keepalive_thread=False)  # heartbeats through the patched store below
    register(first)
    store = first.engine.store
    original_write, original_beat = store.write_checkpoint, store.heartbeat

    async def late_ack(lease_: Any, checkpoint: Any, now: float) -> None:
        await original_write(lease_, checkpoint, now)
        if checkpoint.status is CheckpointStatus.STARTED and lease_.worker_id in partitioned:
            marked.set()
            await asyncio.sleep(1.6)  # committed; the acknowledgement comes back late

    async def beat(worker_id: str, *args: Any) -> Any:
        if worker_id in partitioned:
            raise StoreUnavailable("partitioned from the database")
        return await original_beat(worker_id, *args)

    original_claim = store.claim_runs

    async def claim(worker_id: str, *args: Any, **kwargs: Any) -> Any:
        if worker_id in partitioned:  # nor can it claim (it would adopt its own run again)
            raise StoreUnavailable("partitioned from the database")
        return await original_claim(worker_id, *args, **kwargs)

    store.write_checkpoint = late_ack  # type: ignore[method-assign]
    store.heartbeat = beat  # type: ignore[method-assign]
    store.claim_runs = claim  # type: ignore[method-assign]
    second = make_app(lease_duration=lease)
    register(second)
    async with first:
        assert first.worker_id is not None
        await first.start("flow", id="partition")  # claimed by the first worker at once
        partitioned.add(first.worker_id)
        await asyncio.wait_for(marked.wait(), 10)  # the first worker holds the run
        async with second:
            await (await second.get("partition")).result(timeout=10)
            await asyncio.sleep(1.8)  # the first worker's late body runs meanwhile
    assert len(rx.effects) == 1, rx.effects


# -- this worker's own threads ----------------------------------------------------------------


async def test_a_resumed_run_waits_for_its_own_still_running_sync_body(
    make_app: MakeApp,
) -> None:
    app = make_app()
    rx = Receiver()
    began = threading.Event()
    bodies: list[int] = []
    first_over = threading.Event()

    @app.step(at_most_once=True, reconcile=rx.lookup, timeout=timedelta(seconds=0.4))
    def publish() -> str:
        bodies.append(1)
        if len(bodies) == 1:
            began.set()
            time.sleep(1.2)  # past the workflow's timeout and the step's
            rx.effect()
            first_over.set()
            return "published late"
        rx.effect()
        return "published again"

    @app.workflow(timeout=timedelta(seconds=0.15))
    async def flow() -> str:
        return await publish()

    async with app:
        handle = await app.start(flow, id="own-thread")
        await wait_thread_event(began)
        with pytest.raises(tether.RunFailed) as info:
            await handle.result(timeout=10)
        assert info.value.error["type"] == "tether.errors.WorkflowTimeout"
        await asyncio.sleep(0.5)  # the marker's retry_at has passed; the thread still runs
        assert not first_over.is_set()
        app.engine.workflows["flow"].timeout = timedelta(seconds=5)
        await app.resume("own-thread")
        result = await handle.result(timeout=10)
        await wait_thread_event(first_over)
    assert len(rx.effects) == 1, (result, rx.effects)
    assert len(bodies) == 1


# -- stopping a worker ------------------------------------------------------------------------


async def test_a_stop_during_an_async_body_is_reconciled_exactly_once_by_the_next_worker(
    make_app: MakeApp,
) -> None:
    rx = Receiver()
    bodies: list[str] = []
    began, began_before = asyncio.Event(), asyncio.Event()

    def register(app: tether.App, block: bool) -> None:
        @app.step(at_most_once=True, reconcile=rx.lookup, timeout=timedelta(seconds=5))
        async def before(n: int) -> str:
            bodies.append(tether.idempotency_key())
            rx.effect()  # the effect happened, then the answer hangs
            if block:
                began_before.set()
                await asyncio.sleep(3600)
            return "published"

        @app.step(at_most_once=True, reconcile=rx.lookup, timeout=timedelta(seconds=5))
        async def after(n: int) -> str:
            bodies.append(tether.idempotency_key())
            if block:
                began.set()
                await asyncio.sleep(3600)  # interrupted before its effect
            rx.effect()
            return "published"

        @app.workflow()
        async def flow() -> list[str]:
            return list(await asyncio.gather(before(1), after(2)))

    first = make_app()
    register(first, block=True)
    async with first:
        await first.start("flow", id="stop-async")
        await asyncio.wait_for(began.wait(), 10)
        await asyncio.wait_for(began_before.wait(), 10)  # both bodies in flight
    assert len(bodies) == 2
    assert len(rx.effects) == 1
    second = make_app()
    register(second, block=False)
    async with second:
        assert await (await second.get("stop-async")).result(timeout=10) == [
            "found",
            "published",
        ]
    # Each attempt's hook was asked; in forced-replay mode a NOT_DONE answer whose record the
    # replay cut short is asked again (a hook is a look-up: asking twice changes nothing).
    assert len(set(rx.asked)) == 2
    assert len(rx.asked) == 2 or (second.engine.settings.force_replay and len(rx.asked) == 3)
    assert len(rx.effects) == 2
    assert len(set(rx.effects)) == 2
    assert len(bodies) == 3  # `after` ran again once, after its hook found nothing


async def test_a_stop_after_a_sync_body_passed_its_timeout_does_not_release_it(
    make_app: MakeApp,
) -> None:
    rx = Receiver()
    began = threading.Event()
    over = threading.Event()
    lease = timedelta(seconds=1)

    def register(app: tether.App) -> None:
        @app.step(at_most_once=True, reconcile=rx.lookup, timeout=timedelta(seconds=0.2))
        def publish() -> str:
            if not began.is_set():
                began.set()
                time.sleep(0.8)  # past its timeout and past the stop's grace
                rx.effect()
                over.set()
                return "published late"
            rx.effect()
            return "published again"

        @app.workflow()
        async def flow() -> str:
            return await publish()

    first = make_app(lease_duration=lease)
    settings(first, shutdown_grace=0.3)
    register(first)
    async with first:
        await first.start("flow", id="stop-sync-late")
        await wait_thread_event(began)
    second = make_app(lease_duration=lease)
    register(second)
    async with second:
        result = await (await second.get("stop-sync-late")).result(timeout=10)
        await wait_thread_event(over)
    assert len(rx.effects) == 1, (result, rx.effects)


async def test_a_sync_body_outliving_the_stop_and_its_lease_is_not_run_twice(
    make_app: MakeApp,
) -> None:
    rx = Receiver()
    began = threading.Event()
    over = threading.Event()
    lease = timedelta(seconds=1)

    def register(app: tether.App) -> None:
        @app.step(at_most_once=True, reconcile=rx.lookup, timeout=timedelta(seconds=0.9))
        def publish() -> str:
            if not began.is_set():
                began.set()
                time.sleep(2.2)  # longer than the grace, the timeout and the lease
                rx.effect()
                over.set()
                return "published late"
            rx.effect()
            return "published again"

        @app.workflow()
        async def flow() -> str:
            return await publish()

    first = make_app(lease_duration=lease)
    settings(first, shutdown_grace=0.2)
    register(first)
    async with first:
        await first.start("flow", id="stop-sync-long")
        await wait_thread_event(began)
    second = make_app(lease_duration=lease)
    register(second)
    async with second:
        result = await (await second.get("stop-sync-long")).result(timeout=10)
        await wait_thread_event(over)
    assert len(rx.effects) == 1, (result, rx.effects)


async def test_a_sync_body_started_while_the_worker_stops_is_not_released(
    make_app: MakeApp,
) -> None:
    rx = Receiver()
    slow_began = threading.Event()
    late_began = threading.Event()
    late_over = threading.Event()
    late_effects: list[str] = []
    go = asyncio.Event()
    gated = asyncio.Event()
    lease = timedelta(seconds=1.5)

    def register(app: tether.App) -> None:
        @app.step(at_most_once=True, reconcile=rx.lookup, timeout=timedelta(seconds=1))
        def slow() -> str:
            slow_began.set()
            time.sleep(0.5)
            rx.effect()
            return "slow"

        @app.step()
        async def gate() -> str:
            gated.set()
            await go.wait()
            return "open"

        def late_lookup() -> object:
            rx.asked.append(tether.idempotency_key())
            return "found" if late_effects else tether.NOT_DONE

        @app.step(at_most_once=True, reconcile=late_lookup, timeout=timedelta(seconds=1))
        def late() -> str:
            if not late_began.is_set():
                late_began.set()
                time.sleep(0.8)
                late_effects.append(tether.idempotency_key())
                late_over.set()
                return "late"
            late_effects.append(tether.idempotency_key())
            return "late again"

        @app.workflow()
        async def one() -> str:
            return await slow()

        @app.workflow()
        async def two() -> str:
            await gate()
            return await late()

    first = make_app(lease_duration=lease)
    register(first)

    async def open_gate_once_stopping() -> None:
        await asyncio.sleep(0.05)
        go.set()

    async with first:
        await first.start("one", id="slow-run")
        await first.start("two", id="late-run")
        await wait_thread_event(slow_began)
        await asyncio.wait_for(gated.wait(), 10)
        opener = asyncio.ensure_future(open_gate_once_stopping())
    await opener
    second = make_app(lease_duration=lease)
    register(second)
    async with second:
        result = await (await second.get("late-run")).result(timeout=10)
        await wait_thread_event(late_over)
    assert late_began.is_set()
    assert len(late_effects) == 1, (result, late_effects)


# -- leases and heartbeats ------------------------------------------------------------------


async def test_a_worker_whose_row_was_deleted_registers_again_at_its_next_heartbeat(
    make_app: MakeApp,
) -> None:
    app = make_app(lease_duration=timedelta(seconds=0.6))
    async with app:
        store, me = app.engine.store, app.worker_id
        assert me is not None
        assert await store.release_worker(me, app.engine.clock.now()) == []  # no runs held
        assert me not in [w.id for w in await store.list_workers()]
        deadline = time.monotonic() + 5
        while me not in [w.id for w in await store.list_workers()]:
            assert time.monotonic() < deadline, "the worker never registered again"
            await asyncio.sleep(0.05)
        row = next(w for w in await store.list_workers() if w.id == me)
        assert row.workflows == app.engine.worker.info.workflows  # type: ignore[union-attr]


async def test_heartbeats_resume_after_an_outage_longer_than_max_loop_stall(
    make_app: MakeApp,
) -> None:
    app = make_app(lease_duration=timedelta(seconds=0.6))
    settings(app, max_loop_stall=0.5)
    store = app.engine.store
    outage = threading.Event()
    beats: list[float] = []
    other = store.another()
    assert other is not None
    real_beat = other.heartbeat

    async def beat(*args: Any) -> Any:
        if outage.is_set():
            raise StoreUnavailable("the database is away")
        reply = await real_beat(*args)
        beats.append(time.monotonic())
        return reply

    other.heartbeat = beat  # type: ignore[method-assign]
    store.another = lambda: other  # type: ignore[method-assign]
    hold = asyncio.Event()

    @app.step()
    async def wait_here() -> str:
        await hold.wait()
        return "held"

    @app.workflow()
    async def flow() -> str:
        return await wait_here()

    async with app:
        handle = await app.start(flow, id="outage")
        await asyncio.sleep(0.5)
        outage.set()
        await asyncio.sleep(1.0)  # longer than max_loop_stall; the loop itself runs fine
        outage.clear()
        healed = time.monotonic()
        await asyncio.sleep(1.0)
        healthy_beats = [b for b in beats if b > healed]
        hold.set()
        await handle.result(timeout=10)
    assert healthy_beats, "no heartbeat after the database came back"


# -- the database clock -------------------------------------------------------------------


def fake_time(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    now = {"wall": 1_000_000.0, "mono": 50.0}
    fake = types.SimpleNamespace(time=lambda: now["wall"], monotonic=lambda: now["mono"])
    monkeypatch.setattr("tether.clock.time", fake)
    return now


async def test_database_clock_follows_the_monotonic_clock_between_syncs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = fake_time(monkeypatch)
    clock = DatabaseClock()
    start = clock.now()
    now["wall"] -= 3600  # the local wall clock is stepped back an hour
    now["mono"] += 1.0
    assert clock.now() == pytest.approx(start + 1.0)

    async def server() -> float | None:
        return 2_000_000.0

    await clock.sync(server)
    assert clock.now() == pytest.approx(2_000_000.0)
    assert clock.skew == pytest.approx(now["wall"] - 2_000_000.0)
    now["wall"] += 7200
    now["mono"] += 0.5
    assert clock.now() == pytest.approx(2_000_000.5)  # a wall-clock step changes nothing


async def test_database_clock_steps_back_when_a_sync_reads_the_server_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Characterization: now() is not monotonic across syncs. Each sync adopts the new
    estimate as is (the server's clock stepped, or just the round trip's jitter), so
    tether.now() and lease arithmetic may see time go back by the measurement's error; and
    on SQLite a sync adopts a wall-clock step of this machine."""
    now = fake_time(monkeypatch)
    clock = DatabaseClock()
    read = iter([2_000_000.0, 2_000_000.0])

    async def server() -> float | None:
        return next(read)

    await clock.sync(server)
    now["mono"] += 1.0
    before = clock.now()
    await clock.sync(server)  # the server says it is one second earlier than we carried it
    assert clock.now() < before
    assert before - clock.now() == pytest.approx(1.0)

    async def no_server() -> float | None:
        return None

    now["wall"] -= 30  # SQLite: the local wall clock steps back
    later = clock.now()
    await clock.sync(no_server)
    assert clock.now() == pytest.approx(now["wall"])  # it adopts the step at the next sync
    assert clock.now() < later

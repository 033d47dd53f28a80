"""At-most-once steps whose outcome is in doubt are never retried blindly: a timeout, a lost
connection or a stalled process is reconciled (or fails with StepOutcomeUnknown); a sync body
past its timeout is waited for, not abandoned; a body is never resumed past its deadline; a
graceful shutdown lets a sync body finish. Every test counts the effect."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import tether
from tether.store.port import CheckpointStatus

MakeApp = Callable[..., tether.App]
SHORT = timedelta(seconds=0.3)


def receiver() -> tuple[list[str], Callable[..., object]]:
    """Effects keyed by idempotency key, and a reconcile hook that looks them up."""
    effects: list[str] = []
    asked: list[str] = []

    def lookup(*args: object) -> object:
        asked.append(tether.idempotency_key())
        if tether.idempotency_key() in effects:
            return "found"
        return tether.NOT_DONE

    lookup.asked = asked  # type: ignore[attr-defined]
    return effects, lookup


async def test_an_at_most_once_step_needs_a_timeout_shorter_than_the_lease() -> None:
    app = tether.App("memory://", lease_duration=timedelta(seconds=5))
    with pytest.raises(tether.ConfigurationError, match="needs timeout="):

        @app.step(at_most_once=True)
        async def untimed() -> None: ...

    with pytest.raises(tether.ConfigurationError, match="not shorter than the lease"):

        @app.step(at_most_once=True, timeout=timedelta(seconds=5))
        async def too_long() -> None: ...


async def test_a_timed_out_async_attempt_is_reconciled_never_retried_blindly(
    make_app: MakeApp,
) -> None:
    app = make_app()
    effects, lookup = receiver()

    @app.step(at_most_once=True, reconcile=lookup, timeout=SHORT)  # default retries: 3 attempts
    async def publish() -> str:
        effects.append(tether.idempotency_key())  # the effect happens, then the answer hangs
        await asyncio.sleep(30)
        return "answered"

    @app.workflow()
    async def flow() -> str:
        return await publish()

    async with app:
        assert await (await app.start(flow, id="t")).result(timeout=10) == "found"
    assert len(effects) == 1
    assert len(lookup.asked) == 1  # type: ignore[attr-defined]


async def test_a_timed_out_attempt_without_a_hook_fails_with_outcome_unknown(
    make_app: MakeApp,
) -> None:
    app = make_app()
    effects: list[str] = []

    # Longer than SHORT: the body must start, and its marker's commit can take 0.3 s on a
    # loaded machine (with no time left, the body never starts).
    @app.step(at_most_once=True, timeout=timedelta(seconds=2))
    async def publish() -> str:
        effects.append("effect")
        await asyncio.sleep(30)
        return "answered"

    @app.workflow()
    async def flow() -> str:
        return await publish()

    async with app:
        with pytest.raises(tether.RunFailed) as info:
            await (await app.start(flow, id="u")).result(timeout=10)
    assert info.value.error["type"] == "tether.errors.StepOutcomeUnknown"
    assert effects == ["effect"]


async def test_a_lost_connection_is_in_doubt_and_a_hook_that_finds_nothing_lets_it_retry(
    make_app: MakeApp,
) -> None:
    app = make_app()
    effects, lookup = receiver()
    attempts: list[int] = []

    @app.step(at_most_once=True, reconcile=lookup, timeout=SHORT,
              retry=tether.Retry(max_attempts=3, initial_delay=timedelta(0)))  # fmt: skip
    async def publish() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionResetError("the connection dropped before the request went out")
        effects.append(tether.idempotency_key())
        return "published"

    @app.workflow()
    async def flow() -> str:
        return await publish()

    async with app:
        assert await (await app.start(flow, id="c")).result(timeout=10) == "published"
    assert len(effects) == 1
    assert len(lookup.asked) == 1  # type: ignore[attr-defined]  # asked before the retry
    assert len(attempts) == 2


async def test_a_sync_body_past_its_timeout_is_waited_for_and_its_outcome_kept(
    make_app: MakeApp,
) -> None:
    app = make_app()
    effects, lookup = receiver()

    @app.step(at_most_once=True, reconcile=lookup, timeout=SHORT)
    def publish() -> str:
        time.sleep(0.6)  # a thread cannot be stopped: past its timeout, it goes on
        effects.append(tether.idempotency_key())
        return "published late"

    @app.workflow()
    async def flow() -> str:
        return await publish()

    async with app:
        assert await (await app.start(flow, id="s")).result(timeout=10) == "published late"
    assert len(effects) == 1  # never a second attempt beside the running thread
    assert lookup.asked == []  # type: ignore[attr-defined]  # its outcome was known


async def test_an_async_body_is_not_resumed_past_its_deadline_after_a_stall(
    make_app: MakeApp,
) -> None:
    """The event loop blocks (a sync call elsewhere) just after the body's awaited answer came:
    when the loop runs again the body's wake-up is first in line, before its timeout. It must
    meet the deadline instead of going on to make the effect."""
    app = make_app()
    effects, lookup = receiver()
    answer = asyncio.Event()
    waiting = asyncio.Event()
    passes: list[str] = []

    @app.step(at_most_once=True, reconcile=lookup, timeout=SHORT,
              retry=tether.Retry(max_attempts=2, initial_delay=timedelta(0)))  # fmt: skip
    async def publish() -> str:
        if not passes:
            passes.append("first")
            waiting.set()
            await answer.wait()  # resumed only after the stall below
            passes.append("went on")  # it must never get here
        effects.append(tether.idempotency_key())
        return "published"

    @app.workflow()
    async def flow() -> str:
        return await publish()

    async with app:
        handle = await app.start(flow, id="stall")
        await asyncio.wait_for(waiting.wait(), 10)
        answer.set()  # the body's wake-up is queued ...
        time.sleep(SHORT.total_seconds() + 0.2)  # ... and the loop stalls past the deadline
        assert await handle.result(timeout=10) == "published"
    assert passes == ["first"]
    assert len(effects) == 1  # made by the second attempt, after the hook found nothing


async def test_a_graceful_shutdown_lets_a_sync_at_most_once_body_finish(
    make_app: MakeApp,
) -> None:
    effects, lookup = receiver()
    started = threading.Event()

    def register(app: tether.App) -> None:
        @app.step(at_most_once=True, reconcile=lookup, timeout=timedelta(seconds=5))
        def publish() -> str:
            started.set()
            time.sleep(0.5)
            effects.append(tether.idempotency_key())
            return "published"

        @app.workflow()
        async def flow() -> str:
            return await publish()

    first = make_app()
    register(first)
    async with first:
        await first.start("flow", id="g")
        await asyncio.to_thread(started.wait, 10)
    # `async with` ended while the body ran: the worker waited for it before giving runs back.
    assert len(effects) == 1
    second = make_app()
    register(second)
    async with second:
        assert await (await second.get("g")).result(timeout=10) == "published"
    assert len(effects) == 1
    assert lookup.asked == []  # type: ignore[attr-defined]  # recorded: no doubt at all


def slow_first_marker(app: tether.App, delay: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first start marker commits at once, but its write answers `delay` seconds late."""
    store = app.engine.store
    write = store.write_checkpoint
    slow = [True]

    async def late(lease: Any, checkpoint: Any, now: float) -> None:
        await write(lease, checkpoint, now)
        if checkpoint.status is CheckpointStatus.STARTED and slow[0]:
            slow[0] = False
            await asyncio.sleep(delay)

    monkeypatch.setattr(store, "write_checkpoint", late)


def charging(app: tether.App, **step: Any) -> tuple[tether.Workflow[[], str], list[str]]:
    """A workflow `pay` of one at-most-once step (timeout SHORT, and `step`'s options) whose
    effects are kept by idempotency key."""
    effects: list[str] = []

    @app.step(at_most_once=True, timeout=SHORT, **step)
    async def charge() -> str:
        effects.append(tether.idempotency_key())
        return "sent"

    @app.workflow()
    async def pay() -> str:
        return await charge()

    return pay, effects


ONE_RETRY = tether.Retry(max_attempts=2, initial_delay=timedelta(0))


@pytest.mark.parametrize("with_hook", [True, False], ids=["hook", "no-hook"])
async def test_an_attempt_whose_marker_took_its_whole_timeout_is_judged_by_its_retry(
    make_app: MakeApp, monkeypatch: pytest.MonkeyPatch, with_hook: bool
) -> None:
    """Its body never began, so no effect can have happened: it is not in doubt (no hook is
    asked, no StepOutcomeUnknown), and the step's Retry runs the next attempt."""
    app = make_app()
    slow_first_marker(app, SHORT.total_seconds() + 0.1, monkeypatch)
    _, lookup = receiver()
    pay, effects = charging(app, reconcile=lookup if with_hook else None, retry=ONE_RETRY)
    async with app:
        assert await (await app.start(pay, id="p")).result(timeout=10) == "sent"
        history = await app.engine.store.load_history("p")
    assert len(effects) == 1  # the second attempt's: the first never ran
    assert lookup.asked == []  # type: ignore[attr-defined]
    assert [(c.status, c.attempts) for c in history] == [(CheckpointStatus.COMPLETED, 2)]


async def test_an_attempt_that_never_began_fails_the_step_as_a_timeout(
    make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app()
    slow_first_marker(app, SHORT.total_seconds() + 0.1, monkeypatch)
    pay, effects = charging(app, retry=tether.Retry(max_attempts=1))
    async with app:
        with pytest.raises(tether.RunFailed) as failed:
            await (await app.start(pay, id="p")).result(timeout=10)
    error = failed.value.error or {}
    assert error.get("type") == "tether.errors.StepTimeout"
    assert "had no time left to start its body" in str(error.get("message"))
    assert effects == []


async def test_a_body_stalled_past_its_deadline_before_it_began_never_begins(
    make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process stalled between the marker and the body's first step (the deadline is
    found passed at once): the body never runs, no hook is asked, and the Retry judges it."""
    from tether.core import doubt

    late, calls = doubt.Bounded.late, [0]

    def stalled_once(self: doubt.Bounded) -> bool:
        calls[0] += 1
        return True if calls[0] == 1 else late(self)

    monkeypatch.setattr(doubt.Bounded, "late", stalled_once)
    app = make_app()
    _, lookup = receiver()
    pay, effects = charging(app, reconcile=lookup, retry=ONE_RETRY)
    async with app:
        assert await (await app.start(pay, id="p")).result(timeout=10) == "sent"
    assert len(effects) == 1
    assert lookup.asked == []  # type: ignore[attr-defined]

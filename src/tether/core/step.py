"""A registered step and how one step call inside a run executes: replay, attempts, retries and
timeouts (at-most-once steps' markers and reconciliation: doubt.py).

Every outcome is recorded before the workflow sees it; on replay the recorded outcome is returned
or re-raised without running the body, and a call with other arguments than the recorded ones
diverges. Nothing new runs before the whole history replayed. Store access goes through the
RunContext only.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from tether.core.context import _RUN, _STEP, StepContext
from tether.core.doubt import (
    NOT_DONE,
    Bounded,
    in_doubt,
    marker,
    reconcile,
    settle_marker,
    unsettled,
    unstarted,
)
from tether.core.execution import Busy, RunContext
from tether.core.observe import StepOutcome
from tether.core.retry import Retry
from tether.core.slot import Slot, arguments
from tether.core.suspension import park, turn
from tether.core.workflow import type_hints
from tether.errors import ConfigurationError, StepInterrupted, StepTimeout
from tether.serde import Serde, encode_error, rebuild_error
from tether.store.port import Checkpoint, CheckpointStatus

P = ParamSpec("P")
R = TypeVar("R")
log = logging.getLogger("tether.runner")

DEFAULT_RETRY = Retry()
# What an at-most-once body raising leaves in doubt by default: its effect may have happened.
IN_DOUBT: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)


class Attempted(Protocol):
    """What the attempt loop needs of a step-like callable (a Step, a transaction step)."""

    name: str
    retry: Retry
    timeout: float | None
    at_most_once: bool
    in_doubt: tuple[type[BaseException], ...]
    return_hint: object


# An attempt whose body and completed checkpoint are committed together (a transaction step):
# called with the attempt's StepContext and the attempt's checkpoint maker, it returns the
# body's value and the COMPLETED checkpoint it wrote; what the body raised propagates.
Commit = Callable[[StepContext, Callable[..., Checkpoint]], Awaitable[tuple[Any, Checkpoint]]]


class Step(Generic[P, R]):
    """A function whose result is checkpointed. Await it inside a workflow; outside a workflow
    awaiting it simply runs the function."""

    def __init__(
        self,
        fn: Callable[P, Awaitable[R]] | Callable[P, R],
        *,
        name: str,
        retry: Retry | None,
        timeout: timedelta | None,
        at_most_once: bool,
        reconcile: Callable[..., object] | None,
        in_doubt: tuple[type[BaseException], ...] = IN_DOUBT,
    ) -> None:
        if retry is not None and not isinstance(retry, Retry):
            raise ConfigurationError(f"retry= takes a tether.Retry, not {retry!r}")
        if timeout is not None and (not isinstance(timeout, timedelta) or timeout <= timedelta(0)):
            raise ConfigurationError(f"step timeout must be a positive timedelta, not {timeout!r}")
        if reconcile is not None and not at_most_once:
            raise ConfigurationError(
                f"step {name!r}: reconcile= only applies with at_most_once=True"
            )
        if at_most_once and timeout is None:
            raise ConfigurationError(
                f"at-most-once step {name!r} needs timeout=, shorter than the lease: another "
                f"worker reconciles it only once an attempt is over for certain, and the "
                f"timeout is what bounds an attempt (e.g. timeout=timedelta(seconds=10))"
            )
        if not isinstance(in_doubt, tuple) or not all(
            isinstance(c, type) and issubclass(c, BaseException) for c in in_doubt
        ):
            raise ConfigurationError(f"in_doubt= takes a tuple of exception types: {in_doubt!r}")
        self.fn = fn
        self.name = name
        self.retry = retry or DEFAULT_RETRY
        self.timeout = None if timeout is None else timeout.total_seconds()
        self.at_most_once = at_most_once
        self.reconcile = reconcile
        self.in_doubt = in_doubt
        self.is_async = inspect.iscoroutinefunction(fn)
        self.return_hint: object = type_hints(fn).get("return", Any)
        self.__name__ = getattr(fn, "__name__", name)
        self.__qualname__ = getattr(fn, "__qualname__", name)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<tether step {self.name!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        ctx = _RUN.get()
        if ctx is None or _STEP.get() is not None:
            # Outside a run, or nested inside another step: an ordinary call, not a checkpoint.
            return self._plain(args, kwargs)
        # The slot is taken at call time, so concurrent calls keep their source order.
        slot = ctx.slot(self.name, "step", arguments(args, kwargs))
        if slot.recorded is None:  # new: straight to its attempts
            return _attempts(self, ctx, slot, 0, args, kwargs)
        return _execute(self, ctx, slot, args, kwargs)

    async def _plain(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
        result = self.fn(*args, **kwargs)
        if inspect.isawaitable(result):
            return await result
        return result


async def _execute(
    step: Attempted,
    ctx: RunContext,
    slot: Slot,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    commit: Commit | None = None,
) -> Any:
    """A step call at `slot`: its recorded outcome, or its attempts. With `commit`, each
    attempt is that function (which runs the body and writes its completion together)."""
    attempts = 0
    recorded = slot.recorded
    if recorded is not None:
        found = await _from_history(step, ctx, slot, args, kwargs, f"result of step {slot.name!r}")
        if found is not NOT_DONE:
            await turn(ctx, slot.seq)  # in the order outcomes reached the tasks (turns.py)
            return found
        attempts = recorded.attempts
        if recorded.status is CheckpointStatus.STARTED and step.at_most_once:
            # An attempt cut short (its worker stopped or died) and reconciled as not done:
            # it failed, and the step's Retry decides as for any failed attempt.
            interrupted = StepInterrupted(
                f"at-most-once step {slot.name!r} attempt {attempts} was cut short (its "
                f"worker stopped, died or lost its lease) and reconciled as not done"
            )
            verdict = await _retry_or_fail(step, ctx, slot, (attempts, recorded.started_at or 0.0),
                                           _UNWATCHED, interrupted)  # fmt: skip
            if verdict.retry_at is None:
                assert verdict.error is not None
                await turn(ctx, slot.seq)
                raise verdict.error
            await wait_until(ctx, verdict.retry_at)
    return await _attempts(step, ctx, slot, attempts, args, kwargs, commit)


async def _mark(
    step: Attempted, ctx: RunContext, slot: Slot, attempts: int, started: float
) -> float:
    """Write an at-most-once attempt's start marker: the attempt is over for certain at
    retry_at (see doubt.py). Returns the time left for its body, which is in flight from now
    (Engine.in_flight: the keepalive's fence)."""
    assert step.timeout is not None
    retry_at = started + step.timeout
    clock = ctx.engine.clock
    await ctx.write(slot.checkpoint(CheckpointStatus.STARTED, attempts=attempts,
                                    started_at=started, retry_at=retry_at,
                                    result=marker(ctx.lease, clock)))  # fmt: skip
    ctx.engine.in_flight[(ctx.run_id, slot.name)] = retry_at
    return retry_at - clock.now()


async def _before_attempt(ctx: RunContext) -> None:
    """No new attempt once the execution ends; none while this worker's leases are not known
    to hold (it was stopped past them: is the run still its own?)."""
    if ctx.ending is not None:
        await ctx.meet_end()
    fence = ctx.engine.fence
    if fence is not None and not fence.holds():
        with Busy(ctx):  # not a wait of the workflow's: the run does not suspend on it
            await fence.confirmed()


async def _attempts(
    step: Attempted,
    ctx: RunContext,
    slot: Slot,
    attempts: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    commit: Commit | None = None,
) -> Any:
    """Attempts of the step's body after the `attempts` made before, each recorded, until one
    completes (its value returned), or one fails for good (raised)."""
    if (
        ctx.ending is not None
        or ctx.unrequested
        or ctx.replay_only
        or ctx.pending
        or ctx.turns.recorded
    ):
        await ctx.before_effect()  # nothing new before the whole history replayed
    clock, serde = ctx.engine.clock, ctx.engine.serde
    what = f"result of step {slot.name!r}"
    while True:
        attempts += 1
        # No attempt once the execution ends, nor while the leases are not known to hold.
        if ctx.ending is not None or ((f := ctx.engine.fence) is not None and not f.holds()):
            await _before_attempt(ctx)
        # This attempt's checkpoint, in whichever status it ends, and who watches it.
        watch = _Watch(ctx, step, slot.name, attempts) if ctx.engine.observer else _UNWATCHED
        started = clock.now()
        try:
            # An at-most-once body gets what is left of its timeout once its marker is written.
            limit = step.timeout
            if step.at_most_once:
                limit = await _mark(step, ctx, slot, attempts, started)
            step_ctx = StepContext(run_id=ctx.run_id, name=slot.name, attempt=attempts)
            # Busy from the body to the record of how it ended: an execution that ends
            # meanwhile (forced replay) lets the attempt finish and record first.
            verdict: _Verdict | None
            done: Checkpoint | None = None
            with Busy(ctx):
                try:
                    if commit is None:
                        assert isinstance(step, Step)
                        value, text = await _attempt(step, step_ctx, args, kwargs, serde, what,
                                                     limit)  # fmt: skip
                    else:  # a transaction step: the body and its checkpoint commit together
                        outcome = functools.partial(slot.checkpoint, attempts=attempts,
                                                    started_at=started)  # fmt: skip
                        value, done = await commit(step_ctx, outcome)
                except Exception as exc:
                    verdict = await _failed(step, ctx, slot, (attempts, started), watch, exc,
                                            args, kwargs)  # fmt: skip
                else:
                    verdict = None
                    if done is None:
                        done = slot.checkpoint(CheckpointStatus.COMPLETED, result=text,
                                               attempts=attempts, started_at=started,
                                               finished_at=clock.now())  # fmt: skip
                        await ctx.write(done)
        except BaseException as exc:
            watch.ended(StepOutcome.INTERRUPTED, exc)  # cancelled, or the run was abandoned
            raise
        if verdict is None and watch is not _UNWATCHED:
            watch.ended(StepOutcome.COMPLETED, None)
        if ctx.engine.settings.force_replay:
            await ctx.replay_now()
        if verdict is not None and verdict.found is NOT_DONE and verdict.retry_at is not None:
            await wait_until(ctx, verdict.retry_at)  # the next attempt, after its delay
            continue
        if slot.seq in ctx.turns.ranked:  # not handed at once (see suspension.at_once)
            await turn(ctx, slot.seq)  # the outcome reaches the task in its turn (turns.py)
        if verdict is None:
            assert done is not None
            return _returned(step, ctx, done, value, what)
        if verdict.found is not NOT_DONE:
            return verdict.found  # reconciled
        assert verdict.error is not None
        raise verdict.error


class _Watch:
    """What watches one attempt (tether.telemetry), told once how the attempt ended."""

    def __init__(self, ctx: RunContext, step: Attempted, name: str, attempt: int) -> None:
        self.clock = ctx.engine.clock
        self.started = self.clock.now()
        self.observer = ctx.engine.observer
        self.told = False
        if self.observer is not None:
            self.token = self.observer.step_started(ctx.run_id, ctx.workflow, step.name, name,
                                                    attempt)  # fmt: skip

    def ended(self, how: StepOutcome, error: BaseException | None) -> None:
        if not self.told and self.observer is not None:
            self.told = True
            self.observer.step_ended(self.token, how, self.clock.now() - self.started, error)


class _Unwatched:
    """The watch of an attempt nothing observes."""

    def ended(self, how: StepOutcome, error: BaseException | None) -> None:
        pass


_UNWATCHED = _Unwatched()


@dataclass(frozen=True, slots=True)
class _Verdict:
    """How a failed attempt ends: a result a reconcile hook found, another attempt due at
    retry_at, or the error to raise (recorded)."""

    found: object = NOT_DONE
    retry_at: float | None = None
    error: BaseException | None = None


async def _failed(
    step: Attempted,
    ctx: RunContext,
    slot: Slot,
    attempt: tuple[int, float],
    watch: _Watch | _Unwatched,
    exc: Exception,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> _Verdict:
    """Attempt (its number, when it started) raised `exc`: an at-most-once attempt in doubt
    is reconciled (the hook's result, recorded); else the retry (recorded RETRYING) or the
    failure (recorded FAILED)."""
    attempts, _ = attempt
    error = _attempt_error(step, slot.name, attempts, exc)
    if step.at_most_once and in_doubt(step, error):
        # Its effect may have happened: never retried blindly; the hook says.
        found = await reconcile(step, ctx, slot, attempts, args, kwargs)
        if found is not NOT_DONE:
            watch.ended(StepOutcome.COMPLETED, None)
            return _Verdict(found=found)
    verdict = await _retry_or_fail(step, ctx, slot, attempt, watch, error)
    if error is not exc:
        error.__cause__ = exc
    return verdict


async def _retry_or_fail(
    step: Attempted,
    ctx: RunContext,
    slot: Slot,
    attempt: tuple[int, float],
    watch: _Watch | _Unwatched,
    error: Exception,
) -> _Verdict:
    """Attempt (its number, when it started) failed with `error`: the retry the step's policy
    gives (recorded RETRYING), or the failure (recorded FAILED)."""
    clock = ctx.engine.clock
    attempts, started = attempt
    outcome = functools.partial(slot.checkpoint, attempts=attempts, started_at=started)
    finished = clock.now()
    if step.retry.retries(error, attempts):
        retry_at = finished + _retry_delay(step, error, attempts)
        await ctx.write(outcome(status=CheckpointStatus.RETRYING, error=_error(error),
                                finished_at=finished, retry_at=retry_at))  # fmt: skip
        watch.ended(StepOutcome.RETRYING, error)
        return _Verdict(retry_at=retry_at)
    await ctx.write(outcome(status=CheckpointStatus.FAILED, error=_error(error),
                            finished_at=finished))  # fmt: skip
    watch.ended(StepOutcome.FAILED, error)
    ctx.failed_at(error, slot.position)
    return _Verdict(error=error)


_SCALARS = frozenset({int, float, str, bool, type(None)})


def _returned(step: Attempted, ctx: RunContext, done: Checkpoint, value: Any, what: str) -> Any:
    """What a completed attempt gives back: what replay would give, the value rebuilt from
    its JSON (tuples become lists...); so a value that does not fit the step's type hint
    stops the execution as it would on replay."""
    hint = step.return_hint
    if type(value) in _SCALARS and (hint is Any or hint is type(value)):
        return value
    serde = ctx.engine.serde
    return ctx.decode(done, lambda: serde.loads(done.result or "null", hint, what=what))


async def _from_history(
    step: Attempted,
    ctx: RunContext,
    slot: Slot,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    what: str,
) -> object:
    """A step call whose position the history holds: its recorded outcome (returned, or
    raised), or NOT_DONE when another attempt is due (once a recorded retry delay has passed,
    or a started at-most-once attempt was reconciled as not done)."""
    recorded = slot.recorded
    assert recorded is not None
    if recorded.status is CheckpointStatus.COMPLETED:
        serde = ctx.engine.serde
        return ctx.decode(
            recorded, lambda: serde.loads(recorded.result or "null", step.return_hint, what=what)
        )
    if recorded.status is CheckpointStatus.FAILED:
        error = rebuild_error(ctx.decode(recorded, lambda: json.loads(recorded.error or "{}")))
        ctx.failed_at(error, slot.position)
        await turn(ctx, slot.seq)
        raise error
    if recorded.status is CheckpointStatus.RETRYING:
        if recorded.retry_at is not None:
            await wait_until(ctx, recorded.retry_at)
        if unsettled(step, recorded):  # resumed after its hook failed: ask it again first
            await ctx.at_frontier()
            return await _reconciled(ctx, reconcile(step, ctx, slot, recorded.attempts, args,
                                                    kwargs))  # fmt: skip
    elif recorded.status is CheckpointStatus.STARTED and step.at_most_once:
        return await _reconciled(ctx, settle_marker(step, ctx, slot, args, kwargs))
    return NOT_DONE


async def _reconciled(ctx: RunContext, asked: Awaitable[object]) -> object:
    """What reconciling found; the forced-replay mode replays after a result it recorded."""
    found = await asked
    if found is not NOT_DONE and ctx.engine.settings.force_replay:
        await ctx.replay_now()
    return found


def _attempt_error(step: Attempted, name: str, attempts: int, exc: Exception) -> Exception:
    """What a failed attempt records: its exception, or StepTimeout for a timeout."""
    if not isinstance(exc, TimeoutError) or isinstance(exc, StepTimeout):
        return exc
    return StepTimeout(
        f"step {name!r} attempt {attempts} ran past its timeout of {step.timeout}s; "
        f"raise timeout= or make the step faster"
    )


def _retry_delay(step: Attempted, error: Exception, attempts: int) -> float:
    delay = step.retry.delay(attempts, secrets.randbits(32) / (1 << 32))
    # A provider that says when to come back (HTTP Retry-After) is believed.
    asked = getattr(error, "retry_after", None)
    if isinstance(asked, int | float) and not isinstance(asked, bool) and asked > delay:
        delay = float(asked)
    return delay


def _error(exc: BaseException) -> str:
    return json.dumps(encode_error(exc))


async def _attempt(
    step: Step[..., Any],
    step_ctx: StepContext,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    serde: Serde,
    what: str,
    limit: float | None,
) -> tuple[Any, str]:
    """One attempt: the body (given `limit` seconds, None: no timeout), its result's JSON,
    then what the attempt attached settles (its finalizers, told how it ended), all before
    the attempt's checkpoint is written."""
    try:
        if step.is_async and limit is None:  # the common case, without a frame more
            token = _STEP.set(step_ctx)
            try:
                value = await step.fn(*args, **kwargs)
            finally:
                _STEP.reset(token)
        else:
            value = await _run_body(step, step_ctx, args, kwargs, limit)
        text = serde.dumps(value, what=what)
    except BaseException as exc:
        await step_ctx.finish(exc)
        raise
    if step_ctx.finalizers:
        await step_ctx.finish(None)
    return value, text


async def _run_body(
    step: Step[..., Any],
    step_ctx: StepContext,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    limit: float | None,
) -> Any:
    run = _RUN.get()
    # An at-most-once body is in flight (see _mark) until it ended here; a thread's end
    # says so itself (Engine.track), since the thread may outlive this call.
    landed = (run.engine.in_flight if run is not None and step.at_most_once else {}).pop
    key = (step_ctx.run_id, step_ctx.name)
    if limit is not None and limit <= 0:  # its marker took all its time: it never starts
        landed(key, None)
        raise unstarted(step_ctx.name)
    if step.is_async:
        token = _STEP.set(step_ctx)
        try:
            body = step.fn(*args, **kwargs)
            if limit is None:
                return await body
            if run is not None and step.at_most_once and inspect.iscoroutine(body):
                body = Bounded(body, limit, step_ctx.name, run.engine.clock)  # never late
            async with asyncio.timeout(limit):
                return await body
        finally:
            _STEP.reset(token)
            landed(key, None)
    tracked = None if run is None else run.engine.track((run.run_id, step_ctx.name))
    context = contextvars.copy_context()
    context.run(_STEP.set, step_ctx)

    def call() -> Any:
        try:
            return context.run(step.fn, *args, **kwargs)
        finally:
            if tracked is not None:
                tracked.end()

    thread = asyncio.get_running_loop().run_in_executor(None, call)
    if limit is None:
        return await thread
    try:
        async with asyncio.timeout(limit):
            return await asyncio.shield(thread)
    except TimeoutError:
        if not step.at_most_once:
            raise  # the thread cannot be stopped, only abandoned: the step is retried
    # An at-most-once body is never abandoned: its thread's outcome is the attempt's (and
    # while it runs, its worker keeps its lease or stops: see keepalive.Fence).
    log.warning("at-most-once step %r ran past its timeout of %ss; a thread cannot be stopped, "
                "so the run waits for its outcome", step_ctx.name, step.timeout)  # fmt: skip
    return await asyncio.shield(thread)


async def wait_until(ctx: RunContext, when: float) -> None:
    """Wait durably until `when`: a short wait holds the run in memory; a longer one lets it
    suspend (when the whole workflow waits) and wakes it then."""
    clock = ctx.engine.clock
    while clock.now() < when:
        await park(ctx, deadline=when)

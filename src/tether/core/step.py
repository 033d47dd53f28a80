"""A registered step and how one step call inside a run executes: replay, attempts, retries,
timeouts, at-most-once markers and reconciliation.

Every outcome is recorded before the workflow sees it; on replay the recorded outcome is returned
or re-raised without running the body. Store access goes through the RunContext only.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import secrets
from collections.abc import Awaitable, Callable, Coroutine
from datetime import timedelta
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from tether.core.context import _RUN, _STEP, ReplayNow, RunContext, StepContext, Suspend
from tether.core.observe import StepOutcome
from tether.core.retry import Retry
from tether.core.workflow import type_hints
from tether.errors import ConfigurationError, StepOutcomeUnknown, StepTimeout
from tether.serde import Serde, encode_error, rebuild_error
from tether.store.base import Checkpoint, CheckpointStatus

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_RETRY = Retry()


class Attempted(Protocol):
    """What the attempt loop needs of a step-like callable (a Step, a transaction step)."""

    name: str
    retry: Retry
    timeout: float | None
    at_most_once: bool
    return_hint: object


# An attempt whose body and completed checkpoint are committed together (a transaction step):
# called with the attempt's StepContext and the attempt's checkpoint maker, it returns the
# body's value and the COMPLETED checkpoint it wrote; what the body raised propagates.
Commit = Callable[[StepContext, Callable[..., Checkpoint]], Awaitable[tuple[Any, Checkpoint]]]


class _NotDone:
    """Returned by a reconcile hook: the effect did not happen, so the step body runs."""

    _instance: _NotDone | None = None

    def __new__(cls) -> _NotDone:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "tether.NOT_DONE"


NOT_DONE = _NotDone()


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
    ) -> None:
        if retry is not None and not isinstance(retry, Retry):
            raise ConfigurationError(f"retry= takes a tether.Retry, not {retry!r}")
        if timeout is not None and (not isinstance(timeout, timedelta) or timeout <= timedelta(0)):
            raise ConfigurationError(f"step timeout must be a positive timedelta, not {timeout!r}")
        if reconcile is not None and not at_most_once:
            raise ConfigurationError(
                f"step {name!r}: reconcile= only applies with at_most_once=True"
            )
        self.fn = fn
        self.name = name
        self.retry = retry or DEFAULT_RETRY
        self.timeout = None if timeout is None else timeout.total_seconds()
        self.at_most_once = at_most_once
        self.reconcile = reconcile
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
        seq, name, recorded = ctx.slot(self.name, "step")
        return _execute(self, ctx, seq, name, recorded, args, kwargs)

    async def _plain(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
        result = self.fn(*args, **kwargs)
        if inspect.isawaitable(result):
            return await result
        return result


async def _execute(
    step: Attempted,
    ctx: RunContext,
    seq: int,
    name: str,
    recorded: Checkpoint | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    kind: str = "step",
    commit: Commit | None = None,
) -> Any:
    """A step call at position `seq`: its recorded outcome, or its attempts. With `commit`,
    each attempt is that function (which runs the body and writes its completion together)."""
    what = f"result of step {name!r}"
    attempts = 0
    if recorded is not None:
        found = await _from_history(step, ctx, seq, name, recorded, args, kwargs, what)
        if found is not NOT_DONE:
            return found
        attempts = recorded.attempts
    if ctx.pending:
        await ctx.flush()
    return await _attempts(step, ctx, seq, name, attempts, args, kwargs, what, kind, commit)


async def _attempts(
    step: Attempted,
    ctx: RunContext,
    seq: int,
    name: str,
    attempts: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    what: str,
    kind: str = "step",
    commit: Commit | None = None,
) -> Any:
    """Attempts of the step's body after the `attempts` made before, each recorded, until one
    completes (its value returned), or one fails for good (raised)."""
    clock, serde = ctx.engine.clock, ctx.engine.serde
    # None unless something watches (tether.telemetry): then each attempt is told to it, and
    # `watch` holds what it returned for the attempt until the attempt ends.
    observer = ctx.engine.observer
    while True:
        attempts += 1
        started = clock.now()
        told = False  # whether the observer heard how this attempt ended

        # This attempt's checkpoint, in whichever status it ends.
        outcome = functools.partial(
            Checkpoint, seq=seq, name=name, kind=kind, attempts=attempts, started_at=started
        )
        if observer is not None:
            watch = observer.step_started(ctx.run_id, ctx.workflow, step.name, name, attempts)
        try:
            if step.at_most_once:
                await ctx.write(outcome(status=CheckpointStatus.STARTED))
            ctx.enter_body()
            try:
                step_ctx = StepContext(run_id=ctx.run_id, name=name, attempt=attempts)
                value, text, done = await _body(step, step_ctx, outcome, (args, kwargs, serde),
                                                what, commit)  # fmt: skip
            except Exception as exc:
                error = _attempt_error(step, name, attempts, exc)
                if step.retry.retries(error, attempts):
                    finished = clock.now()
                    retry_at = finished + _retry_delay(step, error, attempts)
                    await ctx.write(outcome(status=CheckpointStatus.RETRYING, error=_error(error),
                                            finished_at=finished, retry_at=retry_at))  # fmt: skip
                    if observer is not None:
                        told = True
                        observer.step_ended(watch, StepOutcome.RETRYING, finished - started, error)
                    await _wait_until(ctx, retry_at)
                    continue
                finished = clock.now()
                await ctx.write(outcome(status=CheckpointStatus.FAILED, error=_error(error),
                                        finished_at=finished))  # fmt: skip
                if observer is not None:
                    told = True
                    observer.step_ended(watch, StepOutcome.FAILED, finished - started, error)
                _replay_if_forced(ctx)
                if error is exc:
                    raise
                raise error from exc
            finally:
                ctx.leave_body()
            finished = clock.now()
            done = await _completed(ctx, outcome, text, finished, done)
        except BaseException as exc:
            if observer is not None and not told:  # cancelled, or the run was abandoned
                observer.step_ended(watch, StepOutcome.INTERRUPTED, clock.now() - started, exc)
            raise
        if observer is not None:
            observer.step_ended(watch, StepOutcome.COMPLETED, finished - started, None)
        _replay_if_forced(ctx)
        return _returned(step, ctx, done, value, what)


async def _body(
    step: Attempted,
    step_ctx: StepContext,
    outcome: Callable[..., Checkpoint],
    call: tuple[tuple[Any, ...], dict[str, Any], Serde],
    what: str,
    commit: Commit | None,
) -> tuple[Any, str, Checkpoint | None]:
    """One attempt's body: (its value, the value's JSON, the completed checkpoint when the
    attempt wrote it with the body (`commit`), else None: it is written after). `call` holds
    the step's arguments and the serializer."""
    if commit is None:
        assert isinstance(step, Step)
        args, kwargs, serde = call
        value, text = await _attempt(step, step_ctx, args, kwargs, serde, what)
        return value, text, None
    value, done = await commit(step_ctx, outcome)
    return value, done.result or "null", done


async def _completed(
    ctx: RunContext,
    outcome: Callable[..., Checkpoint],
    text: str,
    finished: float,
    written: Checkpoint | None,
) -> Checkpoint:
    """The attempt's completed checkpoint: written now, unless the attempt wrote it with its
    body (a transaction step)."""
    if written is not None:
        return written
    done = outcome(status=CheckpointStatus.COMPLETED, result=text, finished_at=finished)
    await ctx.write(done)
    return done


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
    seq: int,
    name: str,
    recorded: Checkpoint,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    what: str,
) -> object:
    """A step call whose position the history holds: its recorded outcome (returned, or
    raised), or NOT_DONE when another attempt is due (once a recorded retry delay has passed,
    or a started at-most-once attempt was reconciled as not done)."""
    if recorded.status is CheckpointStatus.COMPLETED:
        serde = ctx.engine.serde
        return ctx.decode(
            recorded, lambda: serde.loads(recorded.result or "null", step.return_hint, what=what)
        )
    if recorded.status is CheckpointStatus.FAILED:
        raise rebuild_error(ctx.decode(recorded, lambda: json.loads(recorded.error or "{}")))
    if recorded.status is CheckpointStatus.RETRYING and recorded.retry_at is not None:
        await _wait_until(ctx, recorded.retry_at)
    elif recorded.status is CheckpointStatus.STARTED and isinstance(step, Step):
        return await _reconcile(step, ctx, seq, name, recorded.attempts, args, kwargs)
    return NOT_DONE


def _attempt_error(step: Attempted, name: str, attempts: int, exc: Exception) -> Exception:
    """What a failed attempt records: its exception, or StepTimeout for a timeout."""
    if not isinstance(exc, TimeoutError):
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


def _replay_if_forced(ctx: RunContext) -> None:
    if ctx.engine.settings.force_replay:
        raise ReplayNow()


async def _attempt(
    step: Step[..., Any],
    step_ctx: StepContext,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    serde: Serde,
    what: str,
) -> tuple[Any, str]:
    """One attempt: the body, its result's JSON, then what the attempt attached settles (its
    finalizers, told how it ended), all before the attempt's checkpoint is written."""
    try:
        value = await _run_body(step, step_ctx, args, kwargs)
        text = serde.dumps(value, what=what)
    except BaseException as exc:
        await step_ctx.finish(exc)
        raise
    await step_ctx.finish(None)
    return value, text


async def _run_body(
    step: Step[..., Any], step_ctx: StepContext, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if step.is_async:
        token = _STEP.set(step_ctx)
        try:
            if step.timeout is None:
                return await step.fn(*args, **kwargs)
            async with asyncio.timeout(step.timeout):
                return await step.fn(*args, **kwargs)
        finally:
            _STEP.reset(token)
    context = contextvars.copy_context()
    context.run(_STEP.set, step_ctx)
    call = functools.partial(context.run, step.fn, *args, **kwargs)
    # A sync body runs in a thread; on timeout the thread cannot be stopped, only abandoned.
    async with asyncio.timeout(step.timeout):
        return await asyncio.get_running_loop().run_in_executor(None, call)


async def _reconcile(
    step: Step[..., Any],
    ctx: RunContext,
    seq: int,
    name: str,
    attempts: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> object:
    """An at-most-once step was started and never finished: ask the hook what happened."""
    clock = ctx.engine.clock
    if step.reconcile is None:
        error = StepOutcomeUnknown(
            f"at-most-once step {name!r} of run {ctx.run_id!r} started (attempt {attempts}) but "
            f"its outcome was never recorded; check whether its effect happened (idempotency "
            f"key {StepContext(ctx.run_id, name, attempts).idempotency_key}), then resume or "
            f"fail the run. A reconcile= hook on the step automates this."
        )
        await ctx.write(
            Checkpoint(seq=seq, name=name, kind="step", status=CheckpointStatus.FAILED,
                       error=_error(error), attempts=attempts, finished_at=clock.now())
        )  # fmt: skip
        raise error
    step_ctx = StepContext(run_id=ctx.run_id, name=name, attempt=attempts)
    token = _STEP.set(step_ctx)
    try:
        outcome = step.reconcile(*args, **kwargs)
        if inspect.isawaitable(outcome):
            outcome = await outcome
    except BaseException as exc:
        await step_ctx.finish(exc)
        raise
    finally:
        _STEP.reset(token)
    await step_ctx.finish(None)
    if outcome is NOT_DONE:
        return NOT_DONE
    serde = ctx.engine.serde
    text = serde.dumps(outcome, what=f"reconciled result of step {name!r}")
    await ctx.write(
        Checkpoint(seq=seq, name=name, kind="step", status=CheckpointStatus.COMPLETED,
                   result=text, attempts=attempts, finished_at=clock.now())
    )  # fmt: skip
    return serde.loads(text, step.return_hint)


async def _wait_until(ctx: RunContext, when: float) -> None:
    """Wait durably: short waits keep the lease; longer ones release the run until `when`."""
    clock = ctx.engine.clock
    remaining = when - clock.now()
    if remaining <= 0:
        return
    if remaining > ctx.engine.settings.inline_wait_max:
        raise Suspend(when)
    await clock.sleep(remaining)

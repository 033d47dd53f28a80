"""At-most-once steps whose outcome is in doubt: a start marker without an outcome (a crash, a
lost lease), or an attempt that ended in a timeout, a cancellation or a lost connection.

Such an attempt is never retried blindly. Once it is over for certain (its worker is known
gone, or its timeout passed since the marker), the step's `reconcile` hook says what happened
(a result, or NOT_DONE so the body runs); without a hook the step fails with
StepOutcomeUnknown. An async body is never resumed past its deadline, even by a process that
was stalled (SIGSTOP, a blocked loop): its deadline is checked at every resumption. Store
access goes through the RunContext only.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, NoReturn

from tether.core.context import _STEP, StepContext
from tether.core.execution import RunContext
from tether.core.lease import gone
from tether.core.slot import Slot
from tether.core.suspension import park, turn
from tether.errors import StepOutcomeUnknown, StepTimeout
from tether.serde import encode_error
from tether.store.port import Checkpoint, CheckpointStatus, Lease

if TYPE_CHECKING:
    from tether.core.step import Attempted


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


_UNSTARTED = "_tether_unstarted"  # the attribute that marks unstarted()'s errors


def in_doubt(step: Attempted, error: BaseException) -> bool:
    """Whether an attempt that raised `error` may have had its effect all the same: not one
    whose body never began (unstarted)."""
    if getattr(error, _UNSTARTED, False):
        return False
    return isinstance(error, (StepTimeout, *step.in_doubt))


def unstarted(name: str) -> StepTimeout:
    """The timeout of an at-most-once attempt whose body never began, its deadline passed
    before it could (its start marker took that long to write, or the process stalled): a
    failed attempt like any other, which the step's Retry judges."""
    error = StepTimeout(
        f"at-most-once step {name!r} had no time left to start its body: its timeout passed "
        f"while its start marker was written (or the process stalled); the attempt failed "
        f"without running, and the step's retry policy decides (raise timeout= if the "
        f"database is often this slow)"
    )
    setattr(error, _UNSTARTED, True)  # read at the attempt only: a replay raises it as stored
    return error


async def settle_marker(
    step: Attempted,
    ctx: RunContext,
    slot: Slot,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> object:
    """The history holds the start marker of an attempt with no outcome: wait until that
    attempt is over for certain, then reconcile it."""
    recorded = slot.recorded
    assert recorded is not None
    await ctx.at_frontier()
    if not await _over(ctx, recorded):
        clock = ctx.engine.clock
        when = over_at(recorded, clock)  # _over is true for markers without a deadline
        while clock.now() < when:
            await park(ctx, deadline=when)
    return await reconcile(step, ctx, slot, recorded.attempts, args, kwargs)


def unsettled(step: Attempted, recorded: Checkpoint) -> bool:
    """Whether a RETRYING checkpoint is an at-most-once attempt still in doubt: its failure
    was that it could not be reconciled (the hook failed), and `app.resume` asked for another
    go; so the hook is asked again before any new attempt. (Without a hook, resuming is the
    operator's word that the effect did not happen: the next attempt runs.)"""
    if not step.at_most_once or getattr(step, "reconcile", None) is None:
        return False
    try:
        error = json.loads(recorded.error or "{}")
    except ValueError:
        return False
    return isinstance(error, dict) and error.get("in_doubt") is True


def marker(lease: Lease, clock: Any) -> str:
    """The result of an at-most-once start marker: the lease its attempt runs under, and how
    far its worker's clock may be off the database's (added to the wait for its deadline)."""
    slack = round(getattr(clock, "uncertainty", 0.0), 6)
    return json.dumps({"owner": lease.worker_id, "epoch": lease.epoch, "slack": slack})


def _marked(recorded: Checkpoint) -> tuple[str | None, float]:
    """The worker whose attempt a start marker records (None: an older marker), and its
    clock's slack."""
    try:
        found = json.loads(recorded.result or "null")
    except ValueError:
        return None, 0.0
    if not isinstance(found, dict):
        return None, 0.0
    owner, slack = found.get("owner"), found.get("slack")
    slack = float(slack) if isinstance(slack, int | float) and slack >= 0 else 0.0
    return (owner if isinstance(owner, str) else None), slack


def over_at(recorded: Checkpoint, clock: Any) -> float:
    """When, on this worker's clock, the marker's attempt is over for certain by its deadline:
    retry_at, plus how far either worker's clock may be off the database's."""
    assert recorded.retry_at is not None
    _, slack = _marked(recorded)
    return recorded.retry_at + slack + getattr(clock, "uncertainty", 0.0)


async def _over(ctx: RunContext, recorded: Checkpoint) -> bool:
    """Whether the marker's attempt is over for certain without waiting: this worker's own
    (once its thread, if any, ended), its time is up, or its worker is gone (its row released
    or deleted, or its process dead on this machine). A marker of an older version, without
    owner or deadline, counts as over."""
    owner, _ = _marked(recorded)
    if owner is None or recorded.retry_at is None:
        return True
    if owner == ctx.lease.worker_id:
        # This worker's own earlier execution: over once its thread (if any) has ended,
        # whatever its deadline says (a sync body past its timeout still runs).
        await ctx.engine.thread_over((ctx.run_id, recorded.name))
        return True
    if ctx.engine.clock.now() >= over_at(recorded, ctx.engine.clock):
        return True
    with ctx.io():
        workers = await ctx.engine.store.list_workers()
    return gone(owner, workers)


async def reconcile(
    step: Attempted,
    ctx: RunContext,
    slot: Slot,
    attempts: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> object:
    """Ask the step's hook what happened to attempt `attempts` (over now): its result
    (recorded, returned), or NOT_DONE. Without a hook the step fails with StepOutcomeUnknown;
    when the hook fails (or outlasts the step's timeout: TimeoutError), with its error. Either
    is recorded as in doubt: replay raises it again, and `app.resume` asks the hook again."""
    hook = getattr(step, "reconcile", None)
    key = StepContext(ctx.run_id, slot.name, attempts).idempotency_key
    if hook is None:
        await _unknown(ctx, slot, attempts, StepOutcomeUnknown(
            f"at-most-once step {slot.name!r} of run {ctx.run_id!r} started (attempt "
            f"{attempts}) but its outcome is unknown; check whether its effect happened "
            f"(idempotency key {key}), then resume or fail the run. A reconcile= hook on "
            f"the step automates this."
        ))  # fmt: skip
    step_ctx = StepContext(run_id=ctx.run_id, name=slot.name, attempt=attempts)
    serde, clock = ctx.engine.serde, ctx.engine.clock
    with ctx.io():  # the hook's look-up, then its finding recorded
        try:
            outcome = await _ask(hook, step, step_ctx, args, kwargs)
        except Exception as exc:  # the step fails with it, and resuming asks the hook again
            await step_ctx.finish(exc)
            await _unknown(ctx, slot, attempts, exc)
        except BaseException as exc:
            await step_ctx.finish(exc)
            raise
        await step_ctx.finish(None)
        if outcome is NOT_DONE:
            return NOT_DONE
        text = serde.dumps(outcome, what=f"reconciled result of step {slot.name!r}")
        done = slot.checkpoint(CheckpointStatus.COMPLETED, result=text, attempts=attempts,
                               finished_at=clock.now())  # fmt: skip
        await ctx.write(done)
    what = f"reconciled result of step {slot.name!r}"
    return ctx.decode(done, lambda: serde.loads(text, step.return_hint, what=what))


async def _ask(
    hook: Callable[..., object],
    step: Attempted,
    step_ctx: StepContext,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> object:
    """The hook's answer, within the step's timeout; a sync hook runs in a thread (it asks a
    service: the worker's loop is not blocked meanwhile)."""
    token = _STEP.set(step_ctx)
    try:
        async with asyncio.timeout(step.timeout):
            if inspect.iscoroutinefunction(hook):
                return await hook(*args, **kwargs)
            context = contextvars.copy_context()
            call = functools.partial(context.run, hook, *args, **kwargs)
            outcome = await asyncio.get_running_loop().run_in_executor(None, call)
            if inspect.isawaitable(outcome):
                outcome = await outcome
            return outcome
    finally:
        _STEP.reset(token)


async def _unknown(ctx: RunContext, slot: Slot, attempts: int, error: Exception) -> NoReturn:
    """Fail the step with `error` (StepOutcomeUnknown, or what its hook raised), recorded as
    in doubt (see unsettled): replay raises it again, whatever the hook would say now."""
    stored = encode_error(error) | {"in_doubt": True}
    await ctx.write(slot.checkpoint(CheckpointStatus.FAILED, attempts=attempts,
                                    error=json.dumps(stored),
                                    finished_at=ctx.engine.clock.now()))  # fmt: skip
    ctx.failed_at(error, slot.position)
    await turn(ctx, slot.seq)  # an outcome like any other (turns.py)
    raise error


class Bounded:
    """An at-most-once step's async body, driven so that it is never resumed past its
    deadline: a process stalled inside it (SIGSTOP, an event loop blocked by a sync call)
    meets a TimeoutError at its next await instead of completing an effect that another worker
    may be reconciling by now. The deadline is on the loop's monotonic clock (like
    asyncio.timeout), which a stall does not stop."""

    def __init__(
        self, body: Coroutine[Any, Any, Any], seconds: float, name: str, clock: Any
    ) -> None:
        self.body = body
        self.loop = asyncio.get_running_loop()
        self.deadline = self.loop.time() + seconds
        # The same deadline on the engine's clock, which the marker's retry_at is on: a clock
        # that steps forward (SQLite's is the machine's) ends the body early, never late.
        self.clock, self.until = clock, clock.now() + seconds
        self.name = name

    def late(self) -> bool:
        return self.loop.time() > self.deadline or self.clock.now() > self.until

    def __await__(self) -> Generator[Any, Any, Any]:
        body = self.body
        value: Any = None
        error: BaseException | None = None
        if self.late():  # stalled before it began: it never does
            body.close()
            raise unstarted(self.name)
        while True:
            try:
                yielded = body.send(value) if error is None else body.throw(error)
            except StopIteration as stop:
                return stop.value
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                body.close()
                raise
            except BaseException as exc:
                value, error = None, exc
            if error is None and self.late():
                error = TimeoutError(f"at-most-once step {self.name!r} is past its deadline")

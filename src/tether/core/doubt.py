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
import inspect
import json
from collections.abc import Coroutine, Generator
from typing import TYPE_CHECKING, Any

from tether.core.context import _STEP, StepContext
from tether.core.execution import RunContext, Slot
from tether.core.lease import gone
from tether.core.suspension import park
from tether.errors import StepOutcomeUnknown, StepTimeout
from tether.serde import encode_error
from tether.store.base import Checkpoint, CheckpointStatus

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


def in_doubt(step: Attempted, error: BaseException) -> bool:
    """Whether an attempt that raised `error` may have had its effect all the same."""
    return isinstance(error, (StepTimeout, *step.in_doubt))


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
        when = recorded.retry_at
        assert when is not None  # _over is true for markers without one
        clock = ctx.engine.clock
        while clock.now() < when:
            await park(ctx, deadline=when)
    return await reconcile(step, ctx, slot, recorded.attempts, args, kwargs)


def marker(owner: str, epoch: int) -> str:
    """The result of an at-most-once start marker: the lease its attempt ran under."""
    return json.dumps({"owner": owner, "epoch": epoch})


def _owner(recorded: Checkpoint) -> str | None:
    """The worker whose attempt a start marker records, or None (an older marker)."""
    try:
        found = json.loads(recorded.result or "null")
    except ValueError:
        return None
    owner = found.get("owner") if isinstance(found, dict) else None
    return owner if isinstance(owner, str) else None


async def _over(ctx: RunContext, recorded: Checkpoint) -> bool:
    """Whether the marker's attempt is over for certain without waiting: its time is up, or
    its worker is gone (its row released or deleted, or its process dead on this machine).
    A marker of an older version, without owner or deadline, counts as over."""
    owner = _owner(recorded)
    if owner is None or recorded.retry_at is None:
        return True
    if ctx.engine.clock.now() >= recorded.retry_at:
        return True
    if owner == ctx.lease.worker_id:
        # This worker's own earlier execution: over once its thread (if any) has ended.
        await ctx.engine.thread_over((ctx.run_id, recorded.name))
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
    (recorded, returned), or NOT_DONE; without a hook, fail with StepOutcomeUnknown."""
    clock = ctx.engine.clock
    hook = getattr(step, "reconcile", None)
    if hook is None:
        error = StepOutcomeUnknown(
            f"at-most-once step {slot.name!r} of run {ctx.run_id!r} started (attempt "
            f"{attempts}) but its outcome is unknown; check whether its effect happened "
            f"(idempotency key {StepContext(ctx.run_id, slot.name, attempts).idempotency_key}), "
            f"then resume or fail the run. A reconcile= hook on the step automates this."
        )
        await ctx.write(slot.checkpoint(CheckpointStatus.FAILED, attempts=attempts,
                                        error=json.dumps(encode_error(error)),
                                        finished_at=clock.now()))  # fmt: skip
        ctx.failed_at(error, slot.position)
        raise error
    step_ctx = StepContext(run_id=ctx.run_id, name=slot.name, attempt=attempts)
    with ctx.io():  # the hook's look-up, then its finding recorded
        token = _STEP.set(step_ctx)
        try:
            outcome = hook(*args, **kwargs)
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
        text = serde.dumps(outcome, what=f"reconciled result of step {slot.name!r}")
        await ctx.write(slot.checkpoint(CheckpointStatus.COMPLETED, result=text,
                                        attempts=attempts, finished_at=clock.now()))  # fmt: skip
    return serde.loads(text, step.return_hint)


class Bounded:
    """An at-most-once step's async body, driven so that it is never resumed past its
    deadline: a process stalled inside it (SIGSTOP, an event loop blocked by a sync call)
    meets a TimeoutError at its next await instead of completing an effect that another worker
    may be reconciling by now. The deadline is on the loop's monotonic clock (like
    asyncio.timeout), which a stall does not stop."""

    def __init__(self, body: Coroutine[Any, Any, Any], seconds: float, name: str) -> None:
        self.body = body
        self.loop = asyncio.get_running_loop()
        self.deadline = self.loop.time() + seconds
        self.name = name

    def __await__(self) -> Generator[Any, Any, Any]:
        body = self.body
        value: Any = None
        error: BaseException | None = None
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
            if error is None and self.loop.time() > self.deadline:
                error = TimeoutError(f"at-most-once step {self.name!r} is past its deadline")

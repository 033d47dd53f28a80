"""Where code runs: in which run's execution, and in which step attempt.

Context variables carry it: workflow code and the recorded helpers find their run through
`current_run`, steps their idempotency key through their StepContext. It does no I/O and
holds no policy; the execution's state lives in RunContext (execution.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tether.errors import NotInWorkflow

if TYPE_CHECKING:
    from tether.core.execution import RunContext


# Told how a step attempt's body ended (None: it returned; else what it raised), before the
# attempt's checkpoint is written: what was attached to the attempt settles (a stream writer
# flushes its buffered chunks, or retracts them). An Exception means the attempt failed; any
# other BaseException (a cancellation, a lost lease) that it is being interrupted: no store
# writes then.
Finalizer = Callable[[BaseException | None], Awaitable[None]]


@dataclass(slots=True)
class StepContext:
    run_id: str
    name: str
    attempt: int
    finalizers: list[Finalizer] = field(default_factory=list)
    # What helpers above core attach to this attempt, by a key of their own.
    attached: dict[object, object] = field(default_factory=dict)

    @property
    def idempotency_key(self) -> str:
        return idempotency_key_for(self.run_id, self.name)

    async def finish(self, error: BaseException | None) -> None:
        """Await the finalizers, in the order they were added, each once."""
        finalizers, self.finalizers = self.finalizers, []
        for finalizer in finalizers:
            await finalizer(error)


def idempotency_key_for(run_id: str, checkpoint_name: str) -> str:
    digest = hashlib.sha256(f"{len(run_id)}:{run_id}:{checkpoint_name}".encode()).hexdigest()
    return f"tether-{digest[:40]}"


_RUN: ContextVar[RunContext | None] = ContextVar("tether_run", default=None)
_STEP: ContextVar[StepContext | None] = ContextVar("tether_step", default=None)


def current_run(helper: str) -> RunContext:
    ctx = _RUN.get()
    if ctx is None or _STEP.get() is not None:
        raise NotInWorkflow(
            f"tether.{helper}() only works inside a running workflow (not in a step or outside "
            f"a run); inside a step use ordinary Python, its result is recorded as a whole"
        )
    return ctx


def current_step() -> StepContext | None:
    return _STEP.get()


def current_scope(helper: str) -> tuple[RunContext, StepContext | None]:
    """The run being executed and, inside one of its steps, the step attempt: for helpers
    that work in workflow code and in steps alike. Raises NotInWorkflow outside a run."""
    ctx = _RUN.get()
    if ctx is None:
        raise NotInWorkflow(
            f"tether.{helper}() only works inside a running workflow or one of its steps; "
            f"call it from the workflow or step code that App executes"
        )
    return ctx, _STEP.get()


def ambient() -> tuple[RunContext | None, StepContext | None]:
    """The run being executed here and its step attempt, each None when there is none: for
    code that only describes where it is (log records), never raises."""
    return _RUN.get(), _STEP.get()


def idempotency_key() -> str:
    """A key for the current step's side effect: the same across its attempts and replays,
    different for every other step and run. Pass it to the receiver of the effect."""
    step = _STEP.get()
    if step is None:
        raise NotInWorkflow(
            "tether.idempotency_key() only works inside a step of a running workflow; "
            "call it from the step that performs the side effect"
        )
    return step.idempotency_key

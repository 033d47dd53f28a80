"""Replay a recorded history against the current workflow code, executing nothing.

Used to check that code changes keep old runs replayable (golden histories in tests, and the
replay check for operators). Steps and helpers return their recorded outcomes; reaching the end
of the history stops the replay as a success. It never writes to a store.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tether.core.context import _RUN, Abandon, EndOfHistory, RunContext
from tether.core.engine import Engine
from tether.errors import NonDeterminismError, SerializationError
from tether.store.base import Checkpoint, Lease


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    run_id: str
    workflow: str
    error: NonDeterminismError | None  # None: the history replays under the current code

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def first_difference(self) -> tuple[int, str | None, str | None] | None:
        """(position, recorded name, requested name) where replay first differs; None if ok.
        A None name means that side has no checkpoint there."""
        if self.error is None:
            return None
        recorded, requested = self.error.recorded, self.error.requested
        for i in range(max(len(recorded), len(requested))):
            a = recorded[i] if i < len(recorded) else None
            b = requested[i] if i < len(requested) else None
            if a != b:
                return i, a, b
        return len(recorded), None, None


async def replay(
    engine: Engine, run_id: str, workflow: str, args: str, history: list[Checkpoint]
) -> ReplayOutcome:
    """Replay one run's history with the registered code of `workflow`."""
    wf = engine.workflows.get(workflow)
    if wf is None:
        error = NonDeterminismError(
            f"run {run_id!r} recorded workflow {workflow!r}, which this code does not register"
        )
        return ReplayOutcome(run_id, workflow, error)
    ctx = RunContext(
        engine,
        run_id,
        workflow,
        Lease(run_id, "replay", -1),
        {c.seq: c for c in history},
        replay_only=True,
    )

    async def body() -> None:
        _RUN.set(ctx)
        try:
            positional, keywords = wf.decode_args(engine.serde, args)
        except Exception as exc:  # the signature changed: this run cannot even start again
            raise Abandon(NonDeterminismError(
                f"run {run_id!r}: its recorded arguments no longer fit workflow {workflow!r} "
                f"({type(exc).__name__}: {exc})"
            )) from None  # fmt: skip
        try:
            await wf.fn(*positional, **keywords)
        except (EndOfHistory, Abandon):
            raise
        except Exception:  # noqa: S110 - the workflow's own failure is part of its history
            pass
        missing = ctx.unreplayed()
        if missing is not None:
            raise Abandon(ctx.divergence(missing))

    try:
        await asyncio.create_task(body())
    except EndOfHistory:
        pass
    except Abandon as abandon:
        if isinstance(abandon.cause, NonDeterminismError):
            return ReplayOutcome(run_id, workflow, abandon.cause)
        if isinstance(abandon.cause, SerializationError):  # a checkpoint it cannot decode
            return ReplayOutcome(run_id, workflow, NonDeterminismError(str(abandon.cause)))
        raise
    return ReplayOutcome(run_id, workflow, None)

"""Replay a recorded history against the current workflow code, executing nothing.

Used to check that code changes keep old runs replayable (golden histories in tests, and the
replay check for operators). Steps and helpers return their recorded outcomes; reaching the end
of the history stops the replay as a success. It never writes to a store.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tether.core.context import _RUN
from tether.core.engine import Engine
from tether.core.execution import RunContext
from tether.core.positions import install
from tether.core.signals import Abandon, EndOfHistory
from tether.errors import NonDeterminismError, SerializationError
from tether.store.port import Checkpoint, Lease


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    run_id: str
    workflow: str
    error: NonDeterminismError | None  # None: the history replays under the current code

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def first_difference(self) -> tuple[str | None, str | None, str | None] | None:
        """(position, recorded name, requested name) where replay first differs; None if ok.
        A None name means that side has no checkpoint there (a None position: the run could
        not start replaying at all)."""
        if self.error is None:
            return None
        recorded, requested = self.error.difference
        return self.error.position, recorded, requested


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
        {c.at: c for c in history},
        replay_only=True,
    )

    async def body() -> None:
        _RUN.set(ctx)
        ctx.begin()
        try:
            try:
                positional, keywords = wf.decode_args(engine.serde, args)
            except Exception as exc:  # the signature changed: this run cannot even start again
                raise ctx.abandon(NonDeterminismError(
                    f"run {run_id!r}: its recorded arguments no longer fit workflow "
                    f"{workflow!r} ({type(exc).__name__}: {exc})"
                )) from None  # fmt: skip
            await wf.fn(*positional, **keywords)
        except Exception:  # noqa: S110 - the workflow's own failure is part of its history
            pass
        except BaseException:
            # The execution's end (a signal, a cancellation, a TaskGroup's group of them):
            # ctx.ending says how. Anything else (a cancellation from outside) goes on.
            if ctx.ending is None:
                raise
        finally:
            await ctx.close()

    install(asyncio.get_running_loop())
    await asyncio.get_running_loop().create_task(body())
    ending = ctx.ending
    if isinstance(ending, Abandon):
        if isinstance(ending.cause, NonDeterminismError):
            return ReplayOutcome(run_id, workflow, ending.cause)
        if isinstance(ending.cause, SerializationError):  # a checkpoint it cannot decode
            return ReplayOutcome(run_id, workflow, NonDeterminismError(str(ending.cause)))
        raise ending.cause
    if not isinstance(ending, EndOfHistory):  # the workflow's code ran to its end
        diverged = ctx.unreplayed()
        if diverged is not None:
            return ReplayOutcome(run_id, workflow, diverged)
    return ReplayOutcome(run_id, workflow, None)

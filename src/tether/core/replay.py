"""Replay a recorded history against the current workflow code, executing nothing.

Used to check that code changes keep old runs replayable (golden histories in tests, and the
replay check for operators). Steps and helpers return their recorded outcomes; reaching the end
of the history stops the replay as a success. It never writes to a store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tether.core.context import _RUN
from tether.core.engine import Engine
from tether.core.execution import RunContext
from tether.core.positions import install
from tether.core.signals import Abandon, EndOfHistory
from tether.errors import NonDeterminismError, SerializationError
from tether.store.port import Checkpoint, Lease, RunStatus


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


_PAGE = 200  # runs a replay check reads at once


class ReplayMixin:
    """App.replay_check (App inherits it)."""

    engine: Engine

    if TYPE_CHECKING:

        async def open(self) -> None: ...

    async def replay_check(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | str | None = None,
        finished: bool = False,
        limit: int | None = None,
        on_progress: Callable[[int, int | None], object] | None = None,
    ) -> list[ReplayOutcome]:
        """Replay stored histories against the workflows registered now, executing nothing:
        one outcome per run, newest first; `outcome.first_difference` says where one
        diverges. By default every unfinished run (pending, running, waiting, held), however
        many and however old; with `finished` every run, or those of one `status`; at most
        `limit`. `on_progress(done, total)` is called after each run (total None when
        unknown)."""
        await self.open()
        store = self.engine.store
        if status is not None:
            statuses = [RunStatus(status)]
        else:
            statuses = [s for s in RunStatus if finished or not s.terminal]
        total: int | None = None
        if workflow is None:
            counts = (await store.stats(self.engine.clock.now())).runs
            total = sum(counts.get(s, 0) for s in statuses)
            total = total if limit is None else min(total, limit)
        outcomes: list[ReplayOutcome] = []
        before: tuple[float, str] | None = None
        while limit is None or len(outcomes) < limit:
            room = _PAGE if limit is None else min(_PAGE, limit - len(outcomes))
            page = await store.list_runs(statuses=statuses, workflow=workflow, limit=room,
                                         before=before)  # fmt: skip
            if not page:
                break
            for record in page:
                history = await store.load_history(record.id)
                outcomes.append(await replay(self.engine, record.id, record.workflow,
                                             record.args, history))  # fmt: skip
                if on_progress is not None:
                    on_progress(len(outcomes), total)
            before = (page[-1].created_at, page[-1].id)
        return outcomes

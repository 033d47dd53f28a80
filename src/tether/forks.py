"""Forks and time travel: `app.fork(run_id, from_step=...)` starts a new run that reuses the
recorded checkpoints before that step and executes the rest under the current code.

The fork's history is a copy of the source's final checkpoints before the step, written with
the new run, the values they set, the source's events they did not consume and the link to the
source, in one store transaction; the source is never changed. It must not import a backend,
the server or the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tether.core.start import check_run_id, new_run_id
from tether.errors import ConfigurationError, IdempotencyConflict, RunNotFound
from tether.store.keys import child_key, child_outcome
from tether.store.port import Checkpoint, CheckpointStatus, NewRun
from tether.store.port.values import ForkRecord

if TYPE_CHECKING:
    from tether.core.engine import Engine
    from tether.core.handle import RunHandle

FINAL = (CheckpointStatus.COMPLETED, CheckpointStatus.FAILED)
_SHOWN = 40  # step names listed in an error, at most


class ForkMixin:
    """The App's fork methods (App inherits them)."""

    engine: Engine

    if TYPE_CHECKING:

        async def open(self) -> None: ...

        def _handle(self, run_id: str) -> RunHandle[Any]: ...

    async def fork(
        self, run_id: str, from_step: str, *, id: str | None = None, started_by: str | None = None
    ) -> RunHandle[Any]:
        """Start a new run of the same workflow with the same arguments whose history is a
        copy of run `run_id`'s checkpoints before step `from_step` ("name#n", or "name" for
        its first occurrence, as `tether runs show` lists them): those replay, and the run
        executes from that step on under the current code. `id` is the new run's id (the
        idempotency key: the same id, source and step return the same fork). The source is
        not changed. Raises RunNotFound, and ConfigurationError for a step the run did not
        record (naming those it did) or a history a fork cannot reuse (docs/values-and-forks.md).
        `started_by` names who forked it: the fork's starter, whom separation of duties keeps
        from deciding its approvals (without it, the source's starter)."""
        if not isinstance(from_step, str) or not from_step:
            raise ConfigurationError(
                f"from_step takes a step name like 'name#2', not {from_step!r}"
            )
        check_run_id(id)
        await self.open()
        return self._handle(await fork_run(self.engine, run_id, from_step, id, started_by))


async def fork_run(
    engine: Engine, run_id: str, from_step: str, given_id: str | None, started_by: str | None = None
) -> str:
    """Create the fork (see ForkMixin.fork) and return its id."""
    store = engine.store
    source = await store.get_run(run_id)
    if source is None:
        raise RunNotFound(f"no run has id {run_id!r}; check the id with `tether runs list`")
    wf = engine.workflows.get(source.workflow)
    if wf is None:
        raise ConfigurationError(
            f"run {run_id!r} is of workflow {source.workflow!r}, which this App does not "
            f"register; a fork executes under the current code, so fork it from an App that "
            f"registers the workflow (on the command line: --app module:app)"
        )
    history = await store.load_history(run_id)
    at = find_step(run_id, history, from_step)
    copied = [c for c in history if c.seq < at.seq and c.status in FINAL]
    _refuse_approvals(run_id, at, copied)
    events = await _child_ends(engine, run_id, at, copied)
    now = engine.clock.now()
    new_id = given_id or new_run_id(engine)
    deadline = None if wf.timeout is None else now + wf.timeout.total_seconds()
    run = NewRun(new_id, wf.name, source.args, deadline, queue=wf.queue,
                 priority=source.priority,
                 started_by=started_by or source.started_by)  # fmt: skip
    link = ForkRecord(new_id, run_id, at.name, at.seq, now)
    _, created = await store.fork_run(run, link, copied, events, now)
    if not created:
        existing = await store.get_fork(new_id)
        if existing is None or (existing.source_run_id, existing.from_step) != (run_id, at.name):
            was = ("not a fork" if existing is None else
                   f"a fork of {existing.source_run_id!r} from {existing.from_step!r}")  # fmt: skip
            raise IdempotencyConflict(
                f"run {new_id!r} exists and is {was}, not a fork of {run_id!r} from "
                f"{at.name!r}; fork with another id (or none, for a new one)"
            )
    elif engine.worker is not None:
        engine.worker.notify()
    return new_id


def find_step(run_id: str, history: Sequence[Checkpoint], name: str) -> Checkpoint:
    """The checkpoint named `name` ("name#1" is "name"); ConfigurationError naming those the
    run recorded otherwise."""
    wanted = {name, name.removesuffix("#1")}
    for checkpoint in history:
        if checkpoint.name in wanted:
            return checkpoint
    names = [c.name for c in history]
    shown = ", ".join(names[:_SHOWN]) + (f", ... ({len(names)} in all)" if len(names) > _SHOWN
                                         else "")  # fmt: skip
    raise ConfigurationError(
        f"run {run_id!r} recorded no step {name!r}, so it cannot be forked from there; "
        + (f"its steps are: {shown}" if names else "it has recorded no steps yet")
        + " (`tether runs show` lists them; 'name#2' is a step's second call)"
    )


def _refuse_approvals(run_id: str, at: Checkpoint, copied: Sequence[Checkpoint]) -> None:
    """A decision is bound to its run (the operation digest includes the run id): a fork
    cannot replay one, and asks its reviewers again instead."""
    for checkpoint in copied:
        if checkpoint.kind == "approval":
            raise ConfigurationError(
                f"cannot fork run {run_id!r} from {at.name!r}: approval {checkpoint.name!r} "
                f"comes before it, and its decision is bound to run {run_id!r}, so a fork "
                f"cannot reuse it. Fork from {checkpoint.name!r} or earlier: the fork asks "
                f"its reviewers again"
            )


async def _child_ends(
    engine: Engine, run_id: str, at: Checkpoint, copied: Sequence[Checkpoint]
) -> list[tuple[str, str]]:
    """Mailbox events telling the fork how the children started in the copied history ended,
    for those whose end it has not recorded (the children stay the source's; their ends are
    told to the source only). ConfigurationError if such a child has not ended."""
    joined = {_won(c) for c in copied if c.kind in ("join", "any")}
    events: list[tuple[str, str]] = []
    for checkpoint in copied:
        if checkpoint.kind != "child":
            continue
        child_id = str(json.loads(checkpoint.result or '""'))
        if child_key(child_id) in joined:
            continue
        child = await engine.store.get_run(child_id)
        if child is None or not child.status.terminal:
            state = "no longer exists" if child is None else f"is {child.status.value}"
            raise ConfigurationError(
                f"cannot fork run {run_id!r} from {at.name!r}: child run {child_id!r}, started "
                f"at {checkpoint.name!r} before it, {state}, and the fork could never learn "
                f"how it ends. Fork once it has ended, or from {checkpoint.name!r} or earlier "
                f"(the fork starts a child of its own)"
            )
        events.append((child_key(child_id), child_outcome(child.status, child.result,
                                                          child.error)))  # fmt: skip
    return events


def _won(checkpoint: Checkpoint) -> str | None:
    """The mailbox key a recorded wait took its outcome from, if any."""
    try:
        recorded = json.loads(checkpoint.result or "null")
    except ValueError:
        return None
    return str(recorded.get("key")) if isinstance(recorded, dict) else None

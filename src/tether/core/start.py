"""Starting runs: from a caller (`app.start`) or from inside a workflow (a child run).

The run id is the idempotency key: starting an existing id returns that run, and the same id
with other arguments is refused. A child's id is derived from its parent's id and the position
of the start in the parent's history, so replay finds the same child. This module creates runs
and hands them to the local worker; it does not execute them.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Generator
from typing import Any, Generic, TypeVar

from tether.core.context import current_run
from tether.core.engine import Engine
from tether.core.execution import RunContext
from tether.core.observe import trace_to_record
from tether.core.slot import arguments
from tether.core.waits import ChildWait, join
from tether.core.workflow import Named, Workflow
from tether.errors import ConfigurationError, IdempotencyConflict
from tether.store.port import CheckpointStatus, NewRun, RunRecord

R = TypeVar("R")


def new_run_id(engine: Engine) -> str:
    # Time-ordered (like UUIDv7): inserts stay at the end of the B-trees.
    return f"{int(engine.clock.now() * 1000):012x}{secrets.token_hex(10)}"


def check_run_id(run_id: str | None) -> None:
    if run_id is not None and (not isinstance(run_id, str) or not run_id or len(run_id) > 512):
        raise ConfigurationError(f"a run id must be a non-empty str of <= 512 chars: {run_id!r}")


async def create_run(
    engine: Engine,
    wf: Workflow[..., Any] | Named,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    run_id: str,
    *,
    parent_id: str | None = None,
    priority: int = 0,
    dedup_key: str | None = None,
    started_by: str | None = None,
) -> RunRecord:
    """Create the run (or find the existing one with this id) and hand a new one to this
    process's worker, if it runs and has room. Runs of a queue are left to the claim, which
    keeps the queue's limits, and runs of a workflow known by name only (Named) to a worker
    that has its code."""
    text = wf.encode_args(engine.serde, args, kwargs)
    now = engine.clock.now()
    deadline = None if wf.timeout is None else now + wf.timeout.total_seconds()
    worker = engine.worker
    if worker is None or not worker.has_capacity() or wf.queue is not None or isinstance(wf, Named):
        worker = None
    record, created = await engine.store.create_run(
        NewRun(run_id, wf.name, text, deadline, parent_id=parent_id, queue=wf.queue,
               priority=priority, dedup_key=dedup_key, started_by=started_by,
               trace_context=trace_to_record(engine.observer)), now,
        owner=worker.id if worker else None,
        lease_until=now + engine.settings.lease_duration if worker else None,
        version=worker.version if worker else None,
    )  # fmt: skip
    if not created:
        check_same_run(engine, record, wf, text)
    elif worker is not None:
        worker.launch(record, history=[])
    elif engine.worker is not None:
        engine.worker.notify()
    return record


class ChildHandle(Generic[R]):
    """A child run, inside its parent workflow: `await handle` (or `await handle.result()`)
    waits durably for it to end and returns its result or raises its RunFailed/RunCancelled."""

    def __init__(self, run_id: str, workflow: str) -> None:
        self.id = run_id
        self.wait_spec = ChildWait(run_id, workflow)

    def __repr__(self) -> str:
        return f"<tether child run {self.id!r}>"

    async def result(self) -> R:
        value: R = await join(current_run("ChildHandle.result"), self.wait_spec)
        return value

    def __await__(self) -> Generator[Any, None, R]:
        return self.result().__await__()


async def start_child(
    workflow: Workflow[..., R],
    *args: Any,
    id: str | None = None,
    **kwargs: Any,
) -> ChildHandle[R]:
    """Start a child run of `workflow` from inside a workflow. Its id is derived from this
    run's id and this call's position unless given; cancelling this run cancels the child."""
    ctx = current_run("start_child")
    if not isinstance(workflow, Workflow) or ctx.engine.workflows.get(workflow.name) is None:
        raise ConfigurationError(f"{workflow!r} is not a workflow registered on this App")
    check_run_id(id)
    return await _start(ctx, workflow, args, kwargs, id)


async def _start(
    ctx: RunContext,
    wf: Workflow[..., R],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    given_id: str | None,
) -> ChildHandle[R]:
    slot = ctx.slot(f"child:{wf.name}", "child", arguments(args, kwargs))
    recorded = slot.recorded
    if recorded is not None and recorded.status is CheckpointStatus.COMPLETED:
        child_id = ctx.decode(recorded, lambda: str(json.loads(recorded.result or '""')))
        return ChildHandle(child_id, wf.name)
    await ctx.at_frontier()  # nothing new before the whole history replayed
    if ctx.pending:
        await ctx.flush()
    child_id = given_id or f"{ctx.run_id}/{slot.name}"
    now = ctx.engine.clock.now()
    with ctx.io():
        await create_run(ctx.engine, wf, args, kwargs, child_id, parent_id=ctx.run_id)
    await ctx.write(slot.checkpoint(CheckpointStatus.COMPLETED, attempts=1,
                                    result=json.dumps(child_id), started_at=now,
                                    finished_at=ctx.engine.clock.now()))  # fmt: skip
    return ChildHandle(child_id, wf.name)


async def call_child(wf: Workflow[..., R], args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
    """`await some_workflow(...)` inside a workflow: start it as a child and wait for it."""
    handle = await _start(current_run(wf.name), wf, args, kwargs, None)
    return await handle.result()


def check_same_run(
    engine: Engine, record: RunRecord, wf: Workflow[..., Any] | Named, text: str
) -> None:
    """A start found run `record` under its id: it must be of the same workflow with the same
    arguments (JSON `text`), else IdempotencyConflict."""
    same = record.workflow == wf.name and (
        record.args == text or engine.serde.loads(record.args) == engine.serde.loads(text)
    )
    if not same:
        raise IdempotencyConflict(
            f"run {record.id!r} exists as {record.workflow}({record.args[:200]}), not "
            f"{wf.name}({text[:200]}); start with a new id or the same arguments"
        )

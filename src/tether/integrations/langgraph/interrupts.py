"""LangGraph's `interrupt()` answered by Tether approvals: `await run_graph(graph, input,
thread_id=..., reviewers=[...])` inside a workflow runs a compiled graph (with any
checkpointer; TetherSaver keeps it in Tether's database), turns each interrupt into an approval
and resumes the graph with `Command(resume=...)` when the decisions arrive.

Each invocation of the graph is a checkpointed step; the approval's key is derived from the
thread id and the interrupt id, so a replay or a restart never asks twice. A step that is run
again after a crash continues the thread from the graph's own last checkpoint instead of
starting it over. The graph's values cross as JSON (pydantic objects such as messages are
dumped); this module never judges a decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from tether.approvals.flow import approval
from tether.approvals.model import Decision
from tether.core.context import current_run
from tether.core.retry import Retry
from tether.core.step import Step
from tether.errors import ConfigurationError


def as_json(value: Any) -> Any:
    """Graph values as JSON data: pydantic models (LangChain messages among them) dumped."""
    if isinstance(value, dict):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    dump = getattr(value, "model_dump", None)
    return as_json(dump(mode="json")) if callable(dump) else str(value)


async def _invoke(graph: Any, graph_input: Any, config: dict[str, Any],
                  resume: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """One invocation: from the input, or on from the thread's checkpoint (after a crash, or
    with the decisions as the interrupts' resume values)."""
    from langgraph.types import Command

    state = await graph.aget_state(config)
    pending = [i for task in state.tasks for i in task.interrupts]
    if state.created_at is None:
        argument: Any = graph_input  # the thread never ran
    elif pending:
        if resume is None:  # asked before this step recorded: ask again, the same way
            return _outcome(state.values, pending)
        argument = Command(resume={i.id: resume[i.id] for i in pending if i.id in resume})
    elif state.next:
        argument = None  # it stopped mid-way (a crash): go on from its checkpoint
    else:
        return _outcome(state.values, [])  # it finished before this step was recorded
    result = await graph.ainvoke(argument, config)
    after = await graph.aget_state(config)
    interrupts = [i for task in after.tasks for i in task.interrupts]
    values = result if isinstance(result, dict) else after.values
    return _outcome({k: v for k, v in values.items() if k != "__interrupt__"}, interrupts)


def _outcome(values: Any, interrupts: Sequence[Any]) -> dict[str, Any]:
    asked = [{"id": i.id, "value": as_json(i.value)} for i in interrupts]
    return {"values": as_json(values), "interrupts": asked}


def resume_value(decision: Decision) -> dict[str, Any]:
    """What `interrupt()` returns in the graph once a person decided."""
    return {"approved": decision.approved, "status": decision.status, "option": decision.option,
            "reviewer": decision.reviewer, "comment": decision.comment,
            "response": decision.response}  # fmt: skip


async def run_graph(
    graph: Any,
    graph_input: Any,
    *,
    thread_id: str,
    reviewers: Sequence[str],
    expires_in: timedelta = timedelta(hours=1),
    config: dict[str, Any] | None = None,
    retry: Retry | None = None,
) -> Any:
    """Run a compiled LangGraph graph on `thread_id` inside a workflow; each `interrupt(value)`
    asks `reviewers` through a Tether approval whose operation is `value` (its `title` and
    `description` keys, when it is a dict, become the approval's); `interrupt()` then returns
    {"approved", "status", "option", "reviewer", "comment", "response"}. Returns the graph's
    final values as JSON data."""
    current_run("run_graph")
    if not isinstance(thread_id, str) or not thread_id:
        raise ConfigurationError(f"run_graph needs a thread_id str, not {thread_id!r}")
    if getattr(graph, "checkpointer", None) is None:
        raise ConfigurationError(
            "run_graph needs a graph compiled with a checkpointer (e.g. "
            "graph.compile(checkpointer=TetherSaver(app))): interrupts are resumed from it"
        )
    merged = {**(config or {})}
    merged["configurable"] = {**merged.get("configurable", {}), "thread_id": thread_id}
    step: Step[..., dict[str, Any]] = Step(
        _invoke, name="langgraph", retry=retry or Retry(max_attempts=3), timeout=None,
        at_most_once=False, reconcile=None,
    )  # fmt: skip
    resume: dict[str, Any] | None = None
    while True:
        out = await step(graph, graph_input, merged, resume)
        if not out["interrupts"]:
            return out["values"]
        resume = {}
        for asked in out["interrupts"]:
            value = asked["value"]
            shown = value if isinstance(value, dict) else {}
            decision = await approval(
                str(shown.get("title") or "Let the graph go on?"),
                str(shown.get("description") or ""),
                operation=value,
                reviewers=reviewers,
                expires_in=expires_in,
                context={"thread_id": thread_id},
                key=f"langgraph:{thread_id}:{asked['id']}",
            )
            resume[asked["id"]] = resume_value(decision)

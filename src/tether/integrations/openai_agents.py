"""OpenAI Agents SDK runs made durable, with Tether approvals for the SDK's `needs_approval` tools.

`await run_agent(agent, input, reviewers=[...])` inside a workflow. Each stretch of the SDK's
run between two approvals is one checkpointed step; when the SDK stops for approvals, that
step's recorded result holds the interrupted `RunState` (its JSON), so the pause outlives any
process. Each interruption becomes a Tether approval (keyed by the tool call's id, so a replay
never asks twice) whose operation is `{"tool": name, "arguments": args}`; the decisions are
applied to the stored RunState and the run resumes. A stretch is replayed whole after a crash
inside it: tools that need no approval are at-least-once there, as in any step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from tether.approvals.flow import approval
from tether.core.context import current_run
from tether.core.retry import Retry
from tether.core.step import Step

if TYPE_CHECKING:
    from agents import Agent, RunResult


async def _stretch(
    agent: Agent[Any],
    run_input: Any,
    state: str | None,
    decisions: dict[str, bool],
    max_turns: int,
) -> dict[str, Any]:
    """One stretch of the SDK's run: from the input, or from a stored RunState with the
    decisions applied, until it ends or stops for approvals."""
    from agents import Runner, RunState

    if state is None:
        result: RunResult = await Runner.run(agent, run_input, max_turns=max_turns)
    else:
        resumed = await RunState.from_string(agent, state)
        for item in resumed.get_interruptions():
            if decisions.get(str(item.call_id)):
                resumed.approve(item)
            else:
                resumed.reject(item, rejection_message="a person did not approve this call")
        result = await Runner.run(agent, resumed, max_turns=max_turns)
    if not result.interruptions:
        return {"final_output": _plain(result.final_output), "interruptions": [], "state": None}
    asked = [{"call_id": str(i.call_id), "tool": i.tool_name or i.name,
              "arguments": _arguments(i.arguments)} for i in result.interruptions]  # fmt: skip
    return {"final_output": None, "interruptions": asked, "state": result.to_state().to_string()}


def _arguments(text: str | None) -> Any:
    try:
        return json.loads(text or "{}")
    except ValueError:
        return text


def _plain(value: Any) -> Any:
    """The final output as JSON data (a pydantic output type becomes its dict)."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


async def run_agent(
    agent: Agent[Any],
    run_input: Any,
    *,
    reviewers: Sequence[str],
    expires_in: timedelta = timedelta(hours=1),
    max_turns: int = 10,
    retry: Retry | None = None,
) -> Any:
    """Run an OpenAI Agents SDK agent durably inside a workflow; its `needs_approval` tool calls
    wait for Tether approvals (rejected or expired: the SDK is told the call was rejected).
    Returns the run's final output."""
    current_run("run_agent")
    step: Step[..., dict[str, Any]] = Step(
        _stretch, name=f"openai-agents.{agent.name}", retry=retry or Retry(max_attempts=3),
        timeout=None, at_most_once=False, reconcile=None,
    )  # fmt: skip
    state: str | None = None
    decisions: dict[str, bool] = {}
    while True:
        out = await step(agent, run_input, state, decisions, max_turns)
        if not out["interruptions"]:
            return out["final_output"]
        decisions = {}
        for asked in out["interruptions"]:
            decision = await approval(
                f"Run {asked['tool']}?",
                f"The agent {agent.name!r} wants to call the tool {asked['tool']!r}.",
                operation={"tool": asked["tool"], "arguments": asked["arguments"]},
                reviewers=reviewers,
                expires_in=expires_in,
                context={"agent": agent.name},
                key=f"openai-agents:{asked['call_id']}",
            )
            decisions[asked["call_id"]] = decision.approved
        state = out["state"]

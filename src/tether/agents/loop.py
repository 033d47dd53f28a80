"""The durable agent loop (DESIGN §6): every model call and every tool call is a checkpointed
step; a tool that needs approval asks a person first, and a refusal goes back to the model.

`await agent.run(messages)` inside a workflow. A crash anywhere resumes from the last
checkpoint: recorded model turns are not asked again, a tool that ran is not run again.
Tool calls that need approval are asked one after the other (each is a durable wait); the
tools then run concurrently as separate steps.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from tether.agents.models import (
    Model,
    ModelRequest,
    RateLimited,
    ToolCall,
    assistant_message,
    response_from_json,
    tool_message,
)
from tether.agents.tools import Tool
from tether.approvals.flow import approval
from tether.core.context import current_run
from tether.core.retry import Retry
from tether.core.step import Step
from tether.errors import ConfigurationError, TetherError
from tether.streams import check_stream_key, stream

MODEL_RETRY = Retry(max_attempts=6, initial_delay=timedelta(seconds=1),
                    max_delay=timedelta(minutes=1))  # fmt: skip


class MaxTurnsExceeded(TetherError):
    """The agent used all its turns without a final answer; raise max_turns or check the tools."""


@dataclass(frozen=True, slots=True)
class AgentResult:
    output: str  # the final answer
    messages: list[dict[str, Any]]  # the whole conversation, tool calls and results included
    turns: int  # model calls made
    refused: list[dict[str, Any]] = field(default_factory=list)  # tool calls a person refused


class Agent:
    """A model, its instructions and its tools. Run it inside a workflow."""

    def __init__(
        self,
        model: Model,
        instructions: str = "",
        tools: Sequence[Tool[..., Any]] = (),
        *,
        name: str = "agent",
        max_turns: int = 10,
        retry: Retry = MODEL_RETRY,
        timeout: timedelta | None = timedelta(minutes=5),
        stream_key: str = "tokens",
    ) -> None:
        if not isinstance(model, Model):
            raise ConfigurationError(f"{model!r} is not a model: it needs async complete()")
        names = [t.name for t in tools]
        if not all(isinstance(t, Tool) for t in tools) or len(set(names)) != len(names):
            raise ConfigurationError(
                f"an agent's tools are distinct tools made with @app.tool(): {tools!r}"
            )
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ConfigurationError(f"max_turns is an int >= 1, not {max_turns!r}")
        self.model = model
        self.instructions = instructions
        self.tools = {t.name: t for t in tools}
        self.name = name
        self.max_turns = max_turns
        self.stream_key = check_stream_key(stream_key)
        self._model_step: Step[..., dict[str, Any]] = Step(
            self._complete, name=f"{name}.model", retry=retry, timeout=timeout,
            at_most_once=False, reconcile=None,
        )  # fmt: skip

    async def _complete(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """One model call (the body of the model step): tokens go to the stream as they come;
        an attempt that fails has its tokens retracted by the stream."""
        tokens = stream(self.stream_key)
        request = ModelRequest(self.instructions, messages, [t.spec() for t in self.tools.values()])
        response = await self.model.complete(request, tokens.write)
        return response.to_json()

    async def run(self, messages: list[dict[str, Any]] | str) -> AgentResult:
        current_run("Agent.run")
        conversation = (
            [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)
        )
        refused: list[dict[str, Any]] = []
        for turn in range(1, self.max_turns + 1):
            response = response_from_json(await self._model_step(list(conversation)))
            conversation.append(assistant_message(response))
            if not response.tool_calls:
                return AgentResult(response.text, conversation, turn, refused)
            results = await self._run_tools(response.tool_calls, refused)
            conversation += [tool_message(c, text) for c, text in results]
        raise MaxTurnsExceeded(
            f"agent {self.name!r} made {self.max_turns} model calls without a final answer; "
            f"raise max_turns= or check what its tools return"
        )

    async def _run_tools(
        self, calls: list[ToolCall], refused: list[dict[str, Any]]
    ) -> list[tuple[ToolCall, str]]:
        verdicts: dict[int, str] = {}  # call index -> why it does not run
        for n, call in enumerate(calls):
            tool = self.tools.get(call.name)
            if tool is None:
                verdicts[n] = f"error: there is no tool named {call.name!r}"
                continue
            problem = _invalid_arguments(tool, call.arguments)
            if problem is not None:
                verdicts[n] = f"error: {problem}"
                continue
            if tool.asks_approval(call.arguments):
                decision = await approval(
                    f"Run {tool.name}?",
                    f"The agent {self.name!r} wants to call the tool {tool.name!r}.",
                    operation={"tool": tool.name, "arguments": call.arguments},
                    reviewers=tool.reviewers,
                    expires_in=tool.approval_expires_in,
                    context={"agent": self.name, "tool": tool.description},
                )
                if not decision.approved:
                    verdicts[n] = (f"refused: a person did not approve this call "
                                   f"({decision.status}); do not retry it unchanged")  # fmt: skip
                    refused.append({**call.to_json(), "status": decision.status})
        # Calling a step takes its checkpoint slot at once, in this order, before any of them
        # runs: concurrent tool calls replay deterministically.
        running = {n: _told(self.tools[c.name](**c.arguments))
                   for n, c in enumerate(calls) if n not in verdicts}  # fmt: skip
        done = dict(zip(running, await asyncio.gather(*running.values()), strict=True))
        return [(c, verdicts.get(n) or done[n]) for n, c in enumerate(calls)]


async def _told(call: Coroutine[Any, Any, Any]) -> str:
    """A tool's result as the model reads it; a failure is told, not raised, so the model may
    try another way."""
    try:
        result = await call
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"
    return result if isinstance(result, str) else json.dumps(result, default=str)


def _invalid_arguments(tool: Tool[..., Any], arguments: dict[str, Any]) -> str | None:
    from jsonschema import Draft202012Validator  # imported when an agent runs, not at import

    errors = sorted(Draft202012Validator(tool.parameters).iter_errors(arguments), key=str)
    if not errors:
        return None
    where = "/".join(str(p) for p in errors[0].absolute_path) or "the arguments"
    return f"invalid arguments for {tool.name!r} at {where}: {errors[0].message}"


__all__ = ["Agent", "AgentResult", "MaxTurnsExceeded", "RateLimited"]

"""OpenAI Agents SDK runs inside Tether workflows: a `needs_approval` tool waits for a Tether
approval (approved: it runs once; rejected: the SDK is told and the tool never runs), the
interrupted RunState is stored in a checkpoint, and a new process resumes it. The SDK runs for
real; its model is a scripted implementation of the SDK's own Model interface (no network)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

agents = pytest.importorskip("agents")

from agents import Agent, ModelSettings, function_tool  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import (  # noqa: E402
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import tether  # noqa: E402
from tether.integrations.openai_agents import run_agent  # noqa: E402

agents.set_tracing_disabled(True)  # the SDK would export traces over the network


class ScriptedModel(Model):
    """Asks for `refund` first, then answers with what the tool returned (or that it could not)."""

    async def get_response(
        self, system_instructions: str | None, input: Any, model_settings: ModelSettings,
        tools: Any, output_schema: Any, handoffs: Any, tracing: Any, **kwargs: Any,
    ) -> ModelResponse:  # fmt: skip
        outputs = [item for item in input if isinstance(item, dict)
                   and item.get("type") == "function_call_output"]  # fmt: skip
        if not outputs:
            arguments = json.dumps({"order": "A-7", "amount": 250})
            call = ResponseFunctionToolCall(
                type="function_call", call_id="call_refund_1", name="refund", id="fc_1",
                arguments=arguments,
            )  # fmt: skip
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = f"tool said: {outputs[-1]['output']}"
        message = ResponseOutputMessage(
            id="msg_1", role="assistant", status="completed", type="message",
            content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
        )  # fmt: skip
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the tests run without streaming")


def build(url: str, effects: list[str]) -> tether.App:
    app = tether.App(url)

    @function_tool(needs_approval=True)
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        effects.append(f"refund {order} {amount}")
        return f"refunded {amount} on {order}"

    agent = Agent(name="support", instructions="Help.", model=ScriptedModel(), tools=[refund])

    @app.workflow()
    async def support(question: str) -> Any:
        return await run_agent(agent, question, reviewers=["group:finance"])

    return app


async def pending(app: tether.App, run_id: str) -> tether.Approval:
    async with asyncio.timeout(20):
        while not (found := await app.list_approvals(run_id=run_id)):
            await asyncio.sleep(0.01)
    return found[0]


FINANCE = tether.Reviewer("fin", frozenset({"finance"}))


async def test_an_approved_tool_runs_once_and_the_run_resumes_in_a_new_process(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/oa.db"
    effects: list[str] = []
    first = build(url, effects)
    async with first:
        await first.start("support", "refund my order", id="oa-1")
        ask = await pending(first, "oa-1")
    # The first worker is gone; the interrupted RunState is in a checkpoint.
    assert ask.operation == {"tool": "refund", "arguments": {"order": "A-7", "amount": 250}}
    assert ask.reviewers == ("group:finance",)
    assert effects == []
    second = build(url, effects)
    async with second:
        await second.decide(ask.id, "approve", reviewer=FINANCE,
                            operation_digest=ask.operation_digest)  # fmt: skip
        result = await (await second.get("oa-1")).result(timeout=20)
        names = [c.name for c in await (await second.get("oa-1")).checkpoints()]
    assert result == "tool said: refunded 250 on A-7"
    assert effects == ["refund A-7 250"]
    asked = "approval:openai-agents:call_refund_1"
    assert names == ["openai-agents.support", asked, f"{asked}:wait", "openai-agents.support#2"]


async def test_a_rejected_tool_never_runs_and_the_agent_is_told(tmp_path: Path) -> None:
    effects: list[str] = []
    app = build(f"sqlite:///{tmp_path}/oa2.db", effects)
    async with app:
        handle = await app.start("support", "refund please", id="oa-2")
        ask = await pending(app, "oa-2")
        await app.decide(ask.id, "reject", reviewer=FINANCE, operation_digest=ask.operation_digest)
        result = await handle.result(timeout=20)
    assert effects == []
    assert result.startswith("tool said: ")
    assert "refunded" not in result
    assert "a person did not approve this call" in result

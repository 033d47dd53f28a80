"""The durable agent loop with the scripted model: model and tool calls are checkpoints, risky
tools wait for a person and a refusal reaches the model, parallel tool calls run concurrently,
tokens stream (a retried call's partial tokens are retracted), rate limits are honoured, on
every backend and in forced-replay mode."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

import pytest

import tether
from tether.agents import MaxTurnsExceeded
from tether.models import ModelRequest, ModelResponse, RateLimited, Scripted, ToolCall
from tether.testing import FakeClock, fake_app, run_until_idle

MakeApp = Callable[..., tether.App]


async def pending(app: tether.App, run_id: str) -> tether.Approval:
    async with asyncio.timeout(10):
        while not (found := await app.list_approvals(run_id=run_id)):
            await asyncio.sleep(0.005)
    return found[0]


def deploy_agent(app: tether.App, effects: list[str], turns: list[Any]) -> None:
    @app.tool()
    async def search_docs(query: str) -> list[str]:
        """Search the runbooks."""
        effects.append(f"search:{query}")
        return [f"runbook for {query}"]

    @app.tool(needs_approval=True, reviewers=["alice"])
    async def deploy(version: str, env: Literal["prod", "staging"] = "prod") -> str:
        """Deploy a version."""
        effects.append(f"deploy:{version}:{env}")
        return f"deployed {version} to {env}"

    agent = tether.Agent(Scripted(turns), "You deploy things.", [search_docs, deploy])

    @app.workflow()
    async def assistant(request: str) -> dict[str, Any]:
        result = await agent.run(request)
        tools = [m["content"] for m in result.messages if m["role"] == "tool"]
        return {"output": result.output, "turns": result.turns, "refused": result.refused,
                "tools": tools}  # fmt: skip


TURNS = [
    [ToolCall("search_docs", {"query": "deploy"})],
    [ToolCall("deploy", {"version": "1.2.3"})],
    "Deployed 1.2.3 after reading the runbook.",
]


async def test_an_approved_tool_runs_once_and_every_call_is_a_checkpoint(make_app: MakeApp) -> None:
    effects: list[str] = []
    app = make_app()
    deploy_agent(app, effects, TURNS)
    async with app:
        handle = await app.start("assistant", "deploy 1.2.3", id="agent-ok")
        ask = await pending(app, "agent-ok")
        assert ask.operation == {"tool": "deploy", "arguments": {"version": "1.2.3"}}
        assert ask.reviewers == ("alice",)
        assert effects == ["search:deploy"]  # the risky tool waits
        await app.decide(ask.id, "approve", reviewer="alice", operation_digest=ask.operation_digest)
        result = await handle.result(timeout=10)
        names = [c.name for c in await handle.checkpoints()]
    assert result["output"] == "Deployed 1.2.3 after reading the runbook."
    assert result["turns"] == 3
    assert result["tools"] == ['["runbook for deploy"]', "deployed 1.2.3 to prod"]
    assert effects == ["search:deploy", "deploy:1.2.3:prod"]
    assert names == ["agent.model", "search_docs", "agent.model#2", "approval", "approval:wait",
                     "deploy", "agent.model#3"]  # fmt: skip


async def test_a_rejected_tool_never_runs_and_the_model_hears_why(make_app: MakeApp) -> None:
    effects: list[str] = []
    app = make_app()
    deploy_agent(app, effects, TURNS)
    async with app:
        handle = await app.start("assistant", "deploy", id="agent-no")
        ask = await pending(app, "agent-no")
        await app.decide(ask.id, "reject", reviewer="alice", operation_digest=ask.operation_digest)
        result = await handle.result(timeout=10)
    assert effects == ["search:deploy"]
    assert result["tools"][1].startswith("refused: a person did not approve this call (rejected)")
    refused = {"id": "call_1_0", "name": "deploy", "arguments": {"version": "1.2.3"},
               "status": "rejected"}  # fmt: skip
    assert result["refused"] == [refused]


async def test_an_expired_approval_is_a_refusal_and_the_tool_never_runs() -> None:
    clock = FakeClock()
    effects: list[str] = []
    app = fake_app(clock=clock)
    deploy_agent(app, effects, TURNS)
    async with app:
        handle = await app.start("assistant", "deploy", id="agent-exp")
        await run_until_idle(app)  # the expiry timer is all that is left: it fires
        result = await handle.result(timeout=5)
    assert effects == ["search:deploy"]
    assert "(expired)" in result["tools"][1]


async def test_parallel_tool_calls_run_concurrently_as_separate_steps(make_app: MakeApp) -> None:
    app = make_app()
    started: list[str] = []
    both = asyncio.Event()

    @app.tool()
    async def probe(name: str) -> str:
        started.append(name)
        if len(started) == 2:
            both.set()
        async with asyncio.timeout(5):  # one alone would wait here for the other: concurrency
            await both.wait()
        return name.upper()

    calls = [ToolCall("probe", {"name": "a"}), ToolCall("probe", {"name": "b"})]
    agent = tether.Agent(Scripted([calls, "done"]), tools=[probe])

    @app.workflow()
    async def fan() -> list[str]:
        result = await agent.run("go")
        return [m["content"] for m in result.messages if m["role"] == "tool"]

    async with app:
        handle = await app.start(fan, id="fan")
        assert await handle.result(timeout=10) == ["A", "B"]
        names = [c.name for c in await handle.checkpoints()]
    assert names == ["agent.model", "probe", "probe#2", "agent.model#2"]


async def test_bad_tool_calls_are_told_to_the_model(make_app: MakeApp) -> None:
    effects: list[str] = []
    app = make_app()
    deploy_agent(app, effects, [
        [ToolCall("launch_rockets", {}), ToolCall("search_docs", {"query": 7})],
        "I could not.",
    ])  # fmt: skip
    async with app:
        result = await (await app.start("assistant", "x", id="agent-bad")).result(timeout=10)
    assert result["tools"][0] == "error: there is no tool named 'launch_rockets'"
    assert result["tools"][1].startswith("error: invalid arguments for 'search_docs' at query")
    assert effects == []


async def test_tokens_stream_and_a_retried_call_retracts_its_partial_output(
    make_app: MakeApp,
) -> None:
    app = make_app()
    calls = 0

    class Flaky:
        name = "flaky"

        async def complete(self, request: ModelRequest, emit: Any) -> ModelResponse:
            nonlocal calls
            calls += 1
            await emit("partial ")
            if calls == 1:
                raise RateLimited("slow down", retry_after=0.01)
            await emit("answer")
            return ModelResponse(text="partial answer")

    agent = tether.Agent(Flaky(), retry=tether.Retry(initial_delay=timedelta(0)))

    @app.workflow()
    async def chat() -> str:
        return (await agent.run("hi")).output

    async with app:
        handle = await app.start(chat, id="chat")
        assert await handle.result(timeout=10) == "partial answer"
        entries = [entry async for entry in app.read_stream("chat", "tokens")]
    shown: dict[int, Any] = {}
    for offset, entry in entries:
        if isinstance(entry, tether.StreamReset):
            for gone in entry.offsets:
                shown.pop(gone)
        else:
            shown[offset] = entry
    assert "".join(shown[k] for k in sorted(shown)) == "partial answer"
    assert any(isinstance(e, tether.StreamReset) for _, e in entries)
    assert calls == 2


async def test_rate_limits_wait_at_least_the_time_the_provider_asked_for() -> None:
    clock = FakeClock()
    app = fake_app(clock=clock)
    attempts: list[float] = []

    class Limited:
        name = "limited"

        async def complete(self, request: ModelRequest, emit: Any) -> ModelResponse:
            attempts.append(clock.now())
            if len(attempts) == 1:
                raise RateLimited("429", retry_after=120.0)
            return ModelResponse(text="ok")

    agent = tether.Agent(Limited(), retry=tether.Retry(initial_delay=timedelta(seconds=1)))

    @app.workflow()
    async def limited() -> str:
        return (await agent.run("hi")).output

    async with app:
        handle = await app.start(limited, id="limited")
        await run_until_idle(app)
        assert await handle.result(timeout=5) == "ok"
    assert attempts[1] - attempts[0] >= 120.0


async def test_an_agent_out_of_turns_fails_the_run(make_app: MakeApp) -> None:
    app = make_app()

    @app.tool()
    def noop() -> str:
        return "nothing"

    agent = tether.Agent(Scripted([[ToolCall("noop")]] * 3), tools=[noop], max_turns=2)

    @app.workflow()
    async def looping() -> str:
        return (await agent.run("go")).output

    async with app:
        handle = await app.start(looping, id="loop")
        with pytest.raises(tether.RunFailed, match="2 model calls without a final answer") as err:
            await handle.result(timeout=10)
    assert err.value.error is not None
    assert err.value.error["type"].endswith(MaxTurnsExceeded.__name__)


def test_a_tool_describes_its_parameters_from_its_signature() -> None:
    app = tether.App("memory://")

    @app.tool(needs_approval=lambda args: args["amount"] > 100, reviewers=["group:finance"])
    def refund(order: str, amount: float, reason: str | None = None) -> str:
        """Refund an order."""
        return order

    assert refund.description == "Refund an order."
    assert refund.parameters == {
        "type": "object", "additionalProperties": False, "required": ["order", "amount"],
        "properties": {"order": {"type": "string"}, "amount": {"type": "number"},
                       "reason": {"anyOf": [{"type": "string"}, {"type": "null"}],
                                  "default": None}},
    }  # fmt: skip
    assert refund.asks_approval({"amount": 500}) is True
    assert refund.asks_approval({"amount": 5}) is False
    with pytest.raises(tether.ConfigurationError, match="give reviewers"):
        app.tool(name="risky", needs_approval=True, reviewers=[])(lambda: None)

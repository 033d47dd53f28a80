"""An agent run's transcript, read from what a real run on a SQLite file recorded: messages,
model calls with the usage the model reported and a cost from a price table, the approval
inline before the tool it guards, tool calls redacted and folded, totals; a pending and a
refused approval; model checkpoints recorded before usage was kept (they still replay, their
tokens are None); input kept only as a digest; a run that is not an agent's."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import tether
from tether.agents.models import Emit, ModelRequest, ModelResponse, response_from_json
from tether.agents.transcript import (
    FOLD_AT,
    ApprovalEntry,
    MessageEntry,
    ModelCallEntry,
    Price,
    ToolCallEntry,
    Totals,
    Transcript,
    transcript_json,
    transcript_of,
)
from tether.models import Scripted, ToolCall

pytestmark = pytest.mark.timeout(30)

SECRET = "sk-live-4f9a8b7c6d5e4f3a2b1c"
USAGE = [(100, 10), (150, 20), (200, 5)]  # (input, output) tokens of each scripted turn
TURNS: list[Any] = [
    [ToolCall("search_docs", {"query": "deploy"})],
    [ToolCall("deploy", {"version": "1.2.3", "api_key": SECRET})],
    "Deployed 1.2.3.",
]
PRICES = {"metered-1": Price(input=2.0, output=8.0)}


class Metered:
    """The scripted model, reporting usage and a model name as a provider does."""

    name = "metered"

    def __init__(self, turns: list[Any]) -> None:
        self.script = Scripted(turns)
        self.calls = 0

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelResponse:
        self.calls += 1
        response = await self.script.complete(request, emit)
        tokens_in, tokens_out = USAGE[sum(m["role"] == "assistant" for m in request.messages)]
        usage = {"input_tokens": tokens_in, "output_tokens": tokens_out}
        return dataclasses.replace(response, usage=usage, model="metered-1")


def deploy_app(url: str, model: Metered, effects: list[str]) -> tether.App:
    app = tether.App(url)

    @app.tool()
    async def search_docs(query: str) -> str:
        """Search the runbooks."""
        effects.append(f"search:{query}")
        return "x" * (FOLD_AT + 500)  # a long runbook: folded in the transcript

    @app.tool(needs_approval=True, reviewers=["alice"])
    async def deploy(version: str, api_key: str) -> str:
        """Deploy a version."""
        effects.append(f"deploy:{version}")
        return f"deployed {version}"

    agent = tether.Agent(model, "You deploy things.", [search_docs, deploy])

    @app.workflow()
    async def assistant(request: str) -> str:
        return (await agent.run(request)).output

    return app


async def pending(app: tether.App, run_id: str) -> tether.Approval:
    async with asyncio.timeout(10):
        while not (found := await app.list_approvals(run_id=run_id)):
            await asyncio.sleep(0.005)
    return found[0]


async def transcript(
    app: tether.App, run_id: str, prices: dict[str, Price] | None = None
) -> Transcript:
    handle = await app.get(run_id)
    return transcript_of(await handle.info(), await handle.checkpoints(),
                         await app.list_approvals(None, run_id=run_id), prices=prices)  # fmt: skip


def kinds(t: Transcript) -> list[str]:
    return [e.kind for e in t.entries]


async def test_an_agent_run_reads_as_a_conversation_with_its_approval_before_the_tool(
    tmp_path: Path,
) -> None:
    effects: list[str] = []
    app = deploy_app(f"sqlite:///{tmp_path / 'agent.db'}", Metered(TURNS), effects)
    async with app:
        handle = await app.start("assistant", "deploy 1.2.3", id="t-ok")
        ask = await pending(app, "t-ok")
        await app.decide(ask.id, "approve", reviewer="alice", operation_digest=ask.operation_digest,
                         comment="go ahead")  # fmt: skip
        assert await handle.result(timeout=10) == "Deployed 1.2.3."
        priced = await transcript(app, "t-ok", PRICES)
        unpriced = await transcript(app, "t-ok")
    assert effects == ["search:deploy", "deploy:1.2.3"]
    assert kinds(priced) == ["message", "model_call", "tool_call", "model_call", "approval",
                             "tool_call", "model_call", "message"]  # fmt: skip
    question, first, search, second, asked, deploy, third, answer = priced.entries
    assert question == MessageEntry("user", "deploy 1.2.3")
    assert answer == MessageEntry("assistant", "Deployed 1.2.3.")

    calls = [first, second, third]
    assert all(isinstance(c, ModelCallEntry) for c in calls)
    models = [c for c in calls if isinstance(c, ModelCallEntry)]
    assert [c.step for c in models] == ["agent.model", "agent.model#2", "agent.model#3"]
    assert [(c.tokens_in, c.tokens_out) for c in models] == USAGE
    assert {(c.model, c.status, c.attempts, c.agent) for c in models} == {
        ("metered-1", "completed", 1, "agent")
    }
    assert [c.cost for c in models] == [(i * 2.0 + o * 8.0) / 1e6 for i, o in USAGE]
    assert all(c.latency_ms is not None and c.latency_ms >= 0 and c.at for c in models)

    assert isinstance(search, ToolCallEntry)
    assert (search.tool, search.step, search.status) == ("search_docs", "search_docs", "completed")
    assert search.arguments == {"query": "deploy"}
    assert search.folded == ("result",)
    assert search.result == "x" * FOLD_AT + "…"

    # The approval sits right before the call it guarded, with how it was decided.
    assert isinstance(asked, ApprovalEntry)
    assert (asked.id, asked.tool, asked.title, asked.status) == (ask.id, "deploy", "Run deploy?",
                                                                 "approved")  # fmt: skip
    assert (asked.option, asked.reviewer, asked.comment) == ("approve", "alice", "go ahead")
    assert asked.approvers == ("alice",)
    assert asked.decided_at is not None
    assert isinstance(deploy, ToolCallEntry)
    assert (deploy.status, deploy.result, deploy.attempts) == ("completed", "deployed 1.2.3", 1)
    assert deploy.arguments == {"version": "1.2.3", "api_key": "[redacted]"}
    assert deploy.folded == ()

    totals = priced.totals
    assert (totals.model_calls, totals.tool_calls, totals.approvals) == (3, 2, 1)
    assert (totals.tokens_in, totals.tokens_out) == (450, 35)
    assert totals.cost == pytest.approx((450 * 2.0 + 35 * 8.0) / 1e6)
    assert (totals.unmetered, totals.unpriced) == (0, 0)
    assert totals.wall_ms is not None
    assert totals.wall_ms > 0
    # Without a price table nothing is guessed.
    assert [e.cost for e in unpriced.entries if isinstance(e, ModelCallEntry)] == [None] * 3
    assert (unpriced.totals.cost, unpriced.totals.unpriced) == (None, 3)

    shown = transcript_json(priced)
    text = json.dumps(shown)  # plain JSON all through
    assert SECRET not in text  # the model's own call arguments carried it, too
    assert (shown["run_id"], shown["workflow"], shown["status"]) == ("t-ok", "assistant",
                                                                     "succeeded")  # fmt: skip
    assert [e["kind"] for e in shown["entries"]] == kinds(priced)
    assert shown["entries"][4]["decided_at"] == asked.decided_at.isoformat()
    assert shown["entries"][5]["folded"] == []
    assert shown["totals"]["tokens_in"] == 450


async def test_a_pending_approval_shows_its_tool_waiting_and_a_refusal_shows_it_refused(
    tmp_path: Path,
) -> None:
    effects: list[str] = []
    app = deploy_app(f"sqlite:///{tmp_path / 'agent.db'}", Metered(TURNS), effects)
    async with app:
        handle = await app.start("assistant", "deploy 1.2.3", id="t-no")
        ask = await pending(app, "t-no")
        waiting = await transcript(app, "t-no")
        await app.decide(ask.id, "reject", reviewer="alice", operation_digest=ask.operation_digest)
        await handle.result(timeout=10)
        refused = await transcript(app, "t-no")
    assert kinds(waiting) == ["message", "model_call", "tool_call", "model_call", "approval",
                              "tool_call"]  # fmt: skip
    asked, deploy = waiting.entries[-2:]
    assert isinstance(asked, ApprovalEntry)
    assert isinstance(deploy, ToolCallEntry)
    assert (asked.status, asked.option, asked.reviewer) == ("pending", None, None)
    assert asked.decided_at is None
    assert (deploy.status, deploy.step, deploy.result) == ("waiting", None, None)
    assert waiting.totals.wall_ms is None  # the run goes on

    assert effects == ["search:deploy"]
    assert kinds(refused) == [*kinds(waiting), "model_call", "message"]
    asked, deploy = refused.entries[4:6]
    assert isinstance(asked, ApprovalEntry)
    assert isinstance(deploy, ToolCallEntry)
    assert (asked.status, asked.option, asked.reviewer) == ("rejected", "reject", "alice")
    assert (deploy.status, deploy.step, deploy.attempts) == ("refused", None, 0)
    assert refused.totals.tool_calls == 2


async def test_model_calls_recorded_without_usage_still_replay_and_have_no_tokens(
    tmp_path: Path,
) -> None:
    effects: list[str] = []
    url = f"sqlite:///{tmp_path / 'old.db'}"
    model = Metered(TURNS)
    async with deploy_app(url, model, effects) as app:
        await app.start("assistant", "deploy 1.2.3", id="t-old")
        ask = await pending(app, "t-old")
    # As recorded before usage and the model's name were kept: {"text", "tool_calls"} only.
    with sqlite3.connect(tmp_path / "old.db") as db:
        changed = db.execute("UPDATE tether_checkpoints SET result = json_remove(result, "
                             "'$.usage', '$.model') WHERE run_id = 't-old' AND kind = 'step' "
                             "AND name LIKE 'agent.model%'").rowcount  # fmt: skip
        [(old,)] = db.execute("SELECT result FROM tether_checkpoints WHERE run_id = 't-old' "
                              "AND name = 'agent.model#2'").fetchall()  # fmt: skip
    assert changed == 2
    assert set(json.loads(old)) == {"text", "tool_calls"}
    async with deploy_app(url, model, effects) as again:
        await again.decide(ask.id, "approve", reviewer="alice",
                           operation_digest=ask.operation_digest)  # fmt: skip
        assert await (await again.get("t-old")).result(timeout=10) == "Deployed 1.2.3."
        t = await transcript(again, "t-old", PRICES)
    assert model.calls == 3  # the two old turns were replayed from their checkpoints
    assert effects == ["search:deploy", "deploy:1.2.3"]
    models = [e for e in t.entries if isinstance(e, ModelCallEntry)]
    assert [(m.model, m.tokens_in, m.tokens_out, m.cost) for m in models] == [
        (None, None, None, None), (None, None, None, None),
        ("metered-1", 200, 5, (200 * 2.0 + 5 * 8.0) / 1e6),
    ]  # fmt: skip
    assert (t.totals.tokens_in, t.totals.tokens_out) == (200, 5)
    assert (t.totals.unmetered, t.totals.unpriced) == (2, 2)


def test_a_recorded_turn_reads_back_in_the_old_shape_and_the_new() -> None:
    old = response_from_json({"text": "hi", "tool_calls": []})
    assert (old.text, old.usage, old.model) == ("hi", {}, None)
    new = ModelResponse("hi", [], {"input_tokens": 3, "output_tokens": 1}, "gpt-x-2025")
    assert response_from_json(json.loads(json.dumps(new.to_json()))) == new
    # A turn without a model name records as it did before the name was kept.
    assert set(ModelResponse("hi").to_json()) == {"text", "tool_calls", "usage"}


async def test_an_input_kept_only_as_its_digest_shows_as_not_kept(tmp_path: Path) -> None:
    app = tether.App(f"sqlite:///{tmp_path / 'long.db'}")
    agent = tether.Agent(Scripted(["short answer"]))

    @app.workflow()
    async def chat(request: str) -> str:
        return (await agent.run(request)).output

    async with app:
        handle = await app.start(chat, "y" * 3000, id="t-long")
        await handle.result(timeout=10)
        t = await transcript(app, "t-long")
    assert kinds(t) == ["message", "model_call", "message"]
    assert t.entries[0] == MessageEntry("input", None)
    model = t.entries[1]
    assert isinstance(model, ModelCallEntry)
    # Scripted reports no usage: no tokens, and no cost whatever the price table.
    assert (model.model, model.tokens_in, model.tokens_out) == (None, None, None)
    assert (t.totals.tokens_in, t.totals.unmetered) == (None, 1)


async def test_a_run_that_is_not_an_agent_run_has_an_empty_transcript(tmp_path: Path) -> None:
    app = tether.App(f"sqlite:///{tmp_path / 'plain.db'}")

    @app.step()
    async def double(n: int) -> int:
        return n * 2

    @app.workflow()
    async def plain(n: int) -> int:
        return await double(n)

    async with app:
        handle = await app.start(plain, 21, id="t-plain")
        assert await handle.result(timeout=10) == 42
        t = await transcript(app, "t-plain")
    assert t.entries == ()
    assert dataclasses.replace(t.totals, wall_ms=None) == Totals()
    assert transcript_json(t)["entries"] == []


def test_a_price_table_must_hold_prices() -> None:
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    info = tether.RunInfo("r", "w", tether.RunStatus.PENDING, moment, moment, None, None, None, 0)
    with pytest.raises(tether.ConfigurationError, match="Price"):
        transcript_of(info, [], prices={"m": (1.0, 2.0)})  # type: ignore[dict-item]


async def test_an_approval_asked_for_one_call_of_a_tool_sits_before_that_call(
    tmp_path: Path,
) -> None:
    app = tether.App(f"sqlite:///{tmp_path / 'pay.db'}")

    @app.tool(needs_approval=lambda args: args["amount"] > 100, reviewers=["alice"],
              retry=tether.NO_RETRY)  # fmt: skip
    async def pay(amount: int) -> str:
        if amount > 1000:
            raise ValueError("the bank said no: password=hunter2")
        return f"paid {amount}"

    calls = [ToolCall("pay", {"amount": 50}), ToolCall("pay", {"amount": 500}),
             ToolCall("pay", {"amount": 5000})]  # fmt: skip
    agent = tether.Agent(Scripted([calls, "Paid twice."]), tools=[pay])

    @app.workflow()
    async def payments() -> str:
        return (await agent.run("pay them")).output

    async with app:
        handle = await app.start(payments, id="t-pay")
        for _ in range(2):
            ask = await pending(app, "t-pay")
            await app.decide(ask.id, "approve", reviewer="alice",
                             operation_digest=ask.operation_digest)  # fmt: skip
        assert await handle.result(timeout=10) == "Paid twice."
        t = await transcript(app, "t-pay")
    assert kinds(t) == ["message", "model_call", "tool_call", "approval", "tool_call",
                        "approval", "tool_call", "model_call", "message"]  # fmt: skip
    small, _, large, _, huge = t.entries[2:7]
    assert isinstance(small, ToolCallEntry)
    assert isinstance(large, ToolCallEntry)
    assert isinstance(huge, ToolCallEntry)
    assert [(c.arguments, c.step, c.status) for c in (small, large)] == [
        ({"amount": 50}, "pay", "completed"), ({"amount": 500}, "pay#2", "completed"),
    ]  # fmt: skip
    # A tool that raised: its error as the run recorded it, redacted.
    assert (huge.status, huge.result, huge.step) == ("failed", None, "pay#3")
    assert huge.error == {"type": "ValueError",
                          "message": "the bank said no: password=[redacted]"}  # fmt: skip

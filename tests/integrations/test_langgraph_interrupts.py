"""LangGraph's interrupt() answered by Tether approvals: the graph pauses, a person decides in
Tether, the graph resumes with the decision; one approval per interrupt (keyed by thread and
interrupt id) across replays, on every backend and in forced-replay mode."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import tether
from tether.integrations.langgraph.interrupts import run_graph

MakeApp = Callable[..., tether.App]


class State(TypedDict, total=False):
    amount: int
    verdict: str
    log: list[str]


def build_graph(effects: list[str]) -> Any:
    def propose(state: State) -> State:
        return {"log": [*state.get("log", []), f"proposed {state['amount']}"]}

    def review(state: State) -> State:
        answer = interrupt({"title": f"Refund {state['amount']}?", "tool": "refund",
                            "arguments": {"amount": state["amount"]}})  # fmt: skip
        return {"verdict": "yes" if answer["approved"] else f"no ({answer['status']})"}

    def act(state: State) -> State:
        if state["verdict"] == "yes":
            effects.append(f"refund {state['amount']}")
        return {"log": [*state.get("log", []), f"acted: {state['verdict']}"]}

    graph = StateGraph(State)
    graph.add_node("propose", propose)
    graph.add_node("review", review)
    graph.add_node("act", act)
    graph.add_edge(START, "propose")
    graph.add_edge("propose", "review")
    graph.add_edge("review", "act")
    graph.add_edge("act", END)
    return graph.compile(checkpointer=InMemorySaver())


def build_app(make_app: MakeApp, effects: list[str]) -> tether.App:
    app = make_app()
    graph = build_graph(effects)

    @app.workflow()
    async def refunds(amount: int) -> Any:
        return await run_graph(graph, {"amount": amount}, thread_id=f"refund-{amount}",
                               reviewers=["group:finance"])  # fmt: skip

    return app


FINANCE = tether.Reviewer("fin", frozenset({"finance"}))


async def pending(app: tether.App, run_id: str) -> tether.Approval:
    async with asyncio.timeout(10):
        while not (found := await app.list_approvals(run_id=run_id)):
            await asyncio.sleep(0.005)
    return found[0]


@pytest.mark.parametrize(("option", "verdict", "refunds"), [
    ("approve", "yes", ["refund 250"]), ("reject", "no (rejected)", []),
])  # fmt: skip
async def test_an_interrupt_becomes_an_approval_and_the_decision_resumes_the_graph(
    make_app: MakeApp, option: str, verdict: str, refunds: list[str]
) -> None:
    effects: list[str] = []
    app = build_app(make_app, effects)
    async with app:
        handle = await app.start("refunds", 250, id="lg-1")
        ask = await pending(app, "lg-1")
        assert ask.title == "Refund 250?"
        assert ask.operation == {"title": "Refund 250?", "tool": "refund",
                                 "arguments": {"amount": 250}}  # fmt: skip
        await app.decide(ask.id, option, reviewer=FINANCE, operation_digest=ask.operation_digest)
        result = await handle.result(timeout=10)
        approvals = await app.list_approvals(None, run_id="lg-1")
    assert result["verdict"] == verdict
    assert result["log"] == ["proposed 250", f"acted: {verdict}"]
    assert effects == refunds
    assert [a.step.split(":")[1] for a in approvals] == ["langgraph"]  # one, keyed by the thread
    assert approvals[0].step.startswith("approval:langgraph:refund-250:")


async def test_with_tether_saver_the_pause_survives_the_process_and_resumes_once(
    tmp_path: Any,
) -> None:
    from tether.integrations.langgraph import TetherSaver

    url = f"sqlite:///{tmp_path}/lg.db"
    effects: list[str] = []

    def build() -> tether.App:
        app = tether.App(url)
        graph = build_graph(effects)
        durable = graph.builder.compile(checkpointer=TetherSaver.from_url(url))

        @app.workflow()
        async def refunds(amount: int) -> Any:
            return await run_graph(durable, {"amount": amount}, thread_id=f"t-{amount}",
                                   reviewers=["group:finance"])  # fmt: skip

        return app

    first = build()
    async with first:
        await first.start("refunds", 99, id="lg-restart")
        ask = await pending(first, "lg-restart")
    second = build()  # a new App, a new graph object: only the database remembers
    async with second:
        await second.decide(ask.id, "approve", reviewer=FINANCE,
                            operation_digest=ask.operation_digest)  # fmt: skip
        result = await (await second.get("lg-restart")).result(timeout=15)
        asked = await second.list_approvals(None, run_id="lg-restart")
    assert result["log"] == ["proposed 99", "acted: yes"]
    assert effects == ["refund 99"]
    assert len(asked) == 1

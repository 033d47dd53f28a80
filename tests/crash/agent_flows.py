"""The agent run the agent crash tests kill, and its process: a model of four turns (search the
runbooks; read metrics and logs, two tool calls at once; restart the service, a tool a person
must approve; the final answer), every turn's text streamed to the run's "tokens" stream.

The checkpoints of a run, in order: agent.model, search_docs, agent.model#2, metrics, logs,
agent.model#3, approval, approval:wait, restart, agent.model#4 (see CHECKPOINTS).

Every model call and tool body appends "<checkpoint name>\\t<wall time>" to the `bodies` side
file, flushed and fsynced (flows.py's helper), so the test counts body executions across
processes killed with SIGKILL, and sees when the guarded tool ran. The model is `Narrated`, a
Scripted model that also says a sentence on its tool-call turns and whose final answer quotes the
tool results it was given (so a lost or repeated result would show in the answer).

$CRASH_HANG_IN=<checkpoint name> (a model step or a tool): that body writes the marker file
`started-<name>` and sleeps 60 s for the test to kill the process; a model call first streams
the first half of its words (they reach the database while it sleeps).

`python -m tests.crash.agent_flows run DB SIDE_DIR RUN_ID`
    Opens the app (its in-process worker first recovers the runs of dead workers on this host),
    starts run RUN_ID of `helper` (an existing run with that id is the same run), waits for its
    result and writes {run id: result} as JSON to SIDE_DIR/result-<pid>.json.

DB is a database URL (sqlite:///..., postgresql://...?schema=...) or the path of a SQLite file.
Faults come from $TETHER_FAULTS; $CRASH_INLINE_WAIT is the App's inline_wait_max (how long the
approval's wait holds the run in memory before it suspends; default: the library's, 2 s).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tether
from tether.agents.models import Emit, ModelRequest, ModelResponse, Scripted, ToolCall, Turn
from tether.approvals.flow import approval_id
from tether.core.context import current_step
from tether.core.handle import RunHandle

from .backends import database_url
from .flows import _append, read_lines

WORKFLOW = "helper"
REQUEST = "the api is failing"
SERVICE = "api"
STREAM = "tokens"
STEP = "approval"  # the checkpoint of the agent's (only) approval
WAIT = "approval:wait"  # the checkpoint of its wait for the decision
MODEL = ["agent.model", "agent.model#2", "agent.model#3", "agent.model#4"]
TOOLS = ["search_docs", "metrics", "logs", "restart"]
GUARDED = "restart"  # the tool that needs approval
CHECKPOINTS = [
    "agent.model",
    "search_docs",
    "agent.model#2",
    "metrics",
    "logs",
    "agent.model#3",
    STEP,
    WAIT,
    "restart",
    "agent.model#4",
]
TURNS: list[Turn] = [
    [ToolCall("search_docs", {"query": "api errors"})],
    [ToolCall("metrics", {"service": SERVICE}), ToolCall("logs", {"service": SERVICE})],
    [ToolCall("restart", {"service": SERVICE})],
    "(the final answer quotes the tool results)",
]
# What the model says on each turn: the last one is made from the tool results it was given.
NARRATION = [
    "Let me search the runbooks for api errors first.",
    "The runbook says to check the metrics and the logs, both at once.",
    "The logs show a stuck pool: a restart should fix it, once someone approves.",
]
RESULTS = ["runbook(api errors)", "metrics(api)", "logs(api)", "restarted(api)"]


def final_answer(results: Sequence[str]) -> str:
    return f"Done: I read {results[0]}, {results[1]} and {results[2]}, then {results[3]}."


FINAL = final_answer(RESULTS)
TEXTS = [*NARRATION, FINAL]  # each model step's text, in the order of MODEL
EXPECTED = {"output": FINAL, "turns": 4, "tools": RESULTS, "refused": []}


def words(text: str) -> list[str]:
    """The chunks a model step streams for `text`: its words, each but the last with its space."""
    parts = text.split(" ")
    return [w if n == len(parts) - 1 else w + " " for n, w in enumerate(parts)]


def approval_of(run_id: str) -> str:
    return approval_id(run_id, STEP)


def operation() -> dict[str, Any]:
    """The operation the approval is bound to."""
    return {"tool": GUARDED, "arguments": {"service": SERVICE}}


def read_bodies(side: Path) -> list[tuple[str, float]]:
    """(checkpoint name, wall time) of every body execution so far, in order."""
    found = []
    for line in read_lines(side / "bodies"):
        name, _, at = line.partition("\t")
        found.append((name, float(at)))
    return found


async def _quiet(chunk: str) -> None:
    """Scripted's own emit, unused: Narrated streams the turn itself."""


class Narrated(Scripted):
    """TURNS, with NARRATION said on the tool-call turns and a final answer that quotes the
    results of the tool calls in the conversation; it counts its calls and hangs on request."""

    name = "narrated"

    def __init__(self, body: Any) -> None:
        super().__init__(TURNS)
        self.body = body

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelResponse:
        index = sum(1 for m in request.messages if m.get("role") == "assistant")
        if index < len(NARRATION):
            text = NARRATION[index]
        else:
            text = final_answer([m["content"] for m in request.messages if m["role"] == "tool"])
        chunks = words(text)
        await self.body(chunks[: len(chunks) // 2], emit)
        for chunk in chunks:
            await emit(chunk)
        calls = (await super().complete(request, _quiet)).tool_calls
        return ModelResponse(text=text, tool_calls=calls)


def make_app(
    db: str | Path, side_dir: str | Path | None = None, inline_wait_max: float | None = None
) -> tether.App:
    """An App on `db` with `helper` registered; side files go to `side_dir` (default:
    $CRASH_SIDE_DIR), waits held inline up to `inline_wait_max` (default: $CRASH_INLINE_WAIT,
    else the library's)."""
    side = Path(side_dir if side_dir is not None else os.environ["CRASH_SIDE_DIR"])
    hang_in = os.environ.get("CRASH_HANG_IN")
    app = tether.App(database_url(db))
    if inline_wait_max is None and os.environ.get("CRASH_INLINE_WAIT"):
        inline_wait_max = float(os.environ["CRASH_INLINE_WAIT"])
    if inline_wait_max is not None:
        app.engine.settings = dataclasses.replace(
            app.engine.settings, inline_wait_max=inline_wait_max
        )

    async def body(partial: Sequence[str] = (), emit: Emit | None = None) -> None:
        """Record this body execution; hang here if asked (a model call streams `partial`
        first)."""
        step = current_step()
        assert step is not None
        _append(side / "bodies", f"{step.name}\t{time.time():.6f}")
        if step.name == hang_in:
            for chunk in partial:
                assert emit is not None
                await emit(chunk)
            _append(side / f"started-{step.name}", str(os.getpid()))
            await asyncio.sleep(60)  # the test kills this process meanwhile
            raise AssertionError(f"{step.name} was not killed while it hung")

    @app.tool()
    async def search_docs(query: str) -> str:
        """Search the runbooks."""
        await body()
        return f"runbook({query})"

    @app.tool()
    async def metrics(service: str) -> str:
        """Read a service's metrics."""
        await body()
        return f"metrics({service})"

    @app.tool()
    async def logs(service: str) -> str:
        """Read a service's logs."""
        await body()
        return f"logs({service})"

    @app.tool(needs_approval=True, reviewers=["*"])
    async def restart(service: str) -> str:
        """Restart a service."""
        await body()
        return f"restarted({service})"

    agent = tether.Agent(
        Narrated(body), "You keep services up.", [search_docs, metrics, logs, restart]
    )

    @app.workflow(name=WORKFLOW)
    async def helper(request: str) -> dict[str, Any]:
        result = await agent.run(request)
        tools = [m["content"] for m in result.messages if m["role"] == "tool"]
        return {"output": result.output, "turns": result.turns, "tools": tools,
                "refused": result.refused}  # fmt: skip

    return app


async def run(db: str, side_dir: str, run_id: str) -> None:
    app = make_app(db, side_dir)
    async with app:
        handle: RunHandle[Any] = await app.start(WORKFLOW, REQUEST, id=run_id)
        result = await handle.result(timeout=60)
    path = Path(side_dir) / f"result-{os.getpid()}.json"
    path.write_text(json.dumps({run_id: result}), encoding="utf-8")


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    assert command == "run", command
    asyncio.run(run(*rest))

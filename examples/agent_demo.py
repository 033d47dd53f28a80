"""Tether's demo: a durable agent that researches, checks, and proposes a production deploy that a
person must approve. Its worker is killed with SIGKILL while it waits for the approval; the
decision arrives while no worker runs; a new worker resumes the run from its checkpoints and
the deploy runs exactly once.

    make demo                    (or: python examples/agent_demo.py)
    python examples/agent_demo.py --serve     decide in the browser inbox instead

The model is scripted (offline, deterministic) unless OPENAI_API_KEY or ANTHROPIC_API_KEY is
set. Every tool body and model call writes a line to a journal, synced before it returns, so
the timeline below is evidence, not a story.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import tether
from tether.models import Model, ModelRequest, ModelResponse, Scripted, ToolCall

RUN_ID = "release-42"
SRE = tether.Reviewer("alice", frozenset({"sre"}))
SCRIPT = [
    [ToolCall("search_docs", {"query": "production deploy checklist"})],
    [ToolCall("run_checks", {"version": "1.2.3"})],
    [ToolCall("deploy", {"version": "1.2.3", "env": "prod"})],
    "Deployed 1.2.3 to prod: the checklist was followed, all checks passed, and a person "
    "approved the deploy.",
]


def journal(event: str, what: str, **detail: Any) -> None:
    """Append one line to the journal (synced: it must survive the SIGKILL)."""
    line = json.dumps({"t": time.time(), "pid": os.getpid(), "event": event, "what": what,
                       **detail})  # fmt: skip
    with open(os.environ["DEMO_JOURNAL"], "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


class Journaled:
    """The model, with each call written to the journal."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.name = model.name

    async def complete(self, request: ModelRequest, emit: Any) -> ModelResponse:
        turn = sum(1 for m in request.messages if m.get("role") == "assistant") + 1
        journal("start", f"model call {turn}")
        response = await self.model.complete(request, emit)
        asked = ", ".join(c.name for c in response.tool_calls) or "final answer"
        journal("end", f"model call {turn}", asked=asked)
        return response


def pick_model() -> Model:
    if os.environ.get("OPENAI_API_KEY"):
        from tether.models import OpenAIChat

        return OpenAIChat(os.environ.get("TETHER_DEMO_MODEL", "gpt-4.1-mini"))
    if os.environ.get("ANTHROPIC_API_KEY"):
        from tether.models import AnthropicMessages

        return AnthropicMessages(os.environ.get("TETHER_DEMO_MODEL", "claude-sonnet-4-5"))
    return Scripted(SCRIPT)


def make_app(url: str) -> tether.App:
    app = tether.App(url)

    @app.tool()
    async def search_docs(query: str) -> list[str]:
        """Search the team's runbooks."""
        journal("start", "search_docs")
        await asyncio.sleep(0.2)
        journal("end", "search_docs")
        return ["Deploys go out after the test suite and the canary checks pass."]

    @app.tool()
    async def run_checks(version: str) -> dict[str, str]:
        """Run the release checks of a version."""
        journal("start", "run_checks")
        await asyncio.sleep(0.3)
        journal("end", "run_checks")
        return {"tests": "passed", "canary": "healthy", "version": version}

    @app.tool(needs_approval=True, reviewers=["group:sre"])
    async def deploy(version: str, env: str = "prod") -> str:
        """Deploy a version to an environment."""
        journal("start", "deploy")
        await asyncio.sleep(0.2)
        journal("end", "deploy", key=tether.idempotency_key())
        return f"{version} is live in {env}"

    agent = tether.Agent(
        Journaled(pick_model()),
        "You are a release assistant. Read the runbook, run the checks, then deploy.",
        [search_docs, run_checks, deploy],
        name="release-agent",
    )

    @app.workflow()
    async def release(request: str) -> dict[str, Any]:
        result = await agent.run(request)
        return {"answer": result.output, "turns": result.turns, "refused": result.refused}

    return app


async def worker(url: str) -> None:
    """One worker process: start the run (the same id finds the same run) and wait for it."""
    app = make_app(url)
    async with app:
        await (await app.start("release", "Ship 1.2.3 to production.", id=RUN_ID)).result()


async def pending_approval(app: tether.App, proc: subprocess.Popen[bytes]) -> tether.Approval:
    while not (found := await app.list_approvals(run_id=RUN_ID)):
        if proc.poll() is not None:
            raise SystemExit("the worker exited before asking for approval; see its output")
        await asyncio.sleep(0.02)
    return found[0]


async def serve_inbox(app: tether.App, console: Console) -> None:
    """Serve the inbox on 127.0.0.1:8000 until the approval is decided in the browser."""
    import uvicorn

    from tether.server import create_server
    from tether.users import add_user

    _, token = await add_user(app.engine, SRE.name, SRE.groups)
    server = uvicorn.Server(uvicorn.Config(create_server(app), host="127.0.0.1", port=8000,
                                           log_level="warning"))  # fmt: skip
    task = asyncio.create_task(server.serve())
    console.print("[bold]Open http://127.0.0.1:8000/ and sign in as alice with this token:[/]")
    console.print(token, markup=False)
    while (await app.list_approvals(status=None, run_id=RUN_ID))[0].status == "pending":
        await asyncio.sleep(0.2)
    server.should_exit = True
    await task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help="decide in the browser inbox")
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(args.worker))
        return
    console = Console()
    with tempfile.TemporaryDirectory(prefix="tether-demo-") as tmp:
        url = f"sqlite:///{tmp}/demo.db"
        log = Path(tmp) / "journal.jsonl"
        env = dict(os.environ, DEMO_JOURNAL=str(log))
        os.environ["DEMO_JOURNAL"] = str(log)
        command = [sys.executable, __file__, "--worker", url]
        console.print(f"[bold]Tether agent demo[/] on {url} (model: {pick_model().name})")
        asyncio.run(orchestrate(console, url, log, env, command, serve=args.serve))


async def orchestrate(
    console: Console, url: str, log: Path, env: dict[str, str], command: list[str], *,
    serve: bool,
) -> None:  # fmt: skip
    marks: list[tuple[float, str, str]] = []
    t0 = time.time()
    app = make_app(url)
    first = subprocess.Popen(command, env=env)
    marks.append((time.time(), "1", f"worker 1 starts (pid {first.pid})"))
    ask = await pending_approval(app, first)
    marks.append((time.time(), "1", f"approval asked: {ask.title} {ask.operation}"))
    await asyncio.sleep(0.3)  # the run now waits, holding no thread
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    marks.append((time.time(), "1", "[red]SIGKILL[/] while the run waits for the approval"))
    console.print(f"worker 1 (pid {first.pid}) [red]killed with SIGKILL[/]; no worker runs now")
    if serve:
        await serve_inbox(app, console)
        decided = (await app.list_approvals(status=None, run_id=RUN_ID))[0].decision
        who = decided.reviewer if decided else "?"
        marks.append((time.time(), "-", f"decided in the browser by {who}"))
    else:
        await asyncio.sleep(1.0)  # a person reads the approval
        decision = await app.decide(ask.id, "approve", reviewer=SRE,
                                    operation_digest=ask.operation_digest,
                                    comment="checks are green")  # fmt: skip
        what = (f"{decision.status} by {decision.reviewer} (digest "
                f"{ask.operation_digest[:12]}...), no worker running")  # fmt: skip
        marks.append((time.time(), "-", what))
    recorded = len(await (await app.get(RUN_ID)).checkpoints())
    second_start = time.time()
    second = subprocess.Popen(command, env=env)
    marks.append((second_start, "2", f"worker 2 starts (pid {second.pid})"))
    if second.wait() != 0:
        raise SystemExit("worker 2 failed; see its output above")
    await report(console, app, log, first.pid, t0, marks, second_start, recorded)
    await app.close()


async def report(
    console: Console, app: tether.App, log: Path, first_pid: int, t0: float,
    marks: list[tuple[float, str, str]], second_start: float, recorded: int,
) -> None:  # fmt: skip
    handle = await app.get(RUN_ID)
    info, checkpoints = await handle.info(), await handle.checkpoints()
    result = await handle.result()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert info.finished_at is not None
    finished = info.finished_at.timestamp()
    rows = [(e["t"], "1" if e["pid"] == first_pid else "2",
             f"{e['what']} {'starts' if e['event'] == 'start' else 'ends'}"
             + (f" -> {e['asked']}" if e.get("asked") else "")) for e in events]  # fmt: skip
    rows += [*marks, (finished, "2", f"run {info.status.value}")]
    timeline = Table(title="Timeline (seconds since the demo started)")
    for column in ("t", "worker", "what"):
        timeline.add_column(column)
    for t, who, what in sorted(rows):
        timeline.add_row(f"{t - t0:6.2f}", who, what)
    console.print(timeline)

    started = [e for e in events if e["event"] == "start"]
    table = Table(title="Checkpoints: what worker 2 replayed and what it executed")
    for column in ("checkpoint", "kind", "bodies run by worker 1", "by worker 2", "worker 2"):
        table.add_column(column)
    tools = {"search_docs", "run_checks", "deploy"}
    model_calls = iter(e for e in started if e["what"].startswith("model call"))
    for n, cp in enumerate(checkpoints):
        base = cp.name.split("#")[0]
        if base in tools:
            pids = [e["pid"] for e in started if e["what"] == base]
        elif cp.name.startswith("release-agent.model"):
            pids = [next(model_calls)["pid"]]
        else:
            pids = []
        in1 = sum(1 for p in pids if p == first_pid)
        in2 = len(pids) - in1
        how = "replayed from its checkpoint" if n < recorded else "executed"
        table.add_row(cp.name, cp.kind, str(in1), str(in2), how)
    console.print(table)
    approval = (await app.list_approvals(status=None, run_id=RUN_ID))[0]
    trail = ", ".join(f"{e.event}{f' ({e.actor})' if e.actor else ''}"
                      for e in await app.approval_history(approval.id))  # fmt: skip
    tokens: dict[int, object] = {}
    async for offset, entry in app.read_stream(RUN_ID, "tokens", follow=False):
        if isinstance(entry, tether.StreamReset):
            for gone in entry.offsets:
                tokens.pop(gone, None)
        else:
            tokens[offset] = entry
    broken = {k: v for k, v in (await app.verify_approvals()).items() if v}
    console.print(f"approval trail: {trail}; hash chain {'BROKEN' if broken else 'intact'}")
    console.print(f"streamed tokens: {''.join(str(tokens[k]) for k in sorted(tokens))!r}")
    console.print(f"result: {result}")
    console.print(f"recovery: worker 2 finished the run {finished - second_start:.2f} s after "
                  f"its process started (Python start-up included)")  # fmt: skip
    deploys = [e for e in started if e["what"] == "deploy"]
    twice = [t for t in tools if sum(1 for e in started if e["what"] == t) != 1]
    if twice or len(deploys) != 1 or info.status is not tether.RunStatus.SUCCEEDED:
        raise SystemExit(f"unexpected: tools not run exactly once {twice}, status {info.status}")
    console.print("[green]every tool ran exactly once; the deploy ran once, after approval[/]")


if __name__ == "__main__":
    main()

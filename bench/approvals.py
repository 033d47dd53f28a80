"""Approval benchmarks on SQLite (WAL, synchronous=FULL): from `app.decide` to the run's next
step starting, with the waiting run in the deciding process and in another worker process; and,
beside it when a scratch environment has LangGraph, its interrupt + resume cycle on SqliteSaver.
Prints only; nothing here asserts a time.

    python bench/approvals.py [--quick] [--peer-python /path/to/venv/bin/python]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tether

ROOT = Path(__file__).resolve().parent.parent


def make_app(url: str) -> tether.App:
    app = tether.App(url)

    @app.step()
    async def resumed() -> float:
        return time.time()  # when the step after the decision starts

    @app.workflow()
    async def gated(rounds: int) -> list[float]:
        stamps = []
        for n in range(rounds):
            decision = await tether.approval(
                f"Round {n}?", operation={"tool": "deploy", "arguments": {"n": n}},
                reviewers=["bench"],
            )  # fmt: skip
            assert decision.approved
            stamps.append(await resumed())
        return stamps

    return app


async def decide_rounds(app: tether.App, run_id: str, rounds: int) -> list[float]:
    """Decide each approval as it appears; the time each decision was asked for."""
    sent = []
    seen: set[str] = set()
    for _ in range(rounds):
        while True:
            found = [a for a in await app.list_approvals(run_id=run_id) if a.id not in seen]
            if found:
                break
            await asyncio.sleep(0.002)
        ask = found[0]
        seen.add(ask.id)
        await asyncio.sleep(0.02)  # the run is back in its wait (held or suspended)
        sent.append(time.time())
        await app.decide(ask.id, "approve", reviewer="bench", operation_digest=ask.operation_digest)
    return sent


async def in_process(url: str, rounds: int) -> list[float]:
    app = make_app(url)
    async with app:
        handle = await app.start("gated", rounds, id="in-process")
        sent = await decide_rounds(app, "in-process", rounds)
        stamps = await handle.result(timeout=120)
    return [(b - a) * 1000 for a, b in zip(sent, stamps, strict=True)]


WORKER = """
import asyncio, sys
sys.path.insert(0, {root!r})
from bench.approvals import make_app
app = make_app({url!r})
async def main():
    async with app:
        await (await app.start("gated", {rounds}, id="cross")).result(timeout=300)
asyncio.run(main())
"""


async def cross_process(folder: Path, rounds: int) -> list[float]:
    url = f"sqlite:///{folder}/cross.db"
    proc = subprocess.Popen([sys.executable, "-c", WORKER.format(root=str(ROOT), url=url,
                                                                 rounds=rounds)])  # fmt: skip
    decider = tether.App(url)
    try:
        while True:
            try:
                await decider.get("cross")
                break
            except tether.RunNotFound:
                await asyncio.sleep(0.05)
        sent = await decide_rounds(decider, "cross", rounds)
        stamps = await (await decider.get("cross")).result(timeout=120)
    finally:
        await decider.close()
        proc.wait(timeout=60)
    return [(b - a) * 1000 for a, b in zip(sent, stamps, strict=True)]


LANGGRAPH = """
import sqlite3, statistics, sys, time
from typing import TypedDict
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

class State(TypedDict):
    n: int
    stamp: float

def ask(state):
    answer = interrupt({{"question": "deploy?", "n": state["n"]}})
    return {{"n": state["n"] + (1 if answer == "approve" else 0)}}

def act(state):
    return {{"stamp": time.time()}}

graph = StateGraph(State)
graph.add_node("ask", ask)
graph.add_node("act", act)
graph.add_edge(START, "ask")
graph.add_edge("ask", "act")
graph.add_edge("act", END)
conn = sqlite3.connect({db!r}, check_same_thread=False)
conn.execute("PRAGMA journal_mode=WAL")
conn.execute("PRAGMA synchronous=FULL")
app = graph.compile(checkpointer=SqliteSaver(conn))
cycles = []
for i in range({rounds}):
    config = {{"configurable": {{"thread_id": f"t{{i}}"}}}}
    started = time.time()
    app.invoke({{"n": 0, "stamp": 0.0}}, config, durability="sync")   # runs until interrupt()
    resumed = time.time()
    out = app.invoke(Command(resume="approve"), config, durability="sync")
    cycles.append(((time.time() - started) * 1000, (out["stamp"] - resumed) * 1000))
print(statistics.median(c[0] for c in cycles), statistics.median(c[1] for c in cycles))
"""


def langgraph_cycle(python: str, folder: Path, rounds: int) -> tuple[float, float] | None:
    """(interrupt + resume cycle, resume -> next node) medians in ms, or None without LangGraph."""
    script = LANGGRAPH.format(db=str(folder / "langgraph.db"), rounds=rounds)
    out = subprocess.run([python, "-c", script], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        print(f"(LangGraph not measured: {out.stderr.strip().splitlines()[-1:]})")
        return None
    cycle, resume = (float(x) for x in out.stdout.split())
    return cycle, resume


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument(
        "--peer-python",
        default=os.environ.get("TETHER_PEER_PYTHON"),
        help="a Python with langgraph and langgraph-checkpoint-sqlite installed",
    )
    args = parser.parse_args()
    rounds = 30 if args.quick else 100
    with tempfile.TemporaryDirectory(prefix="tether-bench-", dir=ROOT / "bench") as tmp:
        folder = Path(tmp)
        local = asyncio.run(in_process(f"sqlite:///{folder}/local.db", rounds))
        remote = asyncio.run(cross_process(folder, rounds // 2))
        peer = langgraph_cycle(args.peer_python, folder, rounds) if args.peer_python else None

    def line(label: str, values: list[float], target: str) -> str:
        p90 = sorted(values)[int(len(values) * 0.9)]
        return f"{label} p50 {statistics.median(values):6.2f} ms   p90 {p90:6.2f} ms   ({target})"

    print(line("decision -> run resumes, in-process   ", local, "target p50 <= 5 ms"))
    print(line("decision -> run resumes, cross-process", remote, "target p50 <= 25 ms"))
    if peer is not None:
        print(f"LangGraph interrupt + resume cycle       p50 {peer[0]:6.2f} ms   "
              f"(resume -> next node {peer[1]:.2f} ms; SqliteSaver, durability=sync)")  # fmt: skip
    else:
        print("LangGraph: not measured (pass --peer-python or set TETHER_PEER_PYTHON)")


if __name__ == "__main__":
    os.environ.pop("TETHER_FAULTS", None)
    main()

"""TetherSaver against LangGraph's SqliteSaver: a 10-node linear graph, one invocation per thread
id, durability="sync", both on SQLite files with WAL and synchronous=FULL, measured in the same
run. The contenders take turns every few invocations (in rotating order), so a disk whose speed
drifts during the run slows them alike. Prints only; asserts nothing.

    python bench/langgraph.py [--quick] [--invocations N] [--turn K] [--json]

Each step makes LangGraph call put_writes (the node's output) and then put (the next
checkpoint), and the graph waits for the put. SqliteSaver commits each: two fsyncs a step.
TetherSaver commits both in one transaction (the writes wait for the checkpoint, at most 1 ms),
so one fsync a step: its advantage grows with the disk's fsync latency, printed alongside.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file has the name of the package it measures: run as a script, its folder comes first on
# sys.path and would shadow LangGraph. Take the folder off before importing (python -m
# bench.langgraph needs no help).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import sqlite3  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import ExitStack, contextmanager  # noqa: E402
from typing import Any, TypedDict  # noqa: E402

from langgraph.checkpoint.base import BaseCheckpointSaver  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

from tether.integrations.langgraph import TetherSaver  # noqa: E402
from tether.store.drivers.sqlite import parse_sqlite_url  # noqa: E402

NODES = 10
Runner = Callable[[list[str]], None]  # invokes the graph once per thread id given


class State(TypedDict):
    count: int
    log: list[str]


def linear_graph(saver: BaseCheckpointSaver[Any]) -> Any:
    graph = StateGraph(State)
    previous = START
    for i in range(NODES):
        graph.add_node(
            f"n{i}", lambda s, i=i: {"count": s["count"] + 1, "log": [*s["log"], f"n{i}"]}
        )
        graph.add_edge(previous, f"n{i}")
        previous = f"n{i}"
    graph.add_edge(previous, END)
    return graph.compile(checkpointer=saver)


def sync_runner(saver: BaseCheckpointSaver[Any]) -> Runner:
    graph = linear_graph(saver)

    def run(threads: list[str]) -> None:
        for thread in threads:
            config = {"configurable": {"thread_id": thread}}
            graph.invoke({"count": 0, "log": []}, config, durability="sync")

    return run


@contextmanager
def sqlite_saver(folder: Path, synchronous: str | None) -> Iterator[tuple[Runner, str]]:
    conn = sqlite3.connect(folder / "langgraph.db", check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()  # sets journal_mode=WAL, leaves synchronous at SQLite's default: read it back
    if synchronous is not None:
        conn.execute(f"PRAGMA synchronous={synchronous}")
    (level,) = conn.execute("PRAGMA synchronous").fetchone()
    yield sync_runner(saver), {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[level]
    conn.close()


@contextmanager
def tether(folder: Path, synchronous: str | None) -> Iterator[tuple[Runner, str]]:
    url = f"sqlite:///{folder}/tether.db?synchronous={synchronous or 'FULL'}"  # it applies this
    with TetherSaver.from_url(url) as saver:
        yield sync_runner(saver), parse_sqlite_url(url)[1]


@contextmanager
def tether_async(folder: Path, synchronous: str | None) -> Iterator[tuple[Runner, str]]:
    url = f"sqlite:///{folder}/tether-async.db?synchronous={synchronous or 'FULL'}"
    loop = asyncio.new_event_loop()
    saver = TetherSaver.from_url(url)
    graph = linear_graph(saver)

    async def invoke_all(threads: list[str]) -> None:
        for thread in threads:
            config = {"configurable": {"thread_id": thread}}
            await graph.ainvoke({"count": 0, "log": []}, config, durability="sync")

    try:
        yield (
            (lambda threads: loop.run_until_complete(invoke_all(threads))),
            parse_sqlite_url(url)[1],
        )
    finally:
        loop.run_until_complete(saver.aclose())
        loop.close()


CONTENDERS = {
    "sqlite_saver": ("SqliteSaver, invoke", sqlite_saver),
    "tether": ("TetherSaver, invoke", tether),
    "tether_async": ("TetherSaver, ainvoke", tether_async),
}


def commit_ms(folder: Path, n: int) -> float:
    """One-row INSERT + COMMIT, WAL and synchronous=FULL: roughly the disk's fsync latency."""
    conn = sqlite3.connect(folder / "raw.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (v INTEGER)")
    start = time.perf_counter()
    for i in range(n):
        conn.execute("INSERT INTO t VALUES (?)", (i,))
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed / n * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="60 invocations each")
    parser.add_argument("--invocations", type=int, default=300, help="per contender")
    parser.add_argument("--turn", type=int, default=10, help="invocations per turn")
    parser.add_argument(
        "--synchronous", choices=("OFF", "NORMAL", "FULL"), help="for both (default: FULL, "
        "SqliteSaver's own setting); OFF shows the CPU cost alone",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    invocations = 60 if args.quick else args.invocations
    spent = dict.fromkeys(CONTENDERS, 0.0)
    commits: list[float] = []
    with tempfile.TemporaryDirectory(prefix="tether-bench-lg-") as tmp, ExitStack() as stack:
        folder = Path(tmp)
        runners, modes = {}, {}
        for name, (_, contender) in CONTENDERS.items():
            runners[name], modes[name] = stack.enter_context(contender(folder, args.synchronous))
            runners[name]([f"warm-up-{name}"])  # schema, caches, thread pools
        order = list(CONTENDERS)
        for turn, start in enumerate(range(0, invocations, args.turn)):
            threads = [f"thread-{i}" for i in range(start, min(start + args.turn, invocations))]
            commits.append(commit_ms(folder, 20))
            for name in order[turn % len(order) :] + order[: turn % len(order)]:
                began = time.perf_counter()
                runners[name](threads)
                spent[name] += time.perf_counter() - began
    rate = {name: invocations * NODES / seconds for name, seconds in spent.items()}
    figures = {
        "invocations": invocations,
        "commit_ms_wal_full": round(statistics.median(commits), 3),
        "synchronous": modes,
        **{f"{name}_steps_per_s": round(r) for name, r in rate.items()},
        "ratio": round(rate["tether"] / rate["sqlite_saver"], 2),
        "ratio_async": round(rate["tether_async"] / rate["sqlite_saver"], 2),
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"{NODES}-node linear graph, {invocations} invocations each (one thread id each), "
          f"durability='sync', turns of {args.turn}")  # fmt: skip
    print(f"disk: one-row commit, WAL + FULL (median)  {figures['commit_ms_wal_full']:7.3f} ms")
    for name, (label, _) in CONTENDERS.items():
        print(f"{label:<22} synchronous={modes[name]:<5} {rate[name]:9,.0f} steps/s")
    print(
        f"ratio TetherSaver / SqliteSaver            {figures['ratio']:7.2f} x   (target >= 1.5 x)"
    )
    print(f"ratio, TetherSaver with ainvoke            {figures['ratio_async']:7.2f} x")


if __name__ == "__main__":
    main()

"""LangGraph's own checkpoint savers in the graph scenario of bench/langgraph.py: a 10-node linear
graph (each node adds 1 to a counter and appends its name to a list), one invocation per thread
id, durability="sync" (the graph waits for each checkpoint before the next node runs). Run by
bench/peers.py under the peers' interpreter; prints JSON lines of figures (peer_protocol.py) and
asserts nothing about times. It imports no tether: bench/peers.py loads `linear_graph` and
`Invocations` from this file to run TetherSaver through the very same code.

    python bench/peers/langgraph_savers.py --saver sqlite --url /path/lg.db --scenario sequential
    python bench/peers/langgraph_savers.py --saver postgres --url postgresql://h/db \\
        --scenario concurrent

sqlite, sequential: SqliteSaver on one sqlite3 connection, graph.invoke one thread after another.
sqlite, concurrent: AsyncSqliteSaver (aiosqlite), the invocations' graph.ainvoke started together.
Both set journal_mode=WAL in setup() and leave synchronous at the library default (read back and
printed: FULL).
postgres, sequential: PostgresSaver.from_conn_string (one autocommit connection), graph.invoke.
postgres, concurrent: AsyncPostgresSaver on an AsyncConnectionPool of at most 10 connections
(TetherSaver's pool size) with the connection settings LangGraph's docs give, ainvoke together.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import time
from collections.abc import Callable
from contextlib import AsyncExitStack, ExitStack
from importlib.metadata import version
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

NODES = 10
SYNC_LEVELS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


class State(TypedDict):
    count: int
    log: list[str]


def linear_graph(saver: Any) -> Any:
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


class Invocations:
    """Invokes a graph once per new thread id: `sequential(n)` one after another (graph.invoke),
    `concurrent(n)` started together (graph.ainvoke); each returns the seconds taken."""

    def __init__(self, graph: Any) -> None:
        self.graph, self.made = graph, 0

    def _threads(self, n: int) -> list[dict[str, Any]]:
        self.made += n
        return [{"configurable": {"thread_id": f"t-{i}"}} for i in range(self.made - n, self.made)]

    def sequential(self, n: int) -> float:
        configs = self._threads(n)
        start = time.perf_counter()
        for config in configs:
            out = self.graph.invoke({"count": 0, "log": []}, config, durability="sync")
            assert out["count"] == NODES
        return time.perf_counter() - start

    async def concurrent(self, n: int) -> float:
        configs = self._threads(n)
        start = time.perf_counter()
        outs = await asyncio.gather(*(
            self.graph.ainvoke({"count": 0, "log": []}, config, durability="sync")
            for config in configs
        ))  # fmt: skip
        elapsed = time.perf_counter() - start
        assert all(out["count"] == NODES for out in outs)
        return elapsed


def sqlite_settings(conn: sqlite3.Connection) -> dict[str, str]:
    (journal,) = conn.execute("PRAGMA journal_mode").fetchone()
    (level,) = conn.execute("PRAGMA synchronous").fetchone()
    return {"journal_mode": journal, "synchronous": SYNC_LEVELS[level]}


def open_sync(saver_kind: str, url: str, stack: ExitStack) -> tuple[str, Any, dict[str, str]]:
    if saver_kind == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(url, check_same_thread=False)
        stack.callback(conn.close)
        saver = SqliteSaver(conn)
        saver.setup()
        return "SqliteSaver, invoke", saver, sqlite_settings(conn)
    from langgraph.checkpoint.postgres import PostgresSaver

    saver = stack.enter_context(PostgresSaver.from_conn_string(url))
    saver.setup()
    return "PostgresSaver, invoke", saver, {}


async def open_async(
    saver_kind: str, url: str, stack: AsyncExitStack
) -> tuple[str, Any, dict[str, str]]:
    if saver_kind == "sqlite":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        saver = await stack.enter_async_context(AsyncSqliteSaver.from_conn_string(url))
        await saver.setup()
        settings = {}
        for pragma in ("journal_mode", "synchronous"):
            async with saver.conn.execute(f"PRAGMA {pragma}") as cur:
                (value,) = await cur.fetchone()  # type: ignore[misc]
            settings[pragma] = SYNC_LEVELS.get(value, value) if pragma == "synchronous" else value
        return "AsyncSqliteSaver, ainvoke", saver, settings
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    pool = AsyncConnectionPool(url, max_size=10, kwargs=kwargs, open=False)
    await stack.enter_async_context(pool)
    saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
    await saver.setup()
    return "AsyncPostgresSaver, ainvoke", saver, {"pool_max_size": 10}


def main() -> None:
    from peer_protocol import Contender, add_arguments, serve

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--saver", choices=("sqlite", "postgres"), required=True)
    parser.add_argument("--url", required=True, help="a SQLite file path, or a PostgreSQL URL")
    add_arguments(parser, runs=100)
    args = parser.parse_args()
    package = f"langgraph-checkpoint-{args.saver}"
    versions = {package: version(package), "langgraph": version("langgraph")}
    if args.scenario == "sequential":
        stack = ExitStack()
        label, saver, settings = open_sync(args.saver, args.url, stack)
        invocations = Invocations(linear_graph(saver))
        run: Callable[[int], float] = invocations.sequential
        close = stack.close
    else:
        loop = asyncio.new_event_loop()
        astack = AsyncExitStack()
        label, saver, settings = loop.run_until_complete(open_async(args.saver, args.url, astack))
        invocations = Invocations(linear_graph(saver))

        def run(n: int) -> float:
            return loop.run_until_complete(invocations.concurrent(n))

        def close() -> None:
            loop.run_until_complete(astack.aclose())
            loop.close()

    run(1)  # warm up
    serve(Contender(label, NODES, run, close, settings, versions), args)


if __name__ == "__main__":
    main()

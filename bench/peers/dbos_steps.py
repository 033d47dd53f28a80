"""DBOS (dbos-transact-py) in Tether's engine scenario: a @DBOS.workflow that calls a trivial
@DBOS.step 10 times, each step's output recorded in DBOS's system database before the next step
starts. Run by bench/peers.py under the peers' interpreter (it imports no tether); prints JSON
lines of figures (peer_protocol.py) and asserts nothing about times.

    python bench/peers/dbos_steps.py --url sqlite:////path/dbos.db --scenario sequential --runs 200
    python bench/peers/dbos_steps.py --url postgresql://user@host:port/db --scenario concurrent

--api async: `async def` workflow and step (Tether's own shape); sequential awaits one workflow
after another, concurrent starts the runs with DBOS.start_workflow_async together and awaits their
handles. --api sync: plain `def`; sequential calls the workflow in a loop, concurrent starts the
runs with DBOS.start_workflow (DBOS's executor threads) and waits on the handles. DBOS's defaults
otherwise (system database pool of 20 connections).

On SQLite, DBOS sets no journal mode, so the file is put in WAL mode before DBOS opens it (WAL is
kept in the file); synchronous is left at the library default, read back and printed (FULL).
On PostgreSQL, DBOS creates the database named in the URL if it is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import time
from importlib.metadata import version
from typing import Any

from dbos import DBOS, DBOSConfig
from peer_protocol import Contender, add_arguments, serve

STEPS = 10
SYNC_LEVELS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def prepare_sqlite(url: str) -> dict[str, str]:
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    (journal,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
    (level,) = conn.execute("PRAGMA synchronous").fetchone()  # what a new connection gets
    conn.close()
    return {"journal_mode": journal, "synchronous": SYNC_LEVELS[level]}


def define(api: str) -> Any:
    if api == "async":

        @DBOS.step()
        async def inc_async(x: int) -> int:
            return x + 1

        @DBOS.workflow()
        async def ten_async(x: int) -> int:
            for _ in range(STEPS):
                x = await inc_async(x)
            return x

        return ten_async

    @DBOS.step()
    def inc(x: int) -> int:
        return x + 1

    @DBOS.workflow()
    def ten(x: int) -> int:
        for _ in range(STEPS):
            x = inc(x)
        return x

    return ten


def open_contender(args: argparse.Namespace) -> Contender:
    settings = prepare_sqlite(args.url) if args.url.startswith("sqlite:") else {}
    config: DBOSConfig = {
        "name": "tether-bench-peer",
        "system_database_url": args.url,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    ten = define(args.api)
    DBOS.launch()
    loop = asyncio.new_event_loop()

    async def run_async(runs: int) -> float:
        start = time.perf_counter()
        if args.scenario == "sequential":
            for _ in range(runs):
                await ten(0)
        else:
            handles = await asyncio.gather(
                *(DBOS.start_workflow_async(ten, i) for i in range(runs))
            )
            results = await asyncio.gather(*(h.get_result() for h in handles))
            assert results == [i + STEPS for i in range(runs)]
        return time.perf_counter() - start

    def run_sync(runs: int) -> float:
        start = time.perf_counter()
        if args.scenario == "sequential":
            for _ in range(runs):
                ten(0)
        else:
            handles = [DBOS.start_workflow(ten, i) for i in range(runs)]
            results = [h.get_result() for h in handles]
            assert results == [i + STEPS for i in range(runs)]
        return time.perf_counter() - start

    def run(runs: int) -> float:
        return loop.run_until_complete(run_async(runs)) if args.api == "async" else run_sync(runs)

    def close() -> None:
        DBOS.destroy()
        loop.close()

    run(1)  # warm up: schema, pools, caches
    shape = "async def" if args.api == "async" else "def"
    return Contender(f"DBOS, {shape}", STEPS, run, close, settings, {"dbos": version("dbos")})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="DBOS system database URL")
    parser.add_argument("--api", choices=("async", "sync"), default="async")
    add_arguments(parser, runs=200)
    args = parser.parse_args()
    serve(open_contender(args), args)


if __name__ == "__main__":
    main()

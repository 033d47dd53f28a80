"""Absurd (earendil-works/absurd, its Python SDK `absurd-sdk`) in Tether's engine scenario on
PostgreSQL: a task of 10 trivial steps (`ctx.step`), each step's result written by
absurd.set_task_checkpoint_state in its own autocommitted transaction before the next step starts.
Run by bench/peers.py under the peers' interpreter (it imports no tether); prints JSON lines of
figures (peer_protocol.py) and asserts nothing about times.

    python bench/peers/absurd_steps.py --url postgresql://user@host:port/db --scenario sequential

The database given must be empty: the script installs Absurd's schema into it (the SQL bundled
with `absurdctl`, of the same release as the SDK) and creates one queue.

sequential: the sync client `Absurd` spawns a task, claims and runs it at once in the same thread
(`work_batch`, so no worker polling delay is counted) and reads its result; one run after another.
concurrent: the runs are spawned together from a client connection (timed), then `--workers`
async workers (`AsyncAbsurd.start_worker`, one connection each, concurrency runs/workers) claim
and run them; the clock stops when a separate connection sees them all completed (polled every
2 ms), and each task's result is checked.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from importlib.metadata import version
from typing import Any

import psycopg
from absurd_sdk import Absurd, AsyncAbsurd
from absurdctl import BUNDLED_SCHEMA_SQL
from peer_protocol import Contender, add_arguments, serve

STEPS = 10
QUEUE = "bench"


def versions() -> dict[str, str]:
    return {"absurd-sdk": version("absurd-sdk"), "absurdctl (schema)": version("absurdctl")}


def install(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(BUNDLED_SCHEMA_SQL)
        conn.execute("SELECT absurd.create_queue(%s)", (QUEUE,))


def sequential(url: str) -> Contender:
    app = Absurd(url, queue_name=QUEUE)

    @app.register_task(name="ten")
    def ten(params: dict[str, Any], ctx: Any) -> int:
        x = params["x"]
        for _ in range(STEPS):
            x = ctx.step("inc", lambda x=x: x + 1)
        return x

    def one(x: int) -> None:
        task = app.spawn("ten", {"x": x})
        app.work_batch(batch_size=1)
        snapshot = app.fetch_task_result(task["task_id"])
        assert snapshot is not None
        assert snapshot.state == "completed", snapshot
        assert snapshot.result == x + STEPS

    def run(runs: int) -> float:
        start = time.perf_counter()
        for _ in range(runs):
            one(0)
        return time.perf_counter() - start

    run(1)  # warm up
    return Contender("Absurd, sync client", STEPS, run, app.close, {}, versions())


def async_app(url: str) -> AsyncAbsurd:
    app = AsyncAbsurd(url, queue_name=QUEUE)

    @app.register_task(name="ten")
    async def ten(params: dict[str, Any], ctx: Any) -> int:
        x = params["x"]
        for _ in range(STEPS):

            async def inc(x: int = x) -> int:
                return x + 1

            x = await ctx.step("inc", inc)
        return x

    return app


def concurrent(url: str, workers: int) -> Contender:
    loop = asyncio.new_event_loop()
    client, apps = async_app(url), [async_app(url) for _ in range(workers)]
    watch = loop.run_until_complete(psycopg.AsyncConnection.connect(url, autocommit=True))

    async def count(where: str) -> int:
        cur = await watch.execute(f"SELECT count(*) FROM absurd.t_{QUEUE} WHERE {where}")
        (n,) = await cur.fetchone()  # type: ignore[misc]
        return int(n)

    async def burst(runs: int) -> float:
        before = await count("state = 'completed'")
        start = time.perf_counter()
        await asyncio.gather(*(client.spawn("ten", {"x": i}) for i in range(runs)))
        share = -(-runs // workers)
        loops = [
            asyncio.create_task(app.start_worker(concurrency=share, poll_interval=0.01))
            for app in apps
        ]
        while await count("state = 'completed'") < before + runs:
            await asyncio.sleep(0.002)
        elapsed = time.perf_counter() - start
        for app in apps:
            app.stop_worker()
        await asyncio.gather(*loops)
        right = await count(f"completed_payload = to_jsonb((params->>'x')::int + {STEPS})")
        assert right == before + runs, (right, before + runs)  # each returned its x + 10
        return elapsed

    async def warm_up() -> None:  # every connection opened, one task run by each worker
        for app in apps:
            await client.spawn("ten", {"x": 0})
            await app.work_batch(batch_size=1)
        assert await count("state = 'completed'") == workers

    async def aclose() -> None:
        for app in [client, *apps]:
            await app.close()
        await watch.close()

    def close() -> None:
        loop.run_until_complete(aclose())
        loop.close()

    loop.run_until_complete(warm_up())
    label = f"Absurd, {workers} async worker{'s' * (workers > 1)}"
    return Contender(
        label, STEPS, lambda runs: loop.run_until_complete(burst(runs)), close,
        {"workers": workers, "connections": workers}, versions(),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="an empty PostgreSQL database")
    parser.add_argument("--workers", type=int, default=1, help="concurrent: worker connections")
    add_arguments(parser, runs=100)
    args = parser.parse_args()
    install(args.url)
    if args.scenario == "sequential":
        contender = sequential(args.url)
    else:
        contender = concurrent(args.url, args.workers)
    serve(contender, args)


if __name__ == "__main__":
    main()

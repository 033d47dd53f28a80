"""Engine benchmarks on PostgreSQL (fsync on, synchronous_commit=on): figures and ratios against
the raw commit rate of the same server measured in the same run. Prints only; asserts nothing.

    python -m bench.postgres [--quick] [--json] [--url postgresql://...]

Without --url a throwaway cluster is made from this machine's server binaries (initdb, pg_ctl),
durable like a deployment's. The raw rates: one-row INSERT + COMMIT per transaction on one
connection (the latency bound of a lone writer), and many one-row transactions committed by 8
connections at once (what the server's own group commit gets from this disk).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg

from tether.store.drivers.postgres.direct import Direct
from tether.store.postgres import parse_postgres_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.postgres_server import LocalPostgres, with_schema  # noqa: E402

from bench.engine import (  # noqa: E402
    MB,
    RECOVERIES,
    concurrent,
    large_results,
    make_app,
    paired,
    recoveries,
    recovery,
    sequential,
)


@contextmanager
def server(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    local = LocalPostgres(durable=True)
    try:
        local.start()
        yield local.url
    finally:
        local.remove()


def raw_commit_rate(url: str, n: int, size: int = 0) -> float:
    """One-row INSERT per transaction (with `size`, each row's text is that many characters,
    compressed with lz4 where the server has it, as Tether's large columns are)."""
    conninfo, _ = parse_postgres_url(url)
    table = f"raw_{uuid.uuid4().hex[:8]}"
    big = "7" * size
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, v TEXT)")
        with suppress(psycopg.Error):  # no lz4 here: pglz, as for Tether's
            conn.execute(f"ALTER TABLE {table} ALTER COLUMN v SET COMPRESSION lz4")
        start = time.perf_counter()
        for i in range(n):
            conn.execute(f"INSERT INTO {table} (v) VALUES (%s)", (big or str(i),))
        elapsed = time.perf_counter() - start
        conn.execute(f"DROP TABLE {table}")
    return n / elapsed


async def raw_parallel_rate(url: str, n: int, connections: int = 8) -> float:
    conninfo, _ = parse_postgres_url(url)
    table = f"rawp_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as setup:
        await setup.execute(f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, v TEXT)")

    async def writer(k: int) -> None:
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            for i in range(n // connections):
                await conn.execute(f"INSERT INTO {table} (v) VALUES (%s)", (f"{k}-{i}",))

    start = time.perf_counter()
    await asyncio.gather(*(writer(k) for k in range(connections)))
    elapsed = time.perf_counter() - start
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as setup:
        await setup.execute(f"DROP TABLE {table}")
    return (n // connections) * connections / elapsed


def postgres_recovery(url: str) -> float:
    conninfo, schema = parse_postgres_url(url)

    def finished_at() -> float:
        with psycopg.connect(conninfo) as conn:
            row = conn.execute(
                f'SELECT finished_at FROM "{schema}".tether_runs WHERE id = %s', ("recover-me",)
            ).fetchone()
        assert row is not None
        return float(row[0])

    return recovery(url, finished_at)


WORKER = """
import asyncio, os, sys
sys.path.insert(0, {root!r})
from bench.engine import make_app
app, ten = make_app({url!r})
async def main():
    await app.open()  # connected, migrated: only the claims are left to time
    open({ready!r} + str(os.getpid()), "w").close()
    while not os.path.exists({go!r}):
        await asyncio.sleep(0.002)
    async with app:
        while True:
            await asyncio.sleep(0.2)
            if await app.engine.store.list_runs(statuses=[
                    'pending', 'running', 'waiting'], limit=1) == []:
                return
asyncio.run(main())
"""


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


async def statements_alone(url: str, runs: int) -> float:
    """Steps per second of the statements alone: those one sequential run sent (its start, its
    10 checkpoints, its end), recorded from the engine, then sent again for `runs` new run ids,
    one after another, through the engine's own driver path and nothing else. The floor the
    sequential figure is read against: what separates the two is the engine's own work
    between statements, not the database's."""
    sent: list[tuple[str, Any]] = []
    original = Direct.execute

    async def recording(self: Direct, conn: Any, sql: str, params: Any) -> Any:
        sent.append((sql, params))
        return await original(self, conn, sql, params)

    app, ten = make_app(url)
    async with app:
        await (await app.start(ten, 0)).result()  # warm up: schema, prepared statements
        Direct.execute = recording  # type: ignore[method-assign]
        try:
            handle = await app.start(ten, 0)
            await handle.result()
        finally:
            Direct.execute = original  # type: ignore[method-assign]
    recorded = [(sql, params) for sql, params in sent if handle.id in _values(params)]
    if len(recorded) != 12:
        raise RuntimeError(f"a run sent {len(recorded)} statements alone, not its 12: "
                           "the figure would not be the floor of the sequential one")  # fmt: skip
    conninfo, schema = parse_postgres_url(url)
    direct = Direct(prepare=True)
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(f'SET search_path TO "{schema}"')

        async def one() -> None:
            run_id = uuid.uuid4().hex
            for sql, params in recorded:
                await direct.execute(conn, sql, _replaced(params, handle.id, run_id))

        await one()  # prepared, as the engine's were
        start = time.perf_counter()
        for _ in range(runs):
            await one()
        elapsed = time.perf_counter() - start
    return runs * 10 / elapsed


def _values(params: Any) -> list[Any]:
    return list(params.values()) if isinstance(params, dict) else list(params)


def _replaced(params: Any, old: str, new: str) -> Any:
    if isinstance(params, dict):
        return {k: new if v == old else v for k, v in params.items()}
    return [new if v == old else v for v in params]


BUSY: dict[int, float] = {}  # workers -> the machine's CPU busy share while they ran


async def processes(url: str, runs: int, workers: int) -> float:
    """Steps per second of `workers` worker processes on runs created beforehand, started and
    connected first, then let go together: from the first claim to the last finish, as the
    database recorded them. The share of the machine's CPU
    that was busy meanwhile goes to BUSY: near 1.0, more processes cannot go faster here."""
    app, ten = make_app(url)
    await app.open()
    try:
        for i in range(0, runs, 100):
            await asyncio.gather(*(app.start(ten, j) for j in range(i, min(runs, i + 100))))
    finally:
        await app.close()
    signals = Path(tempfile.mkdtemp(prefix="tether-bench-"))
    ready, go = str(signals / "ready-"), str(signals / "go")
    script = WORKER.format(root=str(ROOT), url=url, ready=ready, go=go)
    procs = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(workers)]
    while len(list(signals.glob("ready-*"))) < workers:  # every process started and connected
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a worker process ended before it was ready")
        time.sleep(0.01)
    before = cpu_times()
    Path(go).touch()  # all of them claim from now on
    for proc in procs:
        if proc.wait(timeout=600) != 0:
            raise RuntimeError(f"a worker process failed (exit {proc.returncode})")
    after = cpu_times()
    BUSY[workers] = (after[0] - before[0]) / max(1, after[1] - before[1])
    conninfo, schema = parse_postgres_url(url)
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        cur = await conn.execute(
            f'SELECT min(started_at), max(finished_at), count(*) FROM "{schema}".tether_runs '
            "WHERE status = 'succeeded'"
        )
        first, last, done = await cur.fetchone()  # type: ignore[misc]
    if done != runs:
        raise RuntimeError(f"{done} of {runs} runs succeeded")
    return runs * 10 / (last - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--url", help="a PostgreSQL database to use instead of a new cluster")
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0
    with server(args.url) as base:

        def fresh() -> str:
            return with_schema(base, f"bench_{uuid.uuid4().hex[:8]}")

        seq, raw, ratios = paired(
            lambda: raw_commit_rate(base, int(1000 * scale)),
            lambda: asyncio.run(sequential(fresh(), int(100 * scale))),
            5,
        )
        floor, _, floor_ratios = paired(
            lambda: raw_commit_rate(base, int(1000 * scale)),
            lambda: asyncio.run(statements_alone(fresh(), int(100 * scale))),
            3,
        )
        raw_parallel = asyncio.run(raw_parallel_rate(base, int(8000 * scale)))
        conc = asyncio.run(concurrent(fresh(), 200))
        big, raw_big, big_ratios = paired(
            lambda: raw_commit_rate(base, max(10, int(50 * scale)), size=MB),
            lambda: asyncio.run(large_results(fresh(), max(2, int(20 * scale)))),
            3,
        )
        rec, recs = recoveries(lambda _: postgres_recovery(fresh()))
        # Twice a worker's concurrency (1000), so that two workers both get runs to claim.
        one = asyncio.run(processes(fresh(), 2000, 1))
        two = asyncio.run(processes(fresh(), 2000, 2))
    figures = {
        "raw_commits_per_s": round(raw),
        "raw_parallel_commits_per_s": round(raw_parallel),
        "sequential_steps_per_s": round(seq),
        "sequential_ratio_to_raw": round(statistics.median(ratios), 2),
        "sequential_ratio_rounds": [round(r, 2) for r in ratios],
        "statements_alone_steps_per_s": round(floor),
        "statements_alone_ratio_to_raw": round(statistics.median(floor_ratios), 2),
        "engine_own_us_per_step": round(1e6 / seq - 1e6 / floor, 1),
        "concurrent_steps_per_s": round(conc),
        "concurrent_ratio_to_raw_parallel": round(conc / raw_parallel, 2),
        "large_result_steps_per_s": round(big, 1),
        "raw_large_commits_per_s": round(raw_big, 1),
        "large_result_ratio_to_raw": round(statistics.median(big_ratios), 2),
        "recovery_s": round(rec, 3),
        "recovery_samples_s": [round(r, 3) for r in recs],
        "one_process_steps_per_s": round(one),
        "two_processes_steps_per_s": round(two),
        "two_processes_ratio": round(two / one, 2),
        "cpu_busy_one_process": round(BUSY[1], 2),
        "cpu_busy_two_processes": round(BUSY[2], 2),
        "cores": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"raw PostgreSQL commit, 1 conn   {raw:10,.0f} commits/s   (median around the rounds)")
    print(f"raw PostgreSQL commit, 8 conns  {raw_parallel:10,.0f} commits/s")
    print(
        f"sequential, 10 steps per run    {seq:10,.0f} steps/s   "
        f"{statistics.median(ratios):5.2f} x raw   (target >= 0.5 x raw)"
    )
    print(f"  5 rounds, each to the raw rate around it: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(
        f"  its 12 statements alone       {floor:10,.0f} steps/s   "
        f"{statistics.median(floor_ratios):5.2f} x raw   (the floor: the engine's own work "
        f"{1e6 / seq - 1e6 / floor:.0f} us/step)"
    )
    print(
        f"concurrent, 200 runs x 10 steps {conc:10,.0f} steps/s   "
        f"{conc / raw_parallel:5.2f} x raw, 8 conns   (target >= 5,000 steps/s)"
    )
    print(f"raw commit of a 1 MB row        {raw_big:10,.1f} commits/s   (median around them)")
    print(
        f"1 MB results                    {big:10,.1f} steps/s   "
        f"{statistics.median(big_ratios):5.2f} x raw 1 MB   (target >= 150 steps/s)"
    )
    print(f"recovery, 0.5 s of work left    {rec:10.3f} s                     (target <= 0.9 s)")
    print(f"  median of {RECOVERIES} processes: {', '.join(f'{r:.3f}' for r in recs)} s")
    print(f"1 worker process                {one:10,.0f} steps/s")
    print(
        f"2 worker processes              {two:10,.0f} steps/s   {two / one:5.2f} x one"
        "   (target >= 1.6 x one)"
    )
    print(
        f"machine CPU busy meanwhile      {BUSY[1]:10.0%} with 1, {BUSY[2]:.0%} with 2 "
        f"({os.cpu_count()} cores, the database's included)"
    )


if __name__ == "__main__":
    main()

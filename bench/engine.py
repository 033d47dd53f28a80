"""Engine benchmarks on SQLite: figures and ratios against the disk's raw commit rate, measured
in the same run. Prints only; nothing here asserts a time.

    python bench/engine.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import tether

ROOT = Path(__file__).resolve().parent.parent


def paired(
    raw: Callable[[], float], figure: Callable[[], float], rounds: int
) -> tuple[float, float, list[float]]:
    """`figure` measured `rounds` times, each between two measurements of `raw` (the disk's
    commit rate moves from one second to the next here): the median figure, the median raw
    rate around the rounds, and each round's ratio to the mean of the two raws around it."""
    figures, raws, ratios = [], [], []
    before = raw()
    for _ in range(rounds):
        value = figure()
        after = raw()
        around = (before + after) / 2
        figures.append(value)
        raws.append(around)
        ratios.append(value / around)
        before = after
    return statistics.median(figures), statistics.median(raws), ratios


MB = 1024 * 1024


def raw_commit_rate(folder: Path, n: int, synchronous: str = "FULL", size: int = 0) -> float:
    """One-row INSERT + COMMIT per transaction, WAL and synchronous=FULL: the disk's bound
    (with `size`, each row's text is that many characters)."""
    conn = sqlite3.connect(folder / f"raw-{synchronous}-{size}.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    big = "7" * size
    start = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (?)", (big or str(i),))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return n / elapsed


def make_app(url: str) -> tuple[tether.App, tether.Workflow[[int], int]]:
    app = tether.App(url)

    @app.step()
    async def inc(x: int) -> int:
        return x + 1

    @app.workflow()
    async def ten(x: int) -> int:
        for _ in range(10):
            x = await inc(x)
        return x

    return app, ten


async def sequential(url: str, runs: int) -> float:
    """Steps per second, one run after another, 10 trivial steps each."""
    app, ten = make_app(url)
    async with app:
        await (await app.start(ten, 0)).result()  # warm up: schema, caches
        start = time.perf_counter()
        for _ in range(runs):
            await (await app.start(ten, 0)).result()
        elapsed = time.perf_counter() - start
    return runs * 10 / elapsed


async def concurrent(url: str, runs: int) -> float:
    """Steps per second, `runs` runs of 10 steps started together."""
    app, ten = make_app(url)
    async with app:
        await (await app.start(ten, 0)).result()
        start = time.perf_counter()
        handles = await asyncio.gather(*(app.start(ten, i) for i in range(runs)))
        results = await asyncio.gather(*(h.result() for h in handles))
        elapsed = time.perf_counter() - start
    assert results == [i + 10 for i in range(runs)]
    return runs * 10 / elapsed


RECOVERY_SCRIPT = """
import asyncio, sys, time
sys.path.insert(0, {root!r})
from bench.recovery_flow import make_app
app, flow = make_app({url!r})
async def main():
    async with app:
        handle = await app.start(flow, id="recover-me")
        await handle.result()
asyncio.run(main())
"""


def recovery(url: str, finished_at: Callable[[], float]) -> float:
    """Seconds from a new process's start to the end of a run that a SIGKILL interrupted with
    0.5 s of work left (5 steps of 0.1 s); `finished_at` reads the run's end from the database."""
    script = RECOVERY_SCRIPT.format(root=str(ROOT), url=url)
    env = dict(
        os.environ, TETHER_FAULTS="store.after_commit@write_checkpoint:work#5:completed=kill"
    )
    first = subprocess.run([sys.executable, "-c", script], env=env, check=False)
    if first.returncode != -9:
        raise RuntimeError(f"the first process was not killed (exit {first.returncode})")
    env.pop("TETHER_FAULTS")
    started = time.time()
    subprocess.run([sys.executable, "-c", script], env=env, check=True)
    return finished_at() - started


RECOVERIES = 3  # a figure of one process start moves by tens of ms here: the median of these


def recoveries(measure: Callable[[int], float]) -> tuple[float, list[float]]:
    """`measure(i)` RECOVERIES times, each on a database of its own: the median and each."""
    samples = [measure(i) for i in range(RECOVERIES)]
    return statistics.median(samples), samples


def sqlite_recovery(folder: Path, i: int = 0) -> float:
    path = folder / f"recovery{i}.db"

    def finished_at() -> float:
        with contextlib.closing(sqlite3.connect(path)) as conn:
            (at,) = conn.execute(
                "SELECT finished_at FROM tether_runs WHERE id = 'recover-me'"
            ).fetchone()
        return float(at)

    return recovery(f"sqlite:///{path}", finished_at)


async def large_results(url: str, runs: int) -> float:
    """Steps per second whose result is 1 MB of text, one run of 5 such steps after another."""
    app = tether.App(url, max_payload=4 * 1024 * 1024)

    @app.step()
    async def big(i: int) -> str:
        return str(i % 10) * (1024 * 1024)

    @app.workflow()
    async def five() -> int:
        return sum([len(await big(i)) for i in range(5)])

    async with app:
        await (await app.start(five)).result()
        start = time.perf_counter()
        for _ in range(runs):
            await (await app.start(five)).result()
        elapsed = time.perf_counter() - start
    return runs * 5 / elapsed


def import_time() -> float:
    code = "import time; t = time.perf_counter(); import tether; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0
    with tempfile.TemporaryDirectory(prefix="tether-bench-", dir=ROOT / "bench") as tmp:
        folder = Path(tmp)
        rounds = itertools.count()

        def one_raw() -> float:
            sub = folder / f"raw{next(rounds)}"
            sub.mkdir()
            return raw_commit_rate(sub, int(1000 * scale))

        def one_sequential() -> float:
            url = f"sqlite:///{folder}/seq{next(rounds)}.db"
            return asyncio.run(sequential(url, int(100 * scale)))

        seq, raw, ratios = paired(one_raw, one_sequential, 5)
        raw_off = raw_commit_rate(folder, int(5000 * scale), "OFF")
        off = asyncio.run(
            sequential(f"sqlite:///{folder}/off.db?synchronous=OFF", int(300 * scale))
        )
        conc = asyncio.run(concurrent(f"sqlite:///{folder}/conc.db", 200))

        def one_raw_big() -> float:
            sub = folder / f"raw{next(rounds)}"
            sub.mkdir()
            return raw_commit_rate(sub, max(10, int(50 * scale)), size=MB)

        def one_big() -> float:
            url = f"sqlite:///{folder}/big{next(rounds)}.db"
            return asyncio.run(large_results(url, max(2, int(20 * scale))))

        big, raw_big, big_ratios = paired(one_raw_big, one_big, 3)
        rec, recs = recoveries(lambda i: sqlite_recovery(folder, i))
        imp = import_time()
    figures = {
        "raw_commits_per_s": round(raw),
        "sequential_steps_per_s": round(seq),
        "sequential_ratio_to_raw": round(statistics.median(ratios), 2),
        "sequential_ratio_rounds": [round(r, 2) for r in ratios],
        "concurrent_steps_per_s": round(conc),
        "concurrent_ratio_to_raw": round(conc / raw, 2),
        "overhead_us_per_step_sync_off": round(1e6 / off, 1),
        "raw_commit_us_sync_off": round(1e6 / raw_off, 1),
        "large_result_steps_per_s": round(big, 1),
        "raw_large_commits_per_s": round(raw_big, 1),
        "large_result_ratio_to_raw": round(statistics.median(big_ratios), 2),
        "recovery_s": round(rec, 3),
        "recovery_samples_s": [round(r, 3) for r in recs],
        "import_tether_s": round(imp, 3),
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"raw SQLite commit (WAL, FULL)   {raw:10,.0f} commits/s   (median around the rounds)")
    print(
        f"sequential, 10 steps per run    {seq:10,.0f} steps/s   "
        f"{statistics.median(ratios):5.2f} x raw   (target >= 0.6 x raw)"
    )
    print(f"  5 rounds, each to the raw rate around it: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(
        f"concurrent, 200 runs x 10 steps {conc:10,.0f} steps/s   {conc / raw:5.2f} x raw"
        "   (target >= 10,000 steps/s)"
    )
    print(
        f"overhead, synchronous=OFF       {1e6 / off:10.1f} us/step               (target <= 60 us)"
    )
    print(f"raw one-row commit, OFF         {1e6 / raw_off:10.1f} us       (the floor under it)")
    print(f"raw commit of a 1 MB row        {raw_big:10,.1f} commits/s   (median around them)")
    print(
        f"1 MB results                    {big:10,.1f} steps/s   "
        f"{statistics.median(big_ratios):5.2f} x raw 1 MB   (target >= 150 steps/s)"
    )
    print(f"recovery, 0.5 s of work left    {rec:10.3f} s                     (target <= 0.9 s)")
    print(f"  median of {RECOVERIES} processes: {', '.join(f'{r:.3f}' for r in recs)} s")
    print(f"import tether                   {imp:10.3f} s")


if __name__ == "__main__":
    main()

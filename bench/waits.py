"""Wait benchmarks on SQLite (WAL, synchronous=FULL): the event round trip (send -> the waiting
run resumes -> its next step starts), in-process and across processes, and the memory that
10,000 waiting runs add to a worker. Prints only; nothing here asserts a time.

    python bench/waits.py [--quick]
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
from pathlib import Path

import tether

ROOT = Path(__file__).resolve().parent.parent


def make_app(url: str) -> tether.App:
    app = tether.App(url)

    @app.step()
    async def resumed() -> float:
        return time.time()  # when the step after the wait starts

    @app.workflow()
    async def ping(rounds: int) -> list[float]:
        stamps = []
        for _ in range(rounds):
            await tether.wait_for_event("ping")
            stamps.append(await resumed())
        return stamps

    return app


async def in_process(url: str, rounds: int) -> list[float]:
    """Milliseconds from `app.send` to the next step starting, in the sender's process."""
    app = make_app(url)
    async with app:
        handle = await app.start("ping", rounds, id="in-process")
        await asyncio.sleep(0.05)
        sent = []
        for _ in range(rounds):
            sent.append(time.time())
            await app.send("in-process", "ping")
            await asyncio.sleep(0.01)  # the run resumes, records its step and waits again
        stamps = await handle.result(timeout=60)
    return [(b - a) * 1000 for a, b in zip(sent, stamps, strict=True)]


WORKER = """
import asyncio, sys
sys.path.insert(0, {root!r})
from bench.waits import make_app
app = make_app({url!r})
async def main():
    async with app:
        handle = await app.start("ping", {rounds}, id="cross")
        await handle.result(timeout=120)
asyncio.run(main())
"""


async def cross_process(folder: Path, rounds: int) -> list[float]:
    """The same, with the waiting run in another worker process on the same SQLite file."""
    url = f"sqlite:///{folder}/cross.db"
    script = WORKER.format(root=str(ROOT), url=url, rounds=rounds)
    proc = subprocess.Popen([sys.executable, "-c", script])
    sender = tether.App(url)
    try:
        while True:
            try:
                await sender.get("cross")
                break
            except tether.RunNotFound:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        sent = []
        for _ in range(rounds):
            await asyncio.sleep(0.05)  # the other process is back in its wait
            sent.append(time.time())
            await sender.send("cross", "ping")
        stamps = await (await sender.get("cross")).result(timeout=60)
    finally:
        await sender.close()
        proc.wait(timeout=60)
    return [(b - a) * 1000 for a, b in zip(sent, stamps, strict=True)]


def rss_of_waiting_runs(folder: Path, runs: int) -> float:
    """MiB that `runs` suspended waiting runs add to a worker process's resident memory."""
    code = f"""
import asyncio, json, sys
sys.path.insert(0, {str(ROOT)!r})
import tether
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
app = tether.App("sqlite:///{folder}/many.db?synchronous=OFF")
@app.workflow()
async def waiter(n: int) -> object:
    return await tether.wait_for_event("go")
async def main():
    async with app:
        before = rss()
        for chunk in range(0, {runs}, 500):
            await asyncio.gather(*(app.start(waiter, i) for i in range(chunk, chunk + 500)))
        while app.engine.worker.runners:
            await asyncio.sleep(0.1)
        print(json.dumps((rss() - before) / 2**20))
asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer round trips")
    args = parser.parse_args()
    rounds = 50 if args.quick else 200
    with tempfile.TemporaryDirectory(prefix="tether-bench-", dir=ROOT / "bench") as tmp:
        folder = Path(tmp)
        local = asyncio.run(in_process(f"sqlite:///{folder}/local.db", rounds))
        remote = asyncio.run(cross_process(folder, rounds // 2))
        grown = rss_of_waiting_runs(folder, 10_000)
    print(
        f"event round trip, in-process    p50 {statistics.median(local):6.2f} ms   "
        f"p90 {sorted(local)[int(len(local) * 0.9)]:6.2f} ms   (target p50 <= 2 ms)"
    )
    print(
        f"event round trip, cross-process p50 {statistics.median(remote):6.2f} ms   "
        f"p90 {sorted(remote)[int(len(remote) * 0.9)]:6.2f} ms   (target p50 <= 20 ms)"
    )
    print(f"10,000 waiting runs             +{grown:6.1f} MiB RSS               (target <= 100 MB)")


if __name__ == "__main__":
    os.environ.pop("TETHER_FAULTS", None)
    main()

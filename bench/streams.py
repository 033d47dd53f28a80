"""Stream benchmarks on SQLite (WAL, synchronous=FULL): a step writing chunks (batched, one
transaction per batch), a reader resuming at offset N (time to its first chunk), and a live
reader following a running step (write -> read). Prints only; nothing here asserts a time.

    python bench/streams.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import tether

ROOT = Path(__file__).resolve().parent.parent


def make_app(url: str) -> tether.App:
    app = tether.App(url)

    @app.step()
    async def produce(count: int) -> float:
        out = tether.stream("tokens")
        started = time.perf_counter()
        for i in range(count):
            await out.write({"t": "token", "i": i})
        return started

    @app.step()
    async def stamped(count: int) -> None:
        out = tether.stream("live")
        for _ in range(count):
            await out.write(time.perf_counter())
            await asyncio.sleep(0.02)

    @app.workflow()
    async def write(count: int) -> float:
        return await produce(count)

    @app.workflow()
    async def live(count: int) -> None:
        await stamped(count)

    return app


async def step_writes(url: str, count: int, rounds: int) -> list[float]:
    """Chunks per second that one step writes, from its first write to its checkpoint."""
    app = make_app(url)
    rates = []
    async with app:
        for r in range(rounds):
            handle = await app.start("write", count, id=f"write-{r}")
            started = await handle.result(timeout=300)
            ended = time.perf_counter()  # the step's chunks were durable before its outcome
            rates.append(count / (ended - started))
    return rates


async def resume(url: str, trials: int) -> list[float]:
    """Milliseconds from `app.read_stream(run, key, offset=N)` to its first chunk, for
    random N in the stream that write-0 left (the run has ended)."""
    app = make_app(url)
    await app.open()
    end = len(await app.engine.store.read_stream("write-0", "tokens", 0, 10**9))
    times = []
    try:
        for _ in range(trials):
            offset = random.randrange(end)
            began = time.perf_counter()
            reader = app.read_stream("write-0", "tokens", offset)
            first = await anext(reader)
            times.append((time.perf_counter() - began) * 1000)
            await reader.aclose()
            assert first[0] == offset
    finally:
        await app.close()
    return times


async def follow(url: str, count: int) -> list[float]:
    """Milliseconds from a step's write to a live reader in the same process receiving it
    (the write waits in the step's buffer for up to LINGER before its batch commits)."""
    app = make_app(url)
    latencies = []
    async with app:
        await app.start("live", count, id="live")
        async for _, stamp in app.read_stream("live", "live"):
            latencies.append((time.perf_counter() - float(stamp)) * 1000)  # type: ignore[arg-type]
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer chunks and trials")
    args = parser.parse_args()
    count, rounds, trials = (20_000, 2, 100) if args.quick else (100_000, 3, 500)
    with tempfile.TemporaryDirectory(prefix="tether-bench-", dir=ROOT / "bench") as tmp:
        url = f"sqlite:///{Path(tmp)}/streams.db"
        rates = asyncio.run(step_writes(url, count, rounds))
        resumed = asyncio.run(resume(url, trials))
        live = asyncio.run(follow(url, 50 if args.quick else 200))
    print(
        f"step writes, batched          {statistics.median(rates):9,.0f} chunks/s "
        f"(best {max(rates):,.0f}; {count:,} chunks per run)   (target >= 20,000)"
    )
    print(
        f"resume at offset N            p50 {statistics.median(resumed):6.2f} ms   "
        f"p90 {sorted(resumed)[int(len(resumed) * 0.9)]:6.2f} ms to the first chunk"
        f"   (target p50 <= 10 ms)"
    )
    print(
        f"live reader, write -> read    p50 {statistics.median(live):6.2f} ms   "
        f"p90 {sorted(live)[int(len(live) * 0.9)]:6.2f} ms in-process"
    )


if __name__ == "__main__":
    os.environ.pop("TETHER_FAULTS", None)
    main()

"""Transaction-step benchmarks on SQLite (WAL, synchronous=FULL): a transaction step (a business
INSERT committed with its checkpoint; and one with an empty body) against a plain step, one run
after another and many runs at once (group commit), and the outbox's delivery rate; figures
against the disk's raw commit rate measured in the same run. The modes are measured in turns,
several rounds, best round kept (a shared machine is noisy). Prints only; asserts no time.

    python -m bench.transactions [--quick] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import tether
from bench.engine import raw_commit_rate

ROOT = Path(__file__).resolve().parent.parent
STEPS = 10  # steps per run


Made = tuple[tether.App, tether.Workflow[[int], int], tether.Workflow[[], None]]


MODES = ("plain", "transaction", "empty transaction")


def make_app(url: str, mode: str) -> Made:
    """An App whose `ten` runs 10 steps of the mode: plain steps, transaction steps each
    inserting a business row, or transaction steps with an empty body; `prepare` creates the
    business table."""
    app = tether.App(url)
    insert = (
        "INSERT INTO bookings (x) VALUES (%s)"
        if url.startswith("postgres")
        else ("INSERT INTO bookings (x) VALUES (?)")
    )

    @app.step()
    async def plain(x: int) -> int:
        return x + 1

    @app.transaction()
    def booked(conn: Any, x: int) -> int:
        conn.execute(insert, (x,))
        return x + 1

    @app.transaction()
    def empty(conn: Any, x: int) -> int:
        return x + 1

    @app.transaction()
    def setup(conn: Any) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS bookings (x INTEGER)")

    step = {"plain": plain, "transaction": booked, "empty transaction": empty}[mode]

    @app.workflow()
    async def ten(x: int) -> int:
        for _ in range(STEPS):
            x = await step(x)
        return x

    @app.workflow()
    async def prepare() -> None:
        await setup()

    return app, ten, prepare


async def sequential(url: str, runs: int, mode: str) -> float:
    """Steps per second, one run after another."""
    app, ten, prepare = make_app(url, mode)
    async with app:
        await (await app.start(prepare)).result()
        await (await app.start(ten, 0)).result()  # warm up: schema, caches
        start = time.perf_counter()
        for _ in range(runs):
            await (await app.start(ten, 0)).result()
        elapsed = time.perf_counter() - start
    return runs * STEPS / elapsed


async def concurrent(url: str, runs: int, mode: str) -> float:
    """Steps per second, `runs` runs started together."""
    app, ten, prepare = make_app(url, mode)
    async with app:
        await (await app.start(prepare)).result()
        await (await app.start(ten, 0)).result()  # warm up: schema, caches
        start = time.perf_counter()
        handles = await asyncio.gather(*(app.start(ten, i) for i in range(runs)))
        results = await asyncio.gather(*(h.result() for h in handles))
        elapsed = time.perf_counter() - start
    assert results == [i + STEPS for i in range(runs)]
    return runs * STEPS / elapsed


async def delivery(url: str, messages: int) -> float:
    """Messages delivered per second by one worker, to a sender that accepts at once: from the
    commit of a transaction step recording them all to the last delivery."""
    delivered = asyncio.Event()
    count = 0

    class Sink(tether.Sender):
        async def send(self, message: tether.OutboxMessage) -> None:
            nonlocal count
            count += 1
            if count == messages:
                delivered.set()

    app = tether.App(url, senders={"sink": Sink()})
    committed: list[float] = []

    @app.transaction()
    def burst(conn: Any, n: int) -> None:
        for i in range(n):
            tether.outbox("sink", {"i": i})

    @app.workflow()
    async def flow(n: int) -> None:
        await burst(n)
        committed.append(time.perf_counter())

    async with app:
        await (await app.start(flow, messages)).result()
        await asyncio.wait_for(delivered.wait(), 300)
        elapsed = time.perf_counter() - committed[0]
    return messages / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0
    rounds = 2 if args.quick else 4
    seq: dict[str, float] = dict.fromkeys(MODES, 0.0)
    conc: dict[str, float] = dict.fromkeys(MODES, 0.0)
    with tempfile.TemporaryDirectory(prefix="tether-bench-", dir=ROOT / "bench") as tmp:
        folder = Path(tmp)
        raw = raw_commit_rate(folder, int(2000 * scale))
        for r in range(rounds):
            for i, mode in enumerate(MODES):
                name = f"{r}-{i}"
                rate = asyncio.run(sequential(f"sqlite:///{folder}/seq-{name}.db",
                                              int(100 * scale), mode))  # fmt: skip
                seq[mode] = max(seq[mode], rate)
                rate = asyncio.run(concurrent(f"sqlite:///{folder}/conc-{name}.db", 200, mode))
                conc[mode] = max(conc[mode], rate)
        sent = asyncio.run(delivery(f"sqlite:///{folder}/outbox.db", int(4000 * scale)))
    figures: dict[str, float] = {"raw_commits_per_s": round(raw)}
    for mode in MODES:
        key = mode.replace(" ", "_")
        figures[f"sequential_{key}_steps_per_s"] = round(seq[mode])
        figures[f"concurrent_{key}_steps_per_s"] = round(conc[mode])
    for mode in MODES[1:]:
        key = mode.replace(" ", "_")
        figures[f"sequential_{key}_cost"] = round(seq["plain"] / seq[mode], 2)
        figures[f"concurrent_{key}_cost"] = round(conc["plain"] / conc[mode], 2)
    figures["outbox_delivered_per_s"] = round(sent)
    if args.json:
        print(json.dumps(figures))
        return
    print(f"raw SQLite commit (WAL, FULL)            {raw:10,.0f} commits/s")
    for mode in MODES:
        print(f"sequential, {mode:<18} step {seq[mode]:10,.0f} steps/s   "
              f"{seq[mode] / raw:5.2f} x raw")  # fmt: skip
    for mode in MODES:
        print(f"concurrent, {mode:<18} step {conc[mode]:10,.0f} steps/s   "
              f"{conc[mode] / raw:5.2f} x raw")  # fmt: skip
    for mode in MODES[1:]:
        label = f"cost, {mode} step"
        print(f"{label:<32} sequential {seq['plain'] / seq[mode]:5.2f} x a plain step "
              f"(target <= 1.2), concurrent {conc['plain'] / conc[mode]:5.2f} x")  # fmt: skip
    print(f"outbox delivery, one worker              {sent:10,.0f} messages/s "
          f"{sent / raw:6.2f} x raw")  # fmt: skip


if __name__ == "__main__":
    main()

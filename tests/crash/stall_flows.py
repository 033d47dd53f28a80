"""Workers that are alive but stalled, for tests/crash/test_stalls.py: `python -m
tests.crash.stall_flows DB SIDE_DIR ROLE`, one worker process until SIGTERM.

The workflow `pay` charges once through an at-most-once step (`charge`, timeout 1.5 s, lease
2.5 s) whose receiver is a file of effects (SIDE_DIR/effects.txt, one line per effect, keyed by
the step's idempotency key); its reconcile hook looks the key up there. Every body start, effect
and reconcile call is journaled in SIDE_DIR/journal.txt as `ROLE pid what`.

The body of ROLE "first" signals SIDE_DIR/began-<pid> and then, by $STALL_AT:
    before   sleeps 1 s (within its timeout) before the effect; the test stops the process
             with SIGSTOP meanwhile, for longer than the lease
    after    makes the effect, then signals and sleeps 30 s
    block    is a sync body (a thread) that sleeps 4 s before the effect, while another run's
             async step blocks the event loop with time.sleep(6): the loop stalls past the lease
    stuck    the same, but the sync body sleeps 8 s and the loop stays blocked for 12 s, past
             $MAX_LOOP_STALL (seconds): the worker is taken for stuck while its body runs
Other roles make the effect at once. The workflow `again` runs a plain step (`flake`) whose first
attempt fails and signals SIDE_DIR/failed-<pid>; its retry waits 1.5 s in the worker. The
workflow `long` runs a plain step for 5 s (two lease
periods, kept by heartbeats). $CLOCK_SKEW (seconds) moves this process's wall clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

ROLE = sys.argv[3] if len(sys.argv) > 3 else "first"
SKEW = float(os.environ.get("CLOCK_SKEW", "0"))
if SKEW:  # a machine whose clock is off: everything reading time.time() sees it
    _real_time = time.time
    time.time = lambda: _real_time() + SKEW

import tether  # noqa: E402
from tether.core.context import current_step  # noqa: E402

from .backends import database_url  # noqa: E402
from .flows import _append, read_lines  # noqa: E402

LEASE = timedelta(seconds=2.5)
TIMEOUT = timedelta(seconds=1.5)


def make_app(db: str, side_dir: str | Path, role: str = ROLE) -> tether.App:
    side = Path(side_dir)
    effects, journal = side / "effects.txt", side / "journal.txt"
    stall = os.environ.get("STALL_AT", "") if role == "first" else ""
    app = tether.App(database_url(db), lease_duration=LEASE)
    if "MAX_LOOP_STALL" in os.environ:
        stall_limit = float(os.environ["MAX_LOOP_STALL"])
        app.engine.settings = dataclasses.replace(app.engine.settings, max_loop_stall=stall_limit)

    def note(what: str) -> None:
        _append(journal, f"{role} {os.getpid()} {what}")

    def effect(key: str, amount: int) -> str:
        receipt = f"receipt-{amount}"
        _append(effects, f"{key}\t{receipt}")
        note("effect")
        return receipt

    def lookup(amount: int) -> object:
        note("reconcile")
        key = tether.idempotency_key()
        for line in read_lines(effects):
            found, _, receipt = line.partition("\t")
            if found == key:
                return receipt
        return tether.NOT_DONE

    @app.step(at_most_once=True, reconcile=lookup, timeout=TIMEOUT)
    async def charge(amount: int) -> str:
        note("begin")
        key = tether.idempotency_key()
        # "after" signals once its effect is made: stopped between the signal and the effect,
        # it would be the "before" case, which the test does not expect there.
        if stall and stall != "after":
            (side / f"began-{os.getpid()}").touch()
        if stall == "before":
            await asyncio.sleep(1.0)
        receipt = effect(key, amount)
        if stall == "after":
            (side / f"began-{os.getpid()}").touch()
            await asyncio.sleep(30)
        return receipt

    @app.step(at_most_once=True, reconcile=lookup, timeout=TIMEOUT)
    def charge_sync(amount: int) -> str:
        note("begin")
        key = tether.idempotency_key()
        (side / f"began-{os.getpid()}").touch()
        time.sleep({"block": 4.0, "stuck": 8.0}.get(stall, 0.0))
        return effect(key, amount)

    @app.step()
    async def hog() -> str:
        (side / f"hogging-{os.getpid()}").touch()
        if stall in ("block", "stuck"):  # a sync call on the loop: nothing else runs meanwhile
            time.sleep(6.0 if stall == "block" else 12.0)
        return "hogged"

    @app.step(retry=tether.Retry(initial_delay=timedelta(seconds=1.5), jitter=0.0))
    async def flake() -> str:
        step = current_step()
        assert step is not None
        note(f"begin-{step.attempt}")
        if step.attempt == 1:
            (side / f"failed-{os.getpid()}").touch()
            raise RuntimeError("the first attempt fails")
        return f"attempt-{step.attempt}"

    @app.workflow()
    async def again() -> str:
        return await flake()

    @app.step()
    async def work() -> str:
        note("begin")
        (side / f"working-{os.getpid()}").touch()
        await asyncio.sleep(5.0)
        note("done")
        return "worked"

    @app.workflow()
    async def long() -> str:
        return await work()

    @app.workflow()
    async def pay(amount: int) -> str:
        return await charge(amount)

    @app.workflow()
    async def pay_sync(amount: int) -> str:
        return await charge_sync(amount)

    @app.workflow()
    async def busy() -> str:
        return await hog()

    return app


async def main(db: str, side_dir: str) -> None:
    app = make_app(db, side_dir)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with app:
        (Path(side_dir) / f"ready-{ROLE}-{os.getpid()}").touch()
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))

"""Tether's crash demo: a durable pipeline whose worker is killed with SIGKILL in the middle of a
step, then restarted; the run finishes by itself and no completed step runs again.

    make demo            (or: python examples/crash_demo.py)

The demo runs two worker processes, one after another, on one embedded SQLite file. Every step
body writes a line to a journal when it starts and ends, so the timeline below is evidence, not
a story: it shows which bodies ran in which process, and which steps the second process took
from the checkpoints instead of running them again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table

import tether

RUN_ID = "nightly-report"
STEPS = ["fetch", "clean", "summarize", "publish"]


def journal(event: str, step: str) -> None:
    """Append one line to the journal (flushed and synced: it must survive the SIGKILL)."""
    line = json.dumps({"t": time.time(), "pid": os.getpid(), "event": event, "step": step})
    with open(os.environ["DEMO_JOURNAL"], "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def make_app(url: str) -> tuple[tether.App, tether.Workflow[[str], dict[str, object]]]:
    app = tether.App(url)

    @app.step()
    async def fetch(source: str) -> list[int]:
        journal("start", "fetch")
        await asyncio.sleep(0.2)
        journal("end", "fetch")
        return [3, 1, 4, 1, 5, 9, 2, 6]

    @app.step()
    def clean(rows: list[int]) -> list[int]:
        journal("start", "clean")
        time.sleep(0.2)
        journal("end", "clean")
        return sorted(set(rows))

    @app.step()
    async def summarize(rows: list[int]) -> dict[str, float]:
        journal("start", "summarize")
        await asyncio.sleep(1.0)  # the first worker is killed in here
        journal("end", "summarize")
        return {"count": len(rows), "mean": sum(rows) / len(rows)}

    def already_published(summary: dict[str, float], report_id: str) -> object:
        return tether.NOT_DONE  # a real receiver would be asked by tether.idempotency_key()

    @app.step(at_most_once=True, reconcile=already_published, timeout=timedelta(seconds=10))
    async def publish(summary: dict[str, float], report_id: str) -> str:
        journal("start", "publish")
        await asyncio.sleep(0.1)
        journal("end", "publish")
        return f"published {report_id} with key {tether.idempotency_key()[:18]}..."

    @app.workflow()
    async def nightly(source: str) -> dict[str, object]:
        rows = await fetch(source)
        cleaned = await clean(rows)
        summary = await summarize(cleaned)
        report_id = str(tether.uuid4())[:8]
        receipt = await publish(summary, report_id)
        return {"summary": summary, "receipt": receipt}

    return app, nightly


async def worker(url: str) -> None:
    """One worker process: start the run (the same id finds the same run) and wait for it."""
    app, nightly = make_app(url)
    async with app:
        handle = await app.start(nightly, "s3://bucket/events", id=RUN_ID)
        await handle.result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(args.worker))
        return
    console = Console()
    with tempfile.TemporaryDirectory(prefix="tether-demo-") as tmp:
        url = f"sqlite:///{tmp}/demo.db"
        log = Path(tmp) / "journal.jsonl"
        env = dict(os.environ, DEMO_JOURNAL=str(log))
        command = [sys.executable, __file__, "--worker", url]
        console.print(f"[bold]Tether crash demo[/] on {url}")

        first_start = time.time()
        first = subprocess.Popen(command, env=env)
        while not (log.exists() and '"summarize"' in log.read_text()):
            time.sleep(0.02)
            if first.poll() is not None:
                raise SystemExit("the first worker exited before the kill; see its output above")
        time.sleep(0.3)  # well inside summarize
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        killed_at = time.time()
        console.print(f"worker 1 (pid {first.pid}) [red]killed with SIGKILL[/] in summarize")

        second_start = time.time()
        second = subprocess.run(command, env=env, check=True)
        del second
        app, _ = make_app(url)
        report(console, app, log, first.pid, first_start, killed_at, second_start)


def report(
    console: Console,
    app: tether.App,
    log: Path,
    first_pid: int,
    t0: float,
    killed_at: float,
    second_start: float,
) -> None:
    async def read() -> tuple[tether.RunInfo, list[tether.Checkpoint], object]:
        handle = await app.get(RUN_ID)
        info, checkpoints, result = await handle.info(), await handle.checkpoints(), None
        result = await handle.result()
        await app.close()
        return info, checkpoints, result

    info, checkpoints, result = asyncio.run(read())
    events = [json.loads(line) for line in log.read_text().splitlines()]
    timeline = Table(title="Timeline (seconds since the demo started)")
    for column in ("t", "worker", "what"):
        timeline.add_column(column)
    rows = [
        (e["t"], "1" if e["pid"] == first_pid else "2", f"{e['step']} body {e['event']}s")
        for e in events
    ]
    rows += [(killed_at, "1", "[red]SIGKILL[/]"), (second_start, "2", "process starts")]
    assert info.finished_at is not None
    finished = info.finished_at.timestamp()
    rows.append((finished, "2", f"run {info.status.value}"))
    for t, who, what in sorted(rows):
        timeline.add_row(f"{t - t0:6.2f}", who, what)
    console.print(timeline)

    ran = {s: [e["pid"] for e in events if e["step"] == s and e["event"] == "start"] for s in STEPS}
    steps = Table(title="Steps")
    for column in ("checkpoint", "bodies run in worker 1", "in worker 2", "in worker 2 it was"):
        steps.add_column(column)
    for cp in checkpoints:
        step = cp.name.split("#")[0]
        pids = ran.get(step, [])
        in1 = sum(1 for p in pids if p == first_pid)
        in2 = len(pids) - in1
        how = (
            "a recorded value (helper)"
            if cp.kind != "step"
            else ("replayed from its checkpoint" if in2 == 0 else "executed")
        )
        steps.add_row(cp.name, str(in1), str(in2), how)
    console.print(steps)
    console.print(f"result: {result}")
    console.print(
        f"recovery: worker 2 finished the run {finished - second_start:.2f} s after it started "
        f"(its remaining work: the rest of summarize and publish, about 1.1 s)"
    )
    twice = [s for s, pids in ran.items() if s != "summarize" and len(pids) > 1]
    if twice or info.status is not tether.RunStatus.SUCCEEDED:
        raise SystemExit(f"unexpected: steps run twice {twice}, status {info.status}")
    console.print("[green]every completed step ran exactly once; the interrupted one ran again[/]")


if __name__ == "__main__":
    main()

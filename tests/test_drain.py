"""Drain on SIGTERM, with real `tether worker` processes: a step in flight when the signal
arrives finishes and is recorded (the next worker does not do it again), the run is given back
at that point and the process exits; a second signal stops at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import subprocess
import sys
from pathlib import Path

import tether
from tether.store.port import CheckpointStatus, RunStatus

MODULE = """
import asyncio
import os
import pathlib

import tether

app = tether.App({url!r})
LOG = pathlib.Path({log!r})


def note(what: str) -> None:
    with LOG.open("a") as f:
        f.write(f"{{what}} {{os.getpid()}}\\n")


@app.step()
async def slow(n: int) -> int:
    note("start")
    await asyncio.sleep({seconds})
    note("end")
    return n * 2


@app.step()
async def after(n: int) -> int:
    note("after")
    return n


@app.workflow(name="job")
async def job(n: int) -> int:
    doubled = await slow(n)
    return doubled + await after(n)
"""


def setup(tmp_path: Path, seconds: float) -> tuple[str, Path]:
    url, log = f"sqlite:///{tmp_path}/drain.db", tmp_path / "steps.log"
    (tmp_path / "drain_app.py").write_text(MODULE.format(url=url, log=str(log), seconds=seconds))
    return url, log


def start_worker(tmp_path: Path, *options: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tether", "worker", "drain_app:app", *options]
    return subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def lines(log: Path) -> list[tuple[str, int]]:
    if not log.exists():
        return []
    return [(word, int(pid)) for word, pid in (ln.split() for ln in log.read_text().splitlines())]


async def start_run(url: str) -> None:
    app = tether.App(url)

    @app.workflow(name="job")
    async def job(n: int) -> int:
        raise AssertionError("this App has no worker")

    await app.start(job, 5, id="r1")
    await app.close()


def wait_for(log: Path, entry: str, proc: subprocess.Popen[str]) -> None:
    """Until the step log holds `entry` (the limit only keeps a broken build from hanging)."""
    for _ in range(3000):
        if any(word == entry for word, _ in lines(log)):
            return
        assert proc.poll() is None, proc.communicate()
        asyncio.run(asyncio.sleep(0.01))
    raise AssertionError(f"no {entry!r} in the step log")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def test_a_step_in_flight_at_sigterm_finishes_and_is_recorded_and_is_not_redone(
    tmp_path: Path,
) -> None:
    url, log = setup(tmp_path, seconds=2)
    asyncio.run(start_run(url))
    first = start_worker(tmp_path, "--drain-timeout", "30")
    try:
        wait_for(log, "start", first)
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=60)
    finally:
        stop(first)
    assert first.returncode == 0, err
    assert lines(log) == [("start", first.pid), ("end", first.pid)]

    async def recorded() -> tuple[RunStatus, list[tuple[str, CheckpointStatus]]]:
        app = tether.App(url)
        try:
            await app.open()
            run = await app.engine.store.get_run("r1")
            assert run is not None
            history = await app.engine.store.load_history("r1")
            return run.status, [(c.name, c.status) for c in history]
        finally:
            await app.close()

    status, history = asyncio.run(recorded())
    # Given back once the step recorded, before the next one: claimable by the next worker.
    assert status in (RunStatus.WAITING, RunStatus.PENDING)
    assert history == [("slow", CheckpointStatus.COMPLETED)]

    second = start_worker(tmp_path)
    try:
        wait_for(log, "after", second)

        async def result() -> object:
            app = tether.App(url)
            try:
                return await (await app.get("r1")).result(timeout=30)
            finally:
                await app.close()

        assert asyncio.run(result()) == 15
        second.send_signal(signal.SIGTERM)
        second.communicate(timeout=60)
    finally:
        stop(second)
    assert lines(log) == [("start", first.pid), ("end", first.pid), ("after", second.pid)]


def test_a_second_sigterm_during_a_long_step_stops_the_worker_at_once(tmp_path: Path) -> None:
    url, log = setup(tmp_path, seconds=600)
    asyncio.run(start_run(url))
    proc = start_worker(tmp_path, "--drain-timeout", "600")
    try:
        wait_for(log, "start", proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None
        for line in proc.stderr:  # the first signal is heard: the worker drains
            if "draining" in line:
                break
        proc.send_signal(signal.SIGTERM)
        # Well within the step's 600 s and the drain's: the limit only catches a hang.
        proc.wait(timeout=30)
    finally:
        stop(proc)
    assert proc.returncode == 0
    assert lines(log) == [("start", proc.pid)]  # interrupted, not finished

    async def status() -> RunStatus:
        app = tether.App(url)
        try:
            return await (await app.get("r1")).status()
        finally:
            await app.close()

    assert asyncio.run(status()) == RunStatus.PENDING  # released for the next worker


async def test_an_apps_worker_stop_drains_a_step_in_flight_and_gives_the_run_back(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/inproc.db"
    began, calls = asyncio.Event(), {"slow": 0, "after": 0}

    def build(app: tether.App) -> tether.Workflow[[int], int]:
        @app.step()
        async def slow(n: int) -> int:
            calls["slow"] += 1
            began.set()
            await asyncio.sleep(0.5)
            return n * 2

        @app.step()
        async def after(n: int) -> int:
            calls["after"] += 1
            return n

        @app.workflow(name="job")
        async def job(n: int) -> int:
            return await slow(n) + await after(n)

        return job

    first = tether.App(url)
    first.engine.settings = dataclasses.replace(first.engine.settings, drain_timeout=30.0)
    job = build(first)
    async with first:
        await first.start(job, 5, id="r1")
        await began.wait()
    # Closed while the step ran: it finished and was recorded, the next step never started.
    assert calls == {"slow": 1, "after": 0}
    second = tether.App(url)
    build(second)
    async with second:
        assert await (await second.get("r1")).result(timeout=30) == 15
    assert calls == {"slow": 1, "after": 1}

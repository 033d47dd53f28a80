"""A worker on another machine dies: its run is adopted by a live worker once the lease expires
(not before), with a higher epoch, and finishes without re-running its completed steps."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from tests.postgres_server import with_schema

from tether.store import store_from_url
from tether.store.port import RunRecord, WorkerInfo

ROOT = Path(__file__).resolve().parent.parent
LEASE = 1.5

FLOWS = """
import asyncio, os, sys
from datetime import timedelta
import tether

app = tether.App(os.environ["ADOPT_URL"], lease_duration=timedelta(seconds={lease}))
side = os.environ["ADOPT_SIDE"]

def mark(line):
    with open(side, "a") as f:
        f.write(line + "\\n")
        f.flush()
        os.fsync(f.fileno())

@app.step()
async def first() -> int:
    mark(f"first {{os.getpid()}}")
    return 1

@app.step()
async def second() -> int:
    mark(f"second-start {{os.getpid()}}")
    if os.environ.get("ADOPT_HANG"):
        await asyncio.sleep(3600)
    mark(f"second {{os.getpid()}}")
    return 2

@app.workflow()
async def flow() -> int:
    return await first() + await second()

async def main():
    async with app:
        handle = await app.start(flow, id="adopt-me")
        print(await handle.result(timeout=60), flush=True)

if __name__ == "__main__":
    asyncio.run(main())
"""


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/adopt.db"
    return with_schema(request.getfixturevalue("postgres_url"), f"t_{uuid.uuid4().hex[:12]}")


@pytest.mark.crash
def test_a_dead_remote_workers_run_is_adopted_after_its_lease_expires(
    url: str, tmp_path: Path
) -> None:
    script = tmp_path / "adopt_flows.py"
    script.write_text(FLOWS.format(lease=LEASE))
    side = tmp_path / "side"
    env = dict(os.environ, ADOPT_URL=url, ADOPT_SIDE=str(side), PYTHONPATH=str(ROOT))
    env.pop("TETHER_FAULTS", None)
    victim = subprocess.Popen([sys.executable, str(script)], env=dict(env, ADOPT_HANG="1"))
    try:
        deadline = time.monotonic() + 30
        while "second-start" not in (side.read_text() if side.exists() else ""):
            assert time.monotonic() < deadline, "the first worker never reached the second step"
            time.sleep(0.02)
        # Make the victim look like a worker on another machine: no same-host shortcut then,
        # only its lease can free the run.
        asyncio.run(move_workers_elsewhere(url))
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
    finally:
        if victim.poll() is None:
            victim.kill()
    killed_at = time.monotonic()
    survivor = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    took = time.monotonic() - killed_at
    assert survivor.returncode == 0, survivor.stderr
    assert survivor.stdout.strip() == "3"
    lines = side.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["first", "second-start", "second-start",
                                                   "second"]  # fmt: skip
    assert lines[0].split()[1] == str(victim.pid)  # `first` ran once, in the dead worker
    run = asyncio.run(read_run(url))
    assert run.epoch == 2  # adopted: the dead worker's epoch 1 is fenced off
    assert took >= LEASE - 0.5  # it waited for the lease (a correctness bound, not speed)


async def move_workers_elsewhere(url: str) -> None:
    store = store_from_url(url)
    await store.open()
    try:
        for worker in await store.list_workers():
            elsewhere = WorkerInfo(worker.id, "another-machine", worker.pid, worker.pid_token)
            await store.register_worker(elsewhere, 0.0)
    finally:
        await store.close()


async def read_run(url: str) -> RunRecord:
    store = store_from_url(url)
    await store.open()
    try:
        run = await store.get_run("adopt-me")
        assert run is not None
        return run
    finally:
        await store.close()

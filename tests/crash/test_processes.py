"""Several worker processes on one database at once (a SQLite file, or a PostgreSQL schema): every
run finishes, every step body runs exactly once, and write contention between the processes
loses nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.crash.children import child_env
from tests.crash.flows import STEPS, make_app, read_lines

import tether

ROOT = Path(__file__).resolve().parents[2]
RUNS = 40

MODULE = """
import os
from tests.crash.flows import make_app
app = make_app(os.environ["CRASH_DB"], os.environ["CRASH_SIDE_DIR"])
"""


@pytest.mark.crash
# serial: both workers must be up (their SIGTERM handler set) by the time the runs are done; a
# second test process on the machine slowed one's start past that (seen: exit -15, no output).
@pytest.mark.serial
def test_two_worker_processes_share_one_file_without_losing_or_repeating_work(
    db_url: str, tmp_path: Path
) -> None:
    db = db_url
    (tmp_path / "shared_mod.py").write_text(MODULE)

    async def create() -> None:
        app = make_app(db, tmp_path)  # no worker here: the runs wait as pending
        for i in range(RUNS):
            await app.start("pipeline", "order-1", id=f"run-{i:02d}")
        await app.close()

    asyncio.run(create())
    env = child_env(
        CRASH_DB=db,
        CRASH_SIDE_DIR=str(tmp_path),
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
    )
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tether", "worker", "shared_mod:app", "--concurrency", "4"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            runs = asyncio.run(statuses(db))
            if all(s is tether.RunStatus.SUCCEEDED for s in runs.values()):
                break
            assert not any(s is tether.RunStatus.FAILED for s in runs.values()), runs
            time.sleep(0.1)
        else:
            raise AssertionError(f"runs did not all succeed: {runs}")
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        outputs = [worker.communicate(timeout=20) for worker in workers]
    for worker, (_, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err
        assert "database is locked" not in err
    for i in range(RUNS):
        bodies = read_lines(tmp_path / f"bodies-run-{i:02d}")
        assert sorted(bodies) == sorted(STEPS), (i, bodies)  # each body exactly once
    assert len(read_lines(tmp_path / "effects")) == RUNS


async def statuses(db: str) -> dict[str, tether.RunStatus]:
    app = tether.App(db)
    try:
        return {r.id: r.status for r in await app.list_runs(limit=1000)}
    finally:
        await app.close()

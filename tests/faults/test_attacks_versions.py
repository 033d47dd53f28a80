"""Attacks on versions and drain (issue 18), family `versions`: a worker of another version
taking a run pinned to a live one; a version made of terminal escapes, through the App, the
CLI, or a worker row written into the database by hand, reaching a terminal raw; a SIGTERM
that makes a step in flight run twice (tests/test_drain.py plays that one with processes).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.faults.attack_kit import attack

import tether
from tether.errors import ConfigurationError
from tether.store.port import NewRun, WorkerInfo

pytestmark = pytest.mark.timeout(60)

RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
HOSTILE = "v1\x1b]0;pwned\x07\x1b[2J\u202egnp"


async def test_a_worker_of_another_version_cannot_take_a_run_pinned_to_a_live_one(
    tmp_path: Path,
) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/t.db")
    await app.open()
    store, now = app.engine.store, app.engine.clock.now()
    try:
        await store.register_worker(WorkerInfo("owner", "h", 1, "a", version="v1"), now)
        await store.create_run(NewRun("r1", "wf", '{"args": [], "kwargs": {}}'), now)
        await store.claim_runs("owner", ["wf"], now, now + 1, 1, version="v1", live_since=now)
        with attack("versions"):
            # Its lease has run out, but its version lives (a heartbeat now): not for v2.
            later = now + 2
            await store.heartbeat("owner", [], later + 15, later)
            stolen = await store.claim_runs("thief", ["wf"], later, later + 15, 10, version="v2",
                                            live_since=later - 15)  # fmt: skip
            assert stolen == []
            assert await store.next_wake_at(["wf"], version="v2", live_since=later - 15) is None
    finally:
        await app.close()


def test_a_version_of_terminal_escapes_is_refused_by_the_app_and_the_cli(tmp_path: Path) -> None:
    with attack("versions"):
        with pytest.raises(ConfigurationError):
            tether.App(f"sqlite:///{tmp_path}/t.db", version=HOSTILE)
        done = subprocess.run(
            [sys.executable, "-m", "tether", "runs", "-d", f"sqlite:///{tmp_path}/t.db",
             "move-version", "r1", "--to", HOSTILE],
            capture_output=True, text=True, check=False, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode != 0
        assert "a version is a non-empty str" in done.stderr
        assert not RAW.search(done.stdout + done.stderr)


def test_a_hostile_version_written_into_the_database_is_spelled_out_by_tether_status(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/t.db"

    async def plant() -> None:
        app = tether.App(url)
        await app.open()
        store, now = app.engine.store, app.engine.clock.now()
        # Past the App's checks: a row as a hostile process on the database would write it.
        await store.register_worker(WorkerInfo("w\x1b[31m", "h", 1, "a", version=HOSTILE), now)
        await store.create_run(NewRun("r1", "wf", '{"args": [], "kwargs": {}}'), now)
        await store.claim_runs("w\x1b[31m", ["wf"], now, now + 60, 1, version=HOSTILE)
        await app.close()

    asyncio.run(plant())
    with attack("versions"):
        command = [sys.executable, "-m", "tether", "status", "-d", url]
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "pwned" in done.stdout  # listed, its escapes spelled out
        assert not RAW.search(done.stdout)

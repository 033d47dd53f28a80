"""Workers alive but stalled past their leases, beside a second live worker process: an
at-most-once step's effect happens once whether its owner is frozen (SIGSTOP, not killed)
before or after the effect, or its event loop is blocked by a sync call for longer than the
lease; and a worker whose wall clock runs a minute ahead does not take the others' live runs
(PostgreSQL: leases are judged on the server's clock). Flows in stall_flows.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.crash.children import child_env
from tests.crash.flows import read_lines
from tests.crash.stall_flows import make_app

from tether.store.port import RunStatus

ROOT = Path(__file__).resolve().parents[2]
# serial: each test stops a worker at a moment (SIGSTOP once its body began) and counts on the
# lease (2.5 s) and the step's timeout (1.5 s) running out in order; a second test process on
# the machine moves those moments (seen: the "after" case's effect made twice, the process
# stopped between its began-file and its effect).
pytestmark = pytest.mark.serial


class Workers:
    """The worker processes of one test, stopped (and thawed) at its end."""

    def __init__(self, db: str, side: Path) -> None:
        self.db, self.side = db, side
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, role: str, **env: str) -> subprocess.Popen[str]:
        with open(self.side / f"log-{role}.txt", "a") as log:  # the child keeps its own copy
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.crash.stall_flows", self.db, str(self.side), role],
                cwd=ROOT, env=child_env(**env), stdout=subprocess.DEVNULL, stderr=log,
                text=True,
            )  # fmt: skip
        self.procs.append(proc)
        wait_for((self.side / f"ready-{role}-{proc.pid}").exists, f"{role} ready")
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[Workers]:
    running = Workers(db_url, tmp_path)
    yield running
    running.stop()


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def start_run(db: str, side: Path, workflow: str, *args: object, run_id: str) -> None:
    async def go() -> None:
        app = make_app(db, side, role="client")  # no worker: the run waits to be claimed
        await app.start(workflow, *args, id=run_id)
        await app.close()

    asyncio.run(go())


def outcome(db: str, side: Path, run_id: str, timeout: float = 40.0) -> tuple[RunStatus, str]:
    async def go() -> tuple[RunStatus, str]:
        app = make_app(db, side, role="client")
        try:
            handle = await app.get(run_id)
            result = await handle.result(timeout=timeout)
            return await handle.status(), str(result)
        finally:
            await app.close()

    return asyncio.run(go())


def step_status(db: str, side: Path, run_id: str, name: str) -> str | None:
    """The status of the run's checkpoint `name` in the database (None: not written)."""

    async def go() -> str | None:
        app = make_app(db, side, role="client")
        try:
            await app.open()
            history = await app.engine.store.load_history(run_id)
            return next((c.status.value for c in history if c.name == name), None)
        finally:
            await app.close()

    return asyncio.run(go())


def journal(side: Path) -> list[tuple[str, str]]:
    return [(line.split()[0], line.split()[2]) for line in read_lines(side / "journal.txt")]


@pytest.mark.crash
@pytest.mark.parametrize("stall", ["before", "after"])
def test_an_at_most_once_effect_happens_once_when_its_live_owner_is_frozen_past_its_lease(
    workers: Workers, db_url: str, tmp_path: Path, stall: str
) -> None:
    first = workers.start("first", STALL_AT=stall)
    start_run(db_url, tmp_path, "pay", 7, run_id="p")
    wait_for((tmp_path / f"began-{first.pid}").exists, "the first body")
    os.kill(first.pid, signal.SIGSTOP)  # alive, its pid and row there, but it does nothing
    try:
        workers.start("second")
        status, result = outcome(db_url, tmp_path, "p")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    time.sleep(2.0)  # the thawed owner's body resumes past its deadline: it must not go on
    assert (status, result) == (RunStatus.SUCCEEDED, "receipt-7")
    effects = read_lines(tmp_path / "effects.txt")
    assert len(effects) == 1, effects
    seen = journal(tmp_path)
    assert ("second", "reconcile") in seen  # the new owner asked before acting
    if stall == "after":  # the effect was there: found, never made again
        assert ("second", "begin") not in seen
        assert seen.count(("first", "effect")) == 1
    else:  # not made yet: the new owner made it, the frozen one never did
        assert ("second", "effect") in seen
        assert ("first", "effect") not in seen


@pytest.mark.crash
def test_a_worker_frozen_in_a_retry_wait_past_its_lease_does_not_run_the_step_again(
    workers: Workers, db_url: str, tmp_path: Path
) -> None:
    """Its retry's wait is over when it thaws, but the run is another's by then, which ran the
    attempt: the thawed worker learns so from a heartbeat before any body starts."""
    first = workers.start("first")
    start_run(db_url, tmp_path, "again", run_id="a")
    wait_for((tmp_path / f"failed-{first.pid}").exists, "the first attempt's failure")
    # Stopped once the failure is recorded: in its retry's delay.
    wait_for(lambda: step_status(db_url, tmp_path, "a", "flake") == "retrying", "its record")
    os.kill(first.pid, signal.SIGSTOP)
    try:
        workers.start("second")
        status, result = outcome(db_url, tmp_path, "a")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    time.sleep(2.0)  # time for the thawed worker to start the attempt, were it to
    assert (status, result) == (RunStatus.SUCCEEDED, "attempt-2")
    assert journal(tmp_path) == [("first", "begin-1"), ("second", "begin-2")]


@pytest.mark.crash
def test_a_worker_whose_loop_is_blocked_past_its_lease_keeps_its_at_most_once_run(
    workers: Workers, db_url: str, tmp_path: Path
) -> None:
    first = workers.start("first", STALL_AT="block")
    start_run(db_url, tmp_path, "pay_sync", 9, run_id="sync")
    wait_for((tmp_path / f"began-{first.pid}").exists, "the sync body")
    start_run(db_url, tmp_path, "busy", run_id="hog")  # blocks the first worker's loop for 6 s
    wait_for((tmp_path / f"hogging-{first.pid}").exists, "the loop to block")
    workers.start("second")  # it would take "sync" if the blocked worker's lease ran out
    assert outcome(db_url, tmp_path, "sync") == (RunStatus.SUCCEEDED, "receipt-9")
    assert outcome(db_url, tmp_path, "hog")[0] is RunStatus.SUCCEEDED
    assert len(read_lines(tmp_path / "effects.txt")) == 1
    seen = journal(tmp_path)
    assert [who for who, what in seen if what in ("begin", "reconcile")] == ["first"]


@pytest.mark.crash
def test_a_worker_taken_for_stuck_under_a_running_at_most_once_body_ends_itself_first(
    workers: Workers, db_url: str, tmp_path: Path
) -> None:
    """Its loop blocked past max_loop_stall, the worker stops extending its leases; a sync
    at-most-once body still runs in it (past its timeout). Before its lease runs out it ends
    its process (the fence), so the body cannot make its effect beside the next owner's."""
    first = workers.start("first", STALL_AT="stuck", MAX_LOOP_STALL="1")
    start_run(db_url, tmp_path, "pay_sync", 5, run_id="stuck")
    wait_for((tmp_path / f"began-{first.pid}").exists, "the sync body")
    start_run(db_url, tmp_path, "busy", run_id="hog")  # blocks the first worker's loop for 12 s
    wait_for((tmp_path / f"hogging-{first.pid}").exists, "the loop to block")
    workers.start("second")
    assert first.wait(timeout=30) == 70  # the fence ended it (EX_SOFTWARE), before the lease
    assert outcome(db_url, tmp_path, "stuck") == (RunStatus.SUCCEEDED, "receipt-5")
    effects = read_lines(tmp_path / "effects.txt")
    assert len(effects) == 1, effects
    seen = journal(tmp_path)
    assert ("first", "effect") not in seen
    assert seen.index(("second", "reconcile")) < seen.index(("second", "effect"))
    assert "ends now (exit status 70)" in (tmp_path / "log-first.txt").read_text()


@pytest.mark.crash
@pytest.mark.parametrize("backend", ["postgres"])
def test_a_worker_with_its_clock_a_minute_ahead_takes_no_live_run_of_another(
    workers: Workers, db_url: str, tmp_path: Path
) -> None:
    first = workers.start("first")
    start_run(db_url, tmp_path, "long", run_id="long")
    wait_for((tmp_path / f"working-{first.pid}").exists, "the first worker's step")
    workers.start("skewed", CLOCK_SKEW="60")
    assert outcome(db_url, tmp_path, "long") == (RunStatus.SUCCEEDED, "worked")
    assert journal(tmp_path) == [("first", "begin"), ("first", "done")]

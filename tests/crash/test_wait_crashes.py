"""Durable waits across SIGKILL: a sleep keeps its time left, an event is taken exactly once, a
timer fires once with two worker processes on one database, and a child run is created and
awaited once, on real SQLite files and on PostgreSQL (a fresh schema per test).

A killed process (`python -m tests.crash.wait_proc run ...`, workflows in wait_flows.py) kills
itself at a fault site ($TETHER_FAULTS) or is killed by the test while its run waits. The test
reads what the dead process made durable (through the library; the event mailbox and the child
rows through a read-only connection beside it: backends.ro_query), then a process without faults
must finish the run. Step bodies are counted in the `bodies` side file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

import tether
from tether.store.port import Checkpoint, CheckpointStatus, RunRecord, RunStatus

from .backends import ro_query
from .children import child_env
from .flows import read_lines
from .matrix import on_backends
from .wait_flows import SLEEP_SECONDS, TICK_SECONDS, child_id, safe

# serial: recoveries are bounded (RECOVERY_BOUND, a kept sleep within KEPT_MARGIN of its due
# time), which a second test process on the machine overruns (seen: 2.06 to 3.42 s).
pytestmark = [pytest.mark.crash, pytest.mark.serial]

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
PROC_TIMEOUT = 30.0
INLINE_WAIT = 2.0  # the library's default inline_wait_max, which napper's processes keep
KEPT_MARGIN = 1.0  # a resumed sleep ends within this of its recorded due time
RECOVERY_BOUND = 2.0  # a recovering process with nothing left to wait for finishes within this
BW, BC, AC = "store.before_write", "store.before_commit", "store.after_commit"
C = CheckpointStatus.COMPLETED


def short(site: str) -> str:
    return site.removeprefix("store.")


# -- processes ----------------------------------------------------------------------------------


class Proc:
    """One process of tests.crash.wait_proc, its output kept in a log file."""

    def __init__(self, side: Path, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.side, self.name = side, name
        self.log = side / f"{name}.log"
        full = child_env(CRASH_SIDE_DIR=str(side), **env)
        with open(self.log, "wb") as out:
            self.wall_started = time.time()
            self.started = time.monotonic()
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "tests.crash.wait_proc", *argv],
                cwd=ROOT,
                env=full,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    async def wait(self, timeout: float = PROC_TIMEOUT) -> float:
        """Wait for the process to end; the seconds since it started. Kills it and fails the
        test if it outlives `timeout`."""
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                self.kill()
                self.popen.wait()
                pytest.fail(f"{self.name} still ran after {timeout}s\n{self.output()}")
            await asyncio.sleep(0.005)
        return time.monotonic() - self.started

    async def killed(self) -> None:
        """Wait for the process to die by SIGKILL (its own, at a fault site, or the test's)."""
        await self.wait()
        assert self.popen.returncode == -signal.SIGKILL, (
            f"{self.name} exited {self.popen.returncode}, it was not killed\n{self.output()}"
        )

    async def succeeded(self) -> float:
        seconds = await self.wait()
        assert self.popen.returncode == 0, f"{self.name} failed\n{self.output()}"
        return seconds

    def kill(self) -> None:
        if self.popen.returncode is None:
            os.kill(self.pid, signal.SIGKILL)

    def output(self) -> str:
        return f"--- {self.name} output:\n" + self.log.read_text(errors="replace")[-4000:]

    def result(self) -> Any:
        path = self.side / f"result-{self.pid}.json"
        return json.loads(path.read_text()) if path.exists() else None


class Spawner:
    """Starts the test's processes; whatever still runs at the end of the test is killed."""

    def __init__(self, db: str, side: Path) -> None:
        self.db, self.side = db, side
        self.procs: list[Proc] = []

    def run(
        self, name: str, workflow: str, run_id: str, arg: Any, faults: str = "", **env: str
    ) -> Proc:
        """A process that starts (or finds) the run and waits for its result."""
        if faults:
            env["TETHER_FAULTS"] = faults
        argv = ["run", self.db, str(self.side), workflow, run_id, json.dumps(arg)]
        proc = Proc(self.side, name, argv, env)
        self.procs.append(proc)
        return proc

    def send(self, name: str, run_id: str, key: str, payload: Any, faults: str = "") -> Proc:
        """A process that sends one event to the run (no worker in it)."""
        env = {"TETHER_FAULTS": faults} if faults else {}
        argv = ["send", self.db, run_id, key, json.dumps(payload)]
        proc = Proc(self.side, name, argv, env)
        self.procs.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.popen.wait()


@pytest.fixture
def spawn(db_url: str, tmp_path: Path) -> Iterator[Spawner]:
    spawner = Spawner(db_url, tmp_path)
    yield spawner
    spawner.cleanup()


# -- reading the database as a separate client --------------------------------------------------


@dataclass
class State:
    """What the database holds for one run."""

    record: RunRecord | None
    checkpoints: list[Checkpoint]

    @property
    def status(self) -> RunStatus | None:
        return None if self.record is None else self.record.status

    def cp(self, name: str) -> Checkpoint | None:
        return next((c for c in self.checkpoints if c.name == name), None)

    def states(self) -> list[tuple[str, CheckpointStatus]]:
        return [(c.name, c.status) for c in self.checkpoints]


class Reader:
    """The library's view of the database (App.get -> handle.checkpoints), with no worker; it
    also sends events (App.send) as a client without a worker."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.app = tether.App(db)

    async def state(self, run_id: str) -> State:
        try:
            handle = await self.app.get(run_id)
        except tether.RunNotFound:
            return State(None, [])
        record = await self.app.engine.store.get_run(run_id)
        return State(record, await handle.checkpoints())

    async def checkpoint(self, run_id: str, name: str) -> Checkpoint | None:
        return (await self.state(run_id)).cp(name)

    async def workers(self) -> int:
        return len(await self.app.engine.store.list_workers())

    async def until(self, what: str, check: Callable[[], Awaitable[T | None]], *procs: Proc) -> T:
        """Poll `check` until it gives a value; fails if one of `procs` ends first."""
        deadline = time.monotonic() + PROC_TIMEOUT
        while True:
            value = await check()
            if value is not None and value is not False:
                return value
            for proc in procs:
                if not proc.alive():
                    pytest.fail(f"{proc.name} ended before {what}\n{proc.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {PROC_TIMEOUT}s")
            await asyncio.sleep(0.01)

    async def until_status(self, run_id: str, status: RunStatus, *procs: Proc) -> State:
        async def check() -> State | None:
            state = await self.state(run_id)
            return state if state.status is status else None

        return await self.until(f"{status} run {run_id}", check, *procs)


@pytest.fixture
async def reader(db_url: str) -> AsyncIterator[Reader]:
    r = Reader(db_url)
    await r.app.open()
    yield r
    await r.app.close()


@dataclass(frozen=True)
class Event:
    id: int
    run_id: str
    key: str
    payload: Any
    consumed_by: str | None
    consumed_at: float | None


def mailbox(db: str) -> list[Event]:
    """The event mailbox of every run, read beside the library (the store API shows no
    consumption), oldest first."""
    rows = ro_query(
        db,
        "SELECT id, run_id, key, payload, consumed_by, consumed_at FROM tether_events ORDER BY id",
    )
    return [Event(i, r, k, json.loads(p), by, at) for i, r, k, p, by, at in rows]


def bodies(side: Path, run_id: str | None = None) -> list[str]:
    return read_lines(side / ("bodies" if run_id is None else f"bodies-{safe(run_id)}"))


def tally(
    crash_tally: dict[str, int],
    *,
    kills: int = 1,
    lost: bool = False,
    duplicates: int = 0,
    recovery: float | None = None,
) -> None:
    """Add to the crash tests' tally (conftest): processes killed, runs the next process did
    not finish, step bodies run again after their completion was recorded, and the recovery
    time (only where no timer is left to wait out: a sleep's remainder is not recovery)."""
    crash_tally["crash_points"] += kills
    crash_tally["lost_runs"] += int(lost)
    crash_tally["duplicate_completions"] += duplicates
    if recovery is not None:
        crash_tally["slowest_recovery_ms"] = max(
            crash_tally["slowest_recovery_ms"], round(recovery * 1000)
        )


def reruns(before: State, ran: list[str]) -> int:
    """Bodies in `ran` whose completion was durable before they ran, or that ran twice there."""
    done = {c.name for c in before.checkpoints if c.status is C}
    return sum(1 if name in done else 0 for name in ran) + len(ran) - len(set(ran))


# -- 1. SIGKILL during a durable sleep ----------------------------------------------------------

NAP = "nap"
NAP_RESULT = {"before": "before(t)", "after": "after(before(t))"}


async def recover_nap(
    spawn: Spawner, reader: Reader, crash_tally: dict[str, int], *, timer_left: bool
) -> tuple[State, State, Proc, float]:
    """After the kill: run a process without faults, check it finished the run exactly once;
    (what the dead process left, the final state, the process, its seconds)."""
    before = await reader.state(NAP)
    ran_before = bodies(spawn.side)
    last = spawn.run("recover", "napper", NAP, "t")
    seconds = await last.wait()
    after = await reader.state(NAP)
    ran_after = bodies(spawn.side)[len(ran_before) :]
    tally(
        crash_tally,
        lost=last.popen.returncode != 0 or after.status is not RunStatus.SUCCEEDED,
        duplicates=reruns(before, ran_after),
        recovery=None if timer_left else seconds,
    )
    assert last.popen.returncode == 0, last.output()
    assert last.result() == NAP_RESULT
    assert after.status is RunStatus.SUCCEEDED
    assert after.states() == [("step_before", C), ("sleep", C), ("step_after", C)]
    # step_before ran once, before the kill; step_after once, in the recovering process.
    assert ran_before == ["step_before"]
    assert ran_after == ["step_after"]
    assert bodies(spawn.side, NAP) == ["step_before", "step_after"]
    assert await reader.workers() == 0, "a dead worker (or the last process) is still registered"
    # The timer never fired early: the recorded end is at least the duration after its start.
    sleep = after.cp("sleep")
    assert sleep is not None
    assert sleep.started_at is not None
    assert sleep.finished_at is not None
    assert sleep.finished_at >= sleep.started_at + SLEEP_SECONDS
    assert after.record is not None
    assert after.record.finished_at is not None
    assert after.record.finished_at >= sleep.finished_at
    step_after = after.cp("step_after")
    assert step_after is not None
    assert step_after.started_at is not None
    assert step_after.started_at >= sleep.started_at + SLEEP_SECONDS  # it ran after the sleep
    return before, after, last, seconds


# The sleep tests wait out most of a 3 s sleep each: on PostgreSQL (for time) two cases, where
# the durable record of the sleep carries over the crash: the recorded start kept by the next
# process, which takes the run from the dead worker that held it (after_commit of the started
# checkpoint), and the time left waited after a suspension committed at the kill (the suspend,
# its wake time and NOTIFY; the run claimed when due). Left out on PostgreSQL: started
# before_write/before_commit (nothing of the sleep durable yet, as at the commit boundaries of
# test_kill_at_commit_boundary), held-in-memory (the run running under the dead worker's lease
# with its start recorded, as started after_commit), at-suspend-before_commit (the same, killed
# later), suspended (a waiting run, as at-suspend-after_commit), and both kills at the sleep's
# completion (a suspended run claimed again when due: test_timers_fire_once_with_two_worker_
# processes[postgres-suspended] claims 20 runs so, twice each).
SLEEP_STARTS = {short(site): site for site in (BW, BC, AC)}
SLEEP_ENDS = {short(site): site for site in (BC, AC)}


@pytest.mark.parametrize(("backend", "site"), on_backends(SLEEP_STARTS, ["after_commit"]))
async def test_kill_at_the_sleeps_started_checkpoint(
    site: str, spawn: Spawner, reader: Reader, crash_tally: dict[str, int]
) -> None:
    """Killed while the sleep's start is committed: before the commit the wait never began (it
    begins anew in the next process, the full duration); after it, its start time is kept."""
    first = spawn.run("killed", "napper", NAP, "t", f"{site}@write_checkpoint:sleep:started=kill")
    await first.killed()
    before, after, last, _ = await recover_nap(spawn, reader, crash_tally, timer_left=True)

    assert before.status is RunStatus.RUNNING
    assert before.record is not None
    assert before.record.epoch == 1
    durable = site == AC
    left = [("step_before", C)]
    if durable:
        left.append(("sleep", CheckpointStatus.STARTED))
    assert before.states() == left
    sleep = after.cp("sleep")
    assert sleep is not None
    assert sleep.started_at is not None
    if durable:
        started = before.cp("sleep")
        assert started is not None
        assert started.started_at is not None
        assert started.started_at < last.wall_started
        assert started.retry_at == started.started_at + SLEEP_SECONDS  # the due time, recorded
        assert sleep.started_at == started.started_at  # kept, not restarted
    else:
        assert sleep.started_at >= last.wall_started  # began in the recovering process
    assert after.record is not None
    assert after.record.finished_at is not None
    assert after.record.finished_at - sleep.started_at < SLEEP_SECONDS + KEPT_MARGIN


@dataclass(frozen=True)
class SleepKill:
    """A death in the middle of the sleep: by the test `offset` seconds after its recorded start,
    or at a fault site (the suspension, at the end of the 2 s inline window)."""

    offset: float
    faults: str = ""
    left: RunStatus = RunStatus.RUNNING  # running under the dead worker's lease, or waiting


SUSPEND = f"suspend_run:{NAP}"
INTO_SLEEP = {
    # held in memory, under the dead worker's lease
    "held-in-memory": SleepKill(1.5),
    # at the suspension's commit: lost (still running), or made (waiting until due)
    "at-suspend-before_commit": SleepKill(INLINE_WAIT, f"{BC}@{SUSPEND}=kill"),
    "at-suspend-after_commit": SleepKill(INLINE_WAIT, f"{AC}@{SUSPEND}=kill", RunStatus.WAITING),
    # suspended: the run is released, nobody holds it
    "suspended": SleepKill(2.3, left=RunStatus.WAITING),
}


@pytest.mark.parametrize(("backend", "kill"), on_backends(INTO_SLEEP, ["at-suspend-after_commit"]))
async def test_kill_while_the_run_sleeps_keeps_the_time_left(
    kill: SleepKill, spawn: Spawner, reader: Reader, crash_tally: dict[str, int]
) -> None:
    """Killed 1.5-2.3 s into the 3 s sleep: the next process waits out the ~1 s left (ending
    at the recorded start + 3 s), not 3 s again from its own start."""
    first = spawn.run("killed", "napper", NAP, "t", kill.faults)
    started = await reader.until(
        "sleep STARTED checkpoint", lambda: reader.checkpoint(NAP, "sleep"), first
    )
    assert started.status is CheckpointStatus.STARTED
    assert started.started_at is not None
    s1 = started.started_at
    if not kill.faults:
        await asyncio.sleep(max(0.0, s1 + kill.offset - time.time()))
        assert first.alive(), first.output()
        first.kill()
    await first.killed()
    killed_at = time.time() - s1
    assert kill.offset <= killed_at < SLEEP_SECONDS - 0.3, f"killed {killed_at:.2f}s in"

    before, after, last, seconds = await recover_nap(spawn, reader, crash_tally, timer_left=True)
    assert before.record is not None
    assert before.record.epoch == 1
    assert before.states() == [("step_before", C), ("sleep", CheckpointStatus.STARTED)]
    assert before.status is kill.left
    if kill.left is RunStatus.RUNNING:
        assert before.record.owner is not None
    else:
        assert before.record.owner is None
        assert before.record.wake_at == s1 + SLEEP_SECONDS  # due at the recorded start + 3 s

    sleep = after.cp("sleep")
    assert sleep is not None
    assert sleep.finished_at is not None
    assert sleep.started_at == s1  # the recorded start was kept
    # The remaining time was waited, not the whole duration again from the restart: restarting
    # would end >= last.wall_started + 3 s, i.e. >= offset + 3 s after s1.
    assert sleep.finished_at < last.wall_started + SLEEP_SECONDS
    assert after.record is not None
    assert after.record.finished_at is not None
    total = after.record.finished_at - s1
    assert total < SLEEP_SECONDS + KEPT_MARGIN < kill.offset + SLEEP_SECONDS, total
    assert seconds < SLEEP_SECONDS - kill.offset + KEPT_MARGIN, seconds


@pytest.mark.parametrize(("backend", "site"), on_backends(SLEEP_ENDS, []))
async def test_kill_at_the_sleeps_completion(
    site: str, spawn: Spawner, reader: Reader, crash_tally: dict[str, int]
) -> None:
    """The first process waits the whole sleep (held 2 s, suspended, claimed again when due)
    and dies recording the timer's end: the next process finishes at once."""
    first = spawn.run("killed", "napper", NAP, "t", f"{site}@write_checkpoint:sleep:completed=kill")
    await first.killed()
    before, after, _, seconds = await recover_nap(spawn, reader, crash_tally, timer_left=False)

    assert before.status is RunStatus.RUNNING
    assert before.record is not None
    assert before.record.epoch == 2
    status = C if site == AC else CheckpointStatus.STARTED
    assert before.states() == [("step_before", C), ("sleep", status)]
    started = before.cp("sleep")
    sleep = after.cp("sleep")
    assert started is not None
    assert started.started_at is not None
    assert sleep is not None
    assert sleep.started_at == started.started_at
    if site == AC:
        assert sleep == started  # the recorded end is replayed, not recorded again
    assert seconds < RECOVERY_BOUND, f"recovery took {seconds:.2f}s"


# -- 2. SIGKILL between an event's delivery and its consumption ---------------------------------

EV = "ev"
FAST = {"CRASH_INLINE_WAIT": "0.1"}  # the event wait suspends after 0.1 s


def go_result(n: int) -> dict[str, Any]:
    return {"payload": {"n": n}, "after": f"after(before(t)+{n})"}


async def suspended_on_go(spawn: Spawner, reader: Reader, name: str) -> Proc:
    """A process that started run `ev`, whose wait for "go" has suspended."""
    proc = spawn.run(name, "await_go", EV, "t", **FAST)
    state = await reader.until_status(EV, RunStatus.WAITING, proc)
    assert state.states() == [("step_before", C)]  # an event wait without timeout: no marker
    assert state.record is not None
    assert state.record.wake_on == ("go",)
    assert state.record.wake_at is None
    return proc


def check_event_run(after: State, n: int) -> None:
    assert after.status is RunStatus.SUCCEEDED
    assert after.states() == [("step_before", C), ("event:go", C), ("step_after", C)]
    taken = after.cp("event:go")
    assert taken is not None
    assert taken.result is not None
    assert json.loads(taken.result) == {"key": "go", "value": {"n": n}}


@pytest.mark.parametrize("site", [BC, AC], ids=short)
async def test_kill_between_delivery_and_take(
    site: str, spawn: Spawner, reader: Reader, crash_tally: dict[str, int], tmp_path: Path
) -> None:
    """Killed at the commit that takes the event into the wait's checkpoint. The events are in
    the mailbox before the faulted process starts, because every look of an event wait is a
    `take_event` transaction, also when the mailbox is empty: the fault would fire on that."""
    db = spawn.db
    # The run waits for "go" and suspends; its process dies while it waits (holding nothing).
    first = await suspended_on_go(spawn, reader, "suspended")
    first.kill()
    await first.killed()
    tally(crash_tally)
    # The events arrive from a client with no worker: nobody takes them yet.
    sent = [1] if site == BC else [1, 2]
    for n in sent:
        await reader.app.send(EV, "go", {"n": n})
    assert [(e.key, e.payload, e.consumed_by) for e in mailbox(db)] == [
        ("go", {"n": n}, None) for n in sent
    ]
    woken = await reader.state(EV)
    assert woken.status is RunStatus.WAITING
    assert woken.record is not None
    assert woken.record.wake_at is not None

    # The next process claims the run and dies taking the event.
    second = spawn.run("killed", "await_go", EV, "t", f"{site}@take_event:event:go=kill", **FAST)
    await second.killed()
    before = await reader.state(EV)
    events_before = mailbox(db)
    assert before.status is RunStatus.RUNNING
    assert before.record is not None
    assert before.record.epoch == 2
    if site == BC:  # the take was rolled back whole: the event waits in the mailbox
        assert before.states() == [("step_before", C)]
        assert [(e.payload, e.consumed_by) for e in events_before] == [({"n": 1}, None)]
    else:  # consumed by the checkpoint, in the same transaction
        assert before.states() == [("step_before", C), ("event:go", C)]
        assert [(e.payload, e.consumed_by) for e in events_before] == [
            ({"n": 1}, "event:go"),
            ({"n": 2}, None),
        ]
    assert bodies(tmp_path) == ["step_before"]

    last = spawn.run("recover", "await_go", EV, "t", **FAST)
    seconds = await last.wait()
    after = await reader.state(EV)
    ran_after = bodies(tmp_path)[1:]
    tally(
        crash_tally,
        lost=last.popen.returncode != 0 or after.status is not RunStatus.SUCCEEDED,
        duplicates=reruns(before, ran_after),
        recovery=seconds,
    )
    assert last.popen.returncode == 0, last.output()
    assert last.result() == go_result(1)
    check_event_run(after, 1)
    assert ran_after == ["step_after"]
    events = mailbox(db)
    # Event #1 taken exactly once (after_commit: the recorded take replayed, not taken again);
    # #2 (after_commit) still in the mailbox, unconsumed.
    assert [(e.payload, e.consumed_by) for e in events] == [
        ({"n": n}, "event:go" if n == 1 else None) for n in sent
    ]
    if site == AC:
        assert events[0] == events_before[0]  # untouched by the recovering process
    assert await reader.workers() == 0
    assert seconds < RECOVERY_BOUND, f"recovery took {seconds:.2f}s"


@pytest.mark.parametrize("site", [BC, AC], ids=short)
async def test_kill_the_sender(
    site: str, spawn: Spawner, reader: Reader, crash_tally: dict[str, int], tmp_path: Path
) -> None:
    """The process sending the event dies at the delivery's commit: before it, nothing was
    delivered and the run still waits; after it, the waiting run (in a live worker process)
    takes the event."""
    db = spawn.db
    waiter = await suspended_on_go(spawn, reader, "waiter")
    sender = spawn.send("sender", EV, "go", {"n": 1}, f"{site}@deliver_event:go=kill")
    await sender.killed()
    delivered_at = time.monotonic()
    expected = 1
    if site == BC:
        assert mailbox(db) == []
        await asyncio.sleep(0.3)  # the live worker polls every 10 ms: it would have seen one
        still = await reader.state(EV)
        assert still.status is RunStatus.WAITING
        assert still.record is not None
        assert still.record.wake_at is None
        assert still.states() == [("step_before", C)]
        assert waiter.alive(), waiter.output()
        # The run still waits for an event: one delivered now ends it.
        expected = 2
        await reader.app.send(EV, "go", {"n": expected})
        delivered_at = time.monotonic()
    await waiter.wait()
    seconds = time.monotonic() - delivered_at
    after = await reader.state(EV)
    tally(
        crash_tally,
        lost=waiter.popen.returncode != 0 or after.status is not RunStatus.SUCCEEDED,
        recovery=seconds,
    )
    assert waiter.popen.returncode == 0, waiter.output()
    assert waiter.result() == go_result(expected)
    check_event_run(after, expected)
    assert [(e.key, e.payload, e.consumed_by) for e in mailbox(db)] == [
        ("go", {"n": expected}, "event:go")
    ]
    assert bodies(tmp_path) == ["step_before", "step_after"]
    assert seconds < RECOVERY_BOUND, f"the waiting run took {seconds:.2f}s to take the event"


# -- 3. timers fire once with two worker processes on one file ----------------------------------

TICK_RUNS = 20
WORKER_CMD = [sys.executable, "-m", "tether", "worker", "wait_worker_mod:app"]
WORKER_MODULE = """
import os
from tests.crash.wait_flows import make_app
app = make_app(os.environ["CRASH_DB"], os.environ["CRASH_SIDE_DIR"])
"""
# inline_wait_max of the workers: the 0.5 s sleeps suspend the run (released, then claimed by
# whichever process gets it when due), or are held in memory by the process running the run.
TICK_MODES = {"suspended": ("0.05", 3), "held-in-memory": ("", 1)}  # (window, claims per run)
# On PostgreSQL the suspended timers: every run claimed three times by whichever of the two
# processes gets it (FOR UPDATE SKIP LOCKED), woken by NOTIFY. Left out there for time: the held
# timers (each run claimed once, as the runs of test_processes are on both backends).


@pytest.mark.parametrize(("backend", "inline", "claims"), on_backends(TICK_MODES, ["suspended"]))
async def test_timers_fire_once_with_two_worker_processes(
    inline: str, claims: int, tmp_path: Path, reader: Reader
) -> None:
    db = reader.db
    (tmp_path / "wait_worker_mod.py").write_text(WORKER_MODULE)
    from .wait_flows import make_app

    creator = make_app(db, tmp_path)  # no worker here: the runs wait as pending
    ids = [f"tick-{i:02d}" for i in range(TICK_RUNS)]
    try:
        for run_id in ids:
            await creator.start("ticker", run_id, id=run_id)
    finally:
        await creator.close()

    env = child_env(
        CRASH_DB=db,
        CRASH_SIDE_DIR=str(tmp_path),
        CRASH_INLINE_WAIT=inline,
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
    )
    logs = [tmp_path / f"worker-{i}.log" for i in range(2)]
    workers = []
    for log in logs:
        with open(log, "wb") as out:
            workers.append(
                subprocess.Popen(
                    [*WORKER_CMD, "--concurrency", str(TICK_RUNS // 2)],
                    cwd=tmp_path,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    started = time.monotonic()
    try:
        deadline = started + PROC_TIMEOUT
        while True:
            runs = {r.id: r.status for r in await reader.app.list_runs(limit=100)}
            if all(s is RunStatus.SUCCEEDED for s in runs.values()):
                break
            assert not any(s in (RunStatus.FAILED, RunStatus.CANCELLED) for s in runs.values())
            assert all(w.poll() is None for w in workers), [p.read_text() for p in logs]
            assert time.monotonic() < deadline, f"runs did not all succeed: {runs}"
            await asyncio.sleep(0.05)
        elapsed = time.monotonic() - started
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        stopping = time.monotonic()
        for worker in workers:
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        stop_seconds = time.monotonic() - stopping
    outputs = [log.read_text(errors="replace") for log in logs]
    for worker, out in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, out
        assert out.rstrip().endswith("stopped"), out
        assert "Traceback" not in out, out
        assert "database is locked" not in out, out
    assert stop_seconds < 5, f"stopping on SIGTERM took {stop_seconds:.1f}s"
    assert await reader.workers() == 0
    assert sorted(runs) == ids
    # 20 runs of two 0.5 s sleeps ran side by side, not one after another.
    assert elapsed < 10 * TICK_SECONDS * 2, elapsed

    for run_id in ids:
        state = await reader.state(run_id)
        # Each timer fired once: one completion each, each body exactly once, and the run was
        # claimed exactly once per (re)start: at creation, and when each suspended timer was due.
        assert bodies(tmp_path, run_id) == ["tick", "tock"], run_id
        assert state.states() == [("sleep", C), ("tick", C), ("sleep#2", C), ("tock", C)]
        for name in ("sleep", "sleep#2"):
            cp = state.cp(name)
            assert cp is not None
            assert cp.started_at is not None
            assert cp.finished_at is not None
            assert cp.finished_at >= cp.started_at + TICK_SECONDS, (run_id, name)
        assert state.record is not None
        assert state.record.epoch == claims, (run_id, state.record.epoch)
        assert state.record.result == json.dumps(f"tock(tick({run_id}))")
    assert len(bodies(tmp_path)) == 2 * TICK_RUNS
    # Bodies ran in the worker processes only; with the timers suspended, in both of them (a
    # released run goes to whichever process claims it when due; held waits do not count
    # against --concurrency, so with held timers one process may take every run).
    ran_by = {line.split("\t")[2] for line in read_lines(tmp_path / "pids")}
    pids = {str(w.pid) for w in workers}
    assert ran_by == pids if claims > 1 else ran_by <= pids, (ran_by, pids)


# -- 4. child runs across a crash ---------------------------------------------------------------

PARENT = "par"
CHILD = child_id(PARENT)
JOIN = "take_event:join:child_flow"  # the join takes the child's end from the mailbox
SPAWN_CP = "write_checkpoint:child:child_flow:completed"


@dataclass(frozen=True)
class ChildKill:
    faults: str
    ran: int  # child_step bodies the dead process ran
    recorded: bool  # whether the child_step completion it ran is durable
    left: list[str]  # the parent's checkpoints it left (all completed)
    child: RunStatus | None  # the child run it left (None: not created)
    races: bool = False  # on PostgreSQL, `ran` and `recorded` depend on the scheduling (below)


# At the parent's `child` checkpoint the child already runs in the same process: its step body
# ran, and its completion shares the group commit that is killed (before_commit: lost with it, so
# the body runs again in the next process: at least once, by design). PostgreSQL has no group
# commit: the child's step and the parent's checkpoint commit in their own transactions, on
# their own pooled connections, in whichever order the event loop and the pool give. At the
# parent's checkpoint the child's body may not have run yet, may have run with its completion in
# flight (lost with the process), or may have run with its completion committed already; there
# the test reads which from the side file and the database (`races`), and checks the rest
# against it.
CHILD_KILLS = {
    "create-child-before_commit": ChildKill(f"{BC}@create_run:{CHILD}=kill", 0, False, [], None),
    "create-child-after_commit": ChildKill(
        f"{AC}@create_run:{CHILD}=kill", 0, False, [], RunStatus.RUNNING
    ),
    "child-checkpoint-before_commit": ChildKill(
        f"{BC}@{SPAWN_CP}=kill", 1, False, [], RunStatus.RUNNING, races=True
    ),
    "child-checkpoint-after_commit": ChildKill(
        f"{AC}@{SPAWN_CP}=kill", 1, True, ["child:child_flow"], RunStatus.RUNNING, races=True
    ),
    "child-finish-after_commit": ChildKill(
        f"{AC}@finish_run:{CHILD}=kill", 1, True, ["child:child_flow"], RunStatus.SUCCEEDED
    ),
    "join-before_commit": ChildKill(
        f"{BC}@{JOIN}=kill", 1, True, ["child:child_flow"], RunStatus.SUCCEEDED
    ),
    "join-after_commit": ChildKill(
        f"{AC}@{JOIN}=kill",
        1,
        True,
        ["child:child_flow", "join:child_flow"],
        RunStatus.SUCCEEDED,
    ),
}


@pytest.mark.parametrize("kill", CHILD_KILLS.values(), ids=CHILD_KILLS.keys())
async def test_child_run_across_a_crash(
    kill: ChildKill,
    backend: str,
    spawn: Spawner,
    reader: Reader,
    crash_tally: dict[str, int],
    tmp_path: Path,
) -> None:
    db = spawn.db
    first = spawn.run("killed", "parent", PARENT, 3, kill.faults)
    await first.killed()
    before = await reader.state(PARENT)
    child_before = await reader.state(CHILD)
    if kill.races and backend == "postgres":
        # What the race left (see CHILD_KILLS): a body ran at most once, and a completion is
        # durable only for a body that ran.
        ran = len(bodies(tmp_path, CHILD))
        recorded = bool(child_before.checkpoints)
        assert ran <= 1
        assert ran or not recorded
        kill = dataclasses.replace(kill, ran=ran, recorded=recorded)
    assert before.status is RunStatus.RUNNING
    assert [c.name for c in before.checkpoints] == kill.left
    assert all(c.status is C for c in before.checkpoints)
    assert child_before.status is kill.child
    assert child_before.states() == ([("child_step", C)] if kill.recorded else [])
    assert bodies(tmp_path, CHILD) == ["child_step"] * kill.ran
    assert bodies(tmp_path, PARENT) == []

    last = spawn.run("recover", "parent", PARENT, 3)
    seconds = await last.wait()
    after = await reader.state(PARENT)
    child_after = await reader.state(CHILD)
    child_ran_after = bodies(tmp_path, CHILD)[kill.ran :]
    tally(
        crash_tally,
        lost=last.popen.returncode != 0 or after.status is not RunStatus.SUCCEEDED,
        duplicates=reruns(before, bodies(tmp_path, PARENT)) + reruns(child_before, child_ran_after),
        recovery=seconds,
    )
    assert last.popen.returncode == 0, first.output() + last.output()
    assert last.result() == {"child": 30, "after": 31}
    assert after.states() == [("child:child_flow", C), ("join:child_flow", C), ("parent_after", C)]
    spawned = after.cp("child:child_flow")
    assert spawned is not None
    assert json.loads(spawned.result or "null") == CHILD
    joined = after.cp("join:child_flow")
    assert joined is not None
    assert joined.result is not None
    value = json.loads(joined.result)
    assert value["key"] == f"tether:child:{CHILD}"
    assert value["value"]["status"] == "succeeded"
    assert json.loads(value["value"]["result"]) == 30

    # Exactly one child run, which ran its step once after its completion was durable (and
    # twice in all only where the kill lost an unrecorded completion).
    assert ro_query(db, "SELECT id, status FROM tether_runs WHERE parent_id = ?", PARENT) == [
        (CHILD, "succeeded")
    ]
    assert ro_query(db, "SELECT count(*) FROM tether_runs") == [(2,)]
    assert child_after.states() == [("child_step", C)]
    assert child_ran_after == ([] if kill.recorded else ["child_step"])
    assert bodies(tmp_path, CHILD) == ["child_step"] * (1 + int(kill.ran and not kill.recorded))
    assert bodies(tmp_path, PARENT) == ["parent_after"]
    # The child's end was told to the parent once, and the join took it.
    assert [(e.run_id, e.key) for e in mailbox(db)] == [(PARENT, f"tether:child:{CHILD}")]
    assert ro_query(db, "SELECT consumed_by FROM tether_events") == [("join:child_flow",)]
    assert await reader.workers() == 0
    assert seconds < RECOVERY_BOUND, f"recovery took {seconds:.2f}s"

"""Real processes killed with SIGKILL at every commit boundary of a workflow and in the middle of
every step body, on real SQLite files and on PostgreSQL (a fresh schema per test: conftest's
`db_url`); a fresh process then finishes the run by itself.

A killed process (`python -m tests.crash.proc`) either kills itself at a fault site
($TETHER_FAULTS) or is killed by the test while a step body hangs. After each death the test reads
what the dead process made durable. The last process runs without faults and must finish the run
quickly (it releases the dead worker's lease at once instead of waiting out the 15 s lease),
without running any step whose completion was recorded, and without a second effect of the
at-most-once `charge`. Body executions are counted in the `bodies` side file (flows.py), charge
effects in `effects`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import tether
from tether.serde import Serde
from tether.store.port import Checkpoint, CheckpointStatus, RunStatus

from .children import child_env
from .flows import CHECKPOINTS, STEPS, expected_result, read_lines
from .matrix import on_backends

# serial: recoveries are bounded (RECOVERY_BOUND, under the first heartbeat).
pytestmark = [pytest.mark.crash, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "crash-run"
ORDER = "order-1"
LEASE = 15.0  # the App's default lease; recovery must not wait it out
# Recovery must come from the startup check of dead local workers: well under the lease, and
# under the first heartbeat (lease / 3), whose periodic check would also find the dead worker.
RECOVERY_BOUND = 4.5
HEARTBEAT = LEASE / 3
PROC_TIMEOUT = 30.0
SITES = ["store.before_write", "store.before_commit", "store.after_commit"]
AT_MOST_ONCE = {"charge"}

# The commit boundaries of one run, in the order they happen: (id, fault label, the checkpoint
# written there and its status, or None for the run row itself).
EVENTS: list[tuple[str, str, tuple[str, CheckpointStatus] | None]] = [
    ("create_run", f"create_run:{RUN_ID}", None),
    ("fetch", "write_checkpoint:fetch:completed", ("fetch", CheckpointStatus.COMPLETED)),
    (
        "transform",
        "write_checkpoint:transform:completed",
        ("transform", CheckpointStatus.COMPLETED),
    ),
    ("uuid4", "write_checkpoint:uuid4:completed", ("uuid4", CheckpointStatus.COMPLETED)),
    ("charge:started", "write_checkpoint:charge:started", ("charge", CheckpointStatus.STARTED)),
    (
        "charge:completed",
        "write_checkpoint:charge:completed",
        ("charge", CheckpointStatus.COMPLETED),
    ),
    (
        "transform#2",
        "write_checkpoint:transform#2:completed",
        ("transform#2", CheckpointStatus.COMPLETED),
    ),
    ("notify", "write_checkpoint:notify:completed", ("notify", CheckpointStatus.COMPLETED)),
    ("finish_run", f"finish_run:{RUN_ID}", None),
]
LABEL = {event: label for event, label, _ in EVENTS}


# -- reading the database as a separate client -------------------------------------------------


@dataclass
class Durable:
    """What the database holds for the run."""

    status: RunStatus | None
    epoch: int  # how many times a worker took the run (created with an owner, or claimed)
    checkpoints: list[Checkpoint]
    workers: int

    def completed(self) -> set[str]:
        return {c.name for c in self.checkpoints if c.status is CheckpointStatus.COMPLETED}

    def states(self) -> dict[str, CheckpointStatus]:
        return {c.name: c.status for c in self.checkpoints}

    def uuid(self) -> uuid.UUID | None:
        for c in self.checkpoints:
            if c.name == "uuid4" and c.status is CheckpointStatus.COMPLETED:
                value = Serde().loads(c.result or "null")
                assert isinstance(value, uuid.UUID)
                return value
        return None


@contextlib.asynccontextmanager
async def reading(db: str) -> AsyncIterator[tether.App]:
    """An App on the database `db` to read it with, no worker started; one for the whole test,
    since closing an App on PostgreSQL takes a listener round (0.2 s)."""
    app = tether.App(db)
    try:
        await app.open()
        yield app
    finally:
        await app.close()


async def durable(app: tether.App, run_id: str = RUN_ID) -> Durable:
    """Read the run through the library (App.get -> handle.checkpoints)."""
    return (await durables(app, [run_id]))[run_id]


async def durables(app: tether.App, run_ids: list[str]) -> dict[str, Durable]:
    workers = len(await app.engine.store.list_workers())
    found = {}
    for run_id in run_ids:
        try:
            handle = await app.get(run_id)
        except tether.RunNotFound:
            found[run_id] = Durable(None, 0, [], workers)
            continue
        info = await handle.info()
        found[run_id] = Durable(info.status, info.attempt, await handle.checkpoints(), workers)
    return found


# -- worker processes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Kill:
    """How one process dies: at a fault site, or by the test while a step body hangs."""

    faults: str = ""  # $TETHER_FAULTS: the process SIGKILLs itself there
    hang: str = ""  # this step body hangs; the test SIGKILLs the process meanwhile
    after_effect: bool = False  # with hang="charge": hang after the effect, not before
    zombie: bool = False  # leave the dead process unreaped while the next one recovers

    def env(self) -> dict[str, str]:
        env = {"TETHER_FAULTS": self.faults} if self.faults else {}
        if self.hang:
            env["CRASH_HANG_IN"] = self.hang
        if self.after_effect:
            env["CRASH_HANG_AFTER_EFFECT"] = "1"
        return env


def at(site: str, event: str) -> Kill:
    return Kill(faults=f"{site}@{LABEL[event]}=kill")


def proc_state(pid: int) -> str:
    """The state letter in /proc/<pid>/stat ('Z' for a zombie), '' once reaped."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text[text.rfind(")") + 2 :].split()[0]


class Proc:
    """One worker process (`python -m tests.crash.proc`), its output kept in a log file."""

    def __init__(
        self, db: str, side: Path, name: str, env: dict[str, str], run_ids: tuple[str, ...] = ()
    ) -> None:
        self.side, self.name = side, name
        self.log = side / f"{name}.log"
        full = child_env(CRASH_SIDE_DIR=str(side), **env)
        with open(self.log, "wb") as out:
            self.started = time.monotonic()
            self.popen = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.crash.proc",
                    db,
                    str(side),
                    *(run_ids or [RUN_ID]),
                ],
                cwd=ROOT,
                env=full,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.pid = self.popen.pid

    async def wait(self, *, reap: bool = True, timeout: float = PROC_TIMEOUT) -> float:
        """Wait for the process to end (to become a zombie if not `reap`); the seconds since it
        started. Kills it and fails the test if it outlives `timeout`."""
        deadline = time.monotonic() + timeout
        while (self.popen.poll() is None) if reap else (proc_state(self.pid) not in ("Z", "")):
            if time.monotonic() > deadline:
                self.kill()
                self.popen.wait()
                pytest.fail(f"{self.name} still ran after {timeout}s:\n{self.output()}")
            await asyncio.sleep(0.005)
        return time.monotonic() - self.started

    def kill(self) -> None:
        if self.popen.returncode is None:
            os.kill(self.pid, signal.SIGKILL)

    def output(self) -> str:
        return f"--- {self.name} output:\n" + self.log.read_text(errors="replace")[-4000:]

    def result(self, prefix: str = "result") -> dict[str, object] | None:
        path = self.side / f"{prefix}-{self.pid}.json"
        return json.loads(path.read_text()) if path.exists() else None


async def run_killed(db: str, side: Path, name: str, kill: Kill) -> Proc:
    """Run a process that must die by SIGKILL as `kill` says."""
    proc = Proc(db, side, name, kill.env())
    try:
        if kill.hang:
            marker = side / f"started-{kill.hang}"
            deadline = time.monotonic() + PROC_TIMEOUT
            while not marker.exists():
                if proc.popen.poll() is not None:
                    pytest.fail(f"{name} exited before {kill.hang} hung\n{proc.output()}")
                if time.monotonic() > deadline:
                    pytest.fail(f"{kill.hang} did not start within {PROC_TIMEOUT}s")
                await asyncio.sleep(0.005)
            os.kill(proc.pid, signal.SIGKILL)  # in the middle of the step body
            marker.unlink()
        await proc.wait(reap=not kill.zombie)
    finally:
        if not kill.zombie:
            proc.kill()
            proc.popen.wait()
    if kill.zombie:
        assert proc_state(proc.pid) == "Z"
    else:
        assert proc.popen.returncode == -signal.SIGKILL, (
            f"{name} exited {proc.popen.returncode}, it was not killed\n{proc.output()}"
        )
    return proc


# -- crash, then recover ------------------------------------------------------------------------


@dataclass
class Recovery:
    before: Durable  # what the killed processes left durable
    after: Durable  # the database after the recovering process
    bodies_before: list[str]  # body executions of the killed processes
    bodies_after: list[str]  # body executions of the recovering process
    effects_before: list[str]
    effects: list[str]
    result: dict[str, object] | None
    seconds: float
    uuids: list[uuid.UUID] = field(default_factory=list)  # recorded uuid after each death


def reruns(before: Durable, ran: list[str]) -> int:
    """Step bodies in `ran` (one process) that ran although their completion was durable when
    the process started, or more than once in that process."""
    return sum(n if name in before.completed() else n - 1 for name, n in Counter(ran).items())


async def crash_and_recover(
    db: str, side: Path, kills: list[Kill], tally: dict[str, int]
) -> Recovery:
    """Run one killed process per entry of `kills`, then a process without faults; tally what
    happened (before judging it) and check that the last process exited 0."""
    async with reading(db) as reader:
        return await _crash_and_recover(reader, db, side, kills, tally)


async def _crash_and_recover(
    reader: tether.App, db: str, side: Path, kills: list[Kill], tally: dict[str, int]
) -> Recovery:
    bodies_file = side / "bodies"
    state = await durable(reader)
    uuids, dead = [], []
    for i, kill in enumerate(kills, 1):
        done = len(read_lines(bodies_file))
        dead.append(await run_killed(db, side, f"process-{i}", kill))
        new_state = await durable(reader)
        tally["crash_points"] += 1
        tally["duplicate_completions"] += reruns(state, read_lines(bodies_file)[done:])
        state = new_state
        token = state.uuid()
        if token is not None:
            uuids.append(token)
    bodies_before, effects_before = read_lines(bodies_file), read_lines(side / "effects")

    last = Proc(db, side, f"process-{len(kills) + 1}", {})
    seconds = await last.wait()
    after = await durable(reader)
    r = Recovery(
        state,
        after,
        bodies_before,
        read_lines(bodies_file)[len(bodies_before) :],
        effects_before,
        read_lines(side / "effects"),
        last.result(),
        seconds,
        uuids,
    )
    tally["lost_runs"] += int(
        last.popen.returncode != 0 or r.result is None or after.status is not RunStatus.SUCCEEDED
    )
    tally["duplicate_completions"] += reruns(state, r.bodies_after) + max(0, len(r.effects) - 1)
    tally["slowest_recovery_ms"] = max(tally["slowest_recovery_ms"], round(seconds * 1000))

    for proc, kill in zip(dead, kills, strict=True):
        if kill.zombie:  # it stayed a zombie while the others recovered its run
            assert proc_state(proc.pid) == "Z"
            proc.popen.wait()
            assert proc.popen.returncode == -signal.SIGKILL
    logs = "\n".join(p.output() for p in [*dead, last])
    assert last.popen.returncode == 0, f"the recovering process failed\n{logs}"
    return r


def check_recovered(r: Recovery, expected_bodies: Counter[str]) -> None:
    """What holds after every crash: the run finished once, with the expected result and body
    counts, without waiting out a lease, and left no worker registered."""
    assert r.seconds < RECOVERY_BOUND < HEARTBEAT, f"recovery took {r.seconds:.1f}s"
    assert r.after.status is RunStatus.SUCCEEDED
    assert [c.name for c in r.after.checkpoints] == CHECKPOINTS
    assert all(c.status is CheckpointStatus.COMPLETED for c in r.after.checkpoints)
    assert r.after.workers == 0, "a dead worker (or the last process) is still registered"

    assert r.result is not None
    token = uuid.UUID(str(r.result["uuid"]))
    assert token.version == 4
    assert r.result == expected_result(ORDER, str(token))
    assert r.after.uuid() == token
    # Once recorded, the uuid never changed: every later process replayed the recorded value.
    assert all(u == token for u in r.uuids), (r.uuids, token)

    # Recorded steps never ran again; nothing ran more than twice; exactly one charge effect.
    again = Counter(r.bodies_after)
    assert not set(again) & r.before.completed(), (
        f"recorded steps ran again: {again} after {sorted(r.before.completed())}"
    )
    assert all(n == 1 for n in again.values()), again
    total = Counter(r.bodies_before) + again
    assert max(total.values()) <= 2, total
    assert total == expected_bodies
    assert len(r.effects) == 1, r.effects
    key, _, receipt = r.effects[0].partition("\t")
    assert key.startswith("tether-")
    assert receipt == r.result["receipt"]


# -- a kill at every commit boundary ------------------------------------------------------------


@pytest.mark.parametrize("site", SITES, ids=[s.removeprefix("store.") for s in SITES])
@pytest.mark.parametrize("index", range(len(EVENTS)), ids=[e[0] for e in EVENTS])
async def test_kill_at_commit_boundary(
    index: int, site: str, db_url: str, tmp_path: Path, crash_tally: dict[str, int]
) -> None:
    event = EVENTS[index][0]
    r = await crash_and_recover(db_url, tmp_path, [at(site, event)], crash_tally)

    # The dead process left exactly the commits before the kill point, durable.
    committed = EVENTS[: index + 1 if site == "store.after_commit" else index]
    states = {cp[0]: cp[1] for _, _, cp in committed if cp is not None}
    assert r.before.states() == states
    ids = [e[0] for e in committed]
    assert r.before.status == (
        None
        if "create_run" not in ids
        else RunStatus.SUCCEEDED
        if "finish_run" in ids
        else RunStatus.RUNNING
    )
    # A body ran in the dead process iff the previous step's completion was recorded.
    in_flight = None
    if site != "store.after_commit":
        in_flight = "charge" if event == "charge:completed" else event if event in STEPS else None
    ran = [name for name in STEPS if name in r.before.completed() or name == in_flight]
    assert r.bodies_before == ran
    assert len(r.effects_before) == int("charge" in ran)

    # The step in flight at a before_* kill ran, its completion not recorded: it runs again,
    # except the at-most-once charge, whose reconcile hook finds the effect and its result.
    expected = Counter(STEPS)
    if in_flight is not None and in_flight not in AT_MOST_ONCE:
        expected[in_flight] += 1
    check_recovered(r, expected)


# -- a kill in the middle of every step body ----------------------------------------------------

HANGS = {
    "fetch": Kill(hang="fetch"),
    "transform": Kill(hang="transform"),
    "charge-before-effect": Kill(hang="charge"),
    "charge-after-effect": Kill(hang="charge", after_effect=True),
    "transform#2": Kill(hang="transform#2"),
    "notify": Kill(hang="notify"),
}


@pytest.mark.parametrize("kill", HANGS.values(), ids=HANGS.keys())
async def test_kill_in_the_middle_of_a_step(
    kill: Kill, db_url: str, tmp_path: Path, crash_tally: dict[str, int]
) -> None:
    step = kill.hang
    r = await crash_and_recover(db_url, tmp_path, [kill], crash_tally)

    position = STEPS.index(step)
    assert r.bodies_before == STEPS[: position + 1]
    assert r.before.completed() == set(CHECKPOINTS[: CHECKPOINTS.index(step)])
    assert r.before.status is RunStatus.RUNNING
    if step in AT_MOST_ONCE:
        assert r.before.states()[step] is CheckpointStatus.STARTED
    effect_happened = position > STEPS.index("charge") or kill.after_effect
    assert len(r.effects_before) == int(effect_happened)

    expected = Counter(STEPS)
    if step not in AT_MOST_ONCE or not effect_happened:
        # At least once: the interrupted body runs again. For charge that happens only when
        # reconcile found no effect; with the effect, reconcile records its result instead.
        expected[step] += 1
    check_recovered(r, expected)


# -- a kill at the worker's registration ---------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_kill_after_registering_the_worker(
    db_url: str, tmp_path: Path, crash_tally: dict[str, int]
) -> None:
    """The process dies right after its worker's registration commits, before it creates the
    run: it leaves the row of a dead worker holding no run, which the next process removes at
    its start, before it creates and finishes the run. (Killed before that commit, the process
    leaves nothing, as at create_run's before_* kills.)"""
    kill = Kill(faults="store.after_commit@register_worker:*=kill")
    r = await crash_and_recover(db_url, tmp_path, [kill], crash_tally)
    assert r.before.status is None
    assert r.before.workers == 1
    assert r.bodies_before == []
    check_recovered(r, Counter(STEPS))
    assert r.after.epoch == 1


# -- repeated crashes, crashes of the recovery itself, unreaped dead workers ---------------------

B, A = "store.before_commit", "store.after_commit"
ONCE = Counter(STEPS)
# name: (how each process dies, body executions in all, (status, epoch) the dead ones left)
CHAINS: dict[str, tuple[list[Kill], Counter[str], tuple[RunStatus, int]]] = {
    # Every process dies at the next boundary, before its commit: each step's body runs twice
    # (charge once: its started marker was not recorded the first time, reconcile finds it the
    # second), the uuid drawn once durable stays.
    "each-process-dies-before-the-next-commit": (
        [at(B, event) for event, _, _ in EVENTS],
        ONCE + Counter({"fetch": 1, "transform": 1, "transform#2": 1, "notify": 1}),
        (RunStatus.RUNNING, 8),
    ),
    # Every process dies right after making one commit: no body runs twice.
    "each-process-dies-after-one-commit": (
        [at(A, event) for event, _, _ in EVENTS],
        ONCE,
        (RunStatus.SUCCEEDED, 9),
    ),
    # Reconcile finds the effect; its recording of the result is killed; reconcile again.
    "reconcile-killed-before-recording": (
        [Kill(hang="charge", after_effect=True), at(B, "charge:completed")],
        ONCE,
        (RunStatus.RUNNING, 2),
    ),
    # No effect: the body runs again (attempt 2) and is killed before recording; reconcile.
    "charge-retry-killed-before-recording": (
        [Kill(hang="charge"), at(B, "charge:completed")],
        ONCE + Counter({"charge": 1}),
        (RunStatus.RUNNING, 2),
    ),
    # The recovering process dies while releasing the dead worker, then after releasing it,
    # then right after claiming the released run: a third process still finishes the run.
    "recovery-killed-while-releasing": (
        [at(B, "transform#2"), Kill(faults=f"{B}@release_worker:*=kill")],
        ONCE + Counter({"transform#2": 1}),
        (RunStatus.RUNNING, 1),
    ),
    "recovery-killed-after-releasing": (
        [at(B, "transform#2"), Kill(faults=f"{A}@release_worker:*=kill")],
        ONCE + Counter({"transform#2": 1}),
        (RunStatus.PENDING, 1),
    ),
    "recovery-killed-after-claiming": (
        [at(B, "transform#2"), Kill(faults=f"{A}@claim_runs=kill")],
        ONCE + Counter({"transform#2": 1}),
        (RunStatus.RUNNING, 2),
    ),
    # The dead worker is a zombie (killed, not yet reaped by its parent) while others recover.
    "dead-worker-still-a-zombie": (
        [Kill(hang="transform#2", zombie=True), Kill(hang="notify", zombie=True)],
        ONCE + Counter({"transform#2": 1, "notify": 1}),
        (RunStatus.RUNNING, 2),
    ),
}


# On PostgreSQL: the at-most-once charge killed again while it recovers, and the crashes of the
# recovery itself (the release of the dead worker's runs and the claim, with their own
# transactions there). Left out on PostgreSQL for time: the two chains of nine kills, whose every
# single kill point test_kill_at_commit_boundary tries on both backends, and the zombie chain
# (how a dead local worker is found does not depend on the backend).
CHAINS_ON_POSTGRES = [
    "reconcile-killed-before-recording",
    "charge-retry-killed-before-recording",
    "recovery-killed-while-releasing",
    "recovery-killed-after-releasing",
    "recovery-killed-after-claiming",
]


@pytest.mark.parametrize(
    ("backend", "kills", "expected", "left"), on_backends(CHAINS, CHAINS_ON_POSTGRES)
)
async def test_repeated_crashes(
    kills: list[Kill],
    expected: Counter[str],
    left: tuple[RunStatus, int],
    db_url: str,
    tmp_path: Path,
    crash_tally: dict[str, int],
) -> None:
    r = await crash_and_recover(db_url, tmp_path, kills, crash_tally)
    # The last death happened where intended (e.g. after the claim: running, one more epoch).
    assert (r.before.status, r.before.epoch) == left
    check_recovered(r, expected)
    assert r.after.epoch == left[1] + (left[0] is not RunStatus.SUCCEEDED)


# -- several runs sharing one group commit -------------------------------------------------------

RUN_IDS = tuple(f"batch-{i}" for i in range(4))
GROUP = {
    f"{event}-{site.removeprefix('store.')}": (site, event)
    for site in (B, A)
    for event in ("fetch", "charge:started", "charge:completed", "finish_run")
}
# On PostgreSQL (no group commit there, see the docstring) the kill after the first commit of
# the at-most-once charge's completion, while the other runs' transactions are in flight. Left
# out on PostgreSQL for time: the before_commit kills (the first run to get there dies before
# any run's commit of that event: the single-run kill of test_kill_at_commit_boundary, with
# three more runs), and the other events' after_commit (the same race at another commit).
GROUP_ON_POSTGRES = ["charge:completed-after_commit"]


@pytest.mark.parametrize(("backend", "site", "event"), on_backends(GROUP, GROUP_ON_POSTGRES))
async def test_kill_with_several_runs_in_one_group_commit(
    site: str, event: str, db_url: str, tmp_path: Path, crash_tally: dict[str, int]
) -> None:
    """Four runs advance in lockstep in one process; the first commit holding `event` of any run
    is killed. Each run must lose or keep its part of that commit whole, and the next process
    finishes all four.

    On SQLite the runs' checkpoints share transactions (the group commit), so the kill cuts
    through a commit of several runs. PostgreSQL has no group commit (each operation is its own
    transaction), so there the same test proves the counterpart: runs whose transactions are in
    flight side by side on several pooled connections, cut by a kill of the process, each keep
    a prefix of their history (an uncommitted transaction of a killed client is rolled back)."""
    db = db_url
    label = "finish_run:*" if event == "finish_run" else LABEL[event]
    first = Proc(db, tmp_path, "process-1", {"TETHER_FAULTS": f"{site}@{label}=kill"}, RUN_IDS)
    await first.wait()
    assert first.popen.returncode == -signal.SIGKILL, first.output()
    async with reading(db) as reader:
        before = await durables(reader, list(RUN_IDS))
        ran_before = {i: read_lines(tmp_path / f"bodies-{i}") for i in RUN_IDS}

        second = Proc(db, tmp_path, "process-2", {}, RUN_IDS)
        seconds = await second.wait()
        after = await durables(reader, list(RUN_IDS))
    ran_after = {i: read_lines(tmp_path / f"bodies-{i}")[len(ran_before[i]) :] for i in RUN_IDS}
    results = second.result("results") or {}
    effects = read_lines(tmp_path / "effects")
    crash_tally["crash_points"] += 1
    crash_tally["slowest_recovery_ms"] = max(
        crash_tally["slowest_recovery_ms"], round(seconds * 1000)
    )
    crash_tally["lost_runs"] += sum(
        after[i].status is not RunStatus.SUCCEEDED or i not in results for i in RUN_IDS
    )
    crash_tally["duplicate_completions"] += sum(
        reruns(before[i], ran_after[i]) for i in RUN_IDS
    ) + max(0, len(effects) - len(RUN_IDS))

    assert second.popen.returncode == 0, first.output() + second.output()
    assert seconds < RECOVERY_BOUND < HEARTBEAT
    # The kill hit the commit holding `event`: lost for every run, or kept (after_commit; on
    # PostgreSQL by the run whose commit it was, and by any whose COMMIT was already sent).
    key = dict((e, cp) for e, _, cp in EVENTS)[event]
    if key is None:
        kept = [i for i in RUN_IDS if before[i].status is RunStatus.SUCCEEDED]
    else:
        kept = [i for i in RUN_IDS if before[i].states().get(key[0]) is key[1]]
    assert bool(kept) == (site == A), kept

    for i in RUN_IDS:
        done = before[i].completed()
        # What each run left is a prefix of its history: no commit of a run was half kept.
        names = [c.name for c in before[i].checkpoints]
        assert names == CHECKPOINTS[: len(names)]
        assert names[: len(done)] == [n for n in CHECKPOINTS if n in done]
        # Its bodies ran for its recorded steps, plus at most the one step in flight.
        recorded = [n for n in STEPS if n in done]
        assert ran_before[i][: len(recorded)] == recorded
        assert len(ran_before[i]) - len(recorded) <= 1
        assert not set(ran_after[i]) & done, (i, ran_after[i], done)
        total = Counter(ran_before[i]) + Counter(ran_after[i])
        assert set(total) == set(STEPS)
        assert max(total.values()) <= 2, total

        assert after[i].status is RunStatus.SUCCEEDED
        assert [c.name for c in after[i].checkpoints] == CHECKPOINTS
        assert all(c.status is CheckpointStatus.COMPLETED for c in after[i].checkpoints)
        result = results[i]
        assert isinstance(result, dict)
        token = uuid.UUID(str(result["uuid"]))
        assert result == expected_result(ORDER, str(token))
        assert after[i].uuid() == token
        if before[i].uuid() is not None:
            assert before[i].uuid() == token
    # One charge effect per run: four lines, four different idempotency keys.
    assert len(effects) == len(RUN_IDS)
    assert len({line.partition("\t")[0] for line in effects}) == len(RUN_IDS)
    assert after[RUN_IDS[0]].workers == 0

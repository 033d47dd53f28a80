"""Human approvals across SIGKILL, on real SQLite files and on PostgreSQL (a fresh schema per
test): a run waiting on an approval is killed and decided while no worker runs; processes die at
every commit boundary of asking, waiting, taking the decision and acting on it; a decider dies
at its commit; two processes decide one approval at the same moment; an approval expires while
nothing runs.

The killed processes (`python -m tests.crash.approval_flows run ...`, workflow `gated` of
approval_flows.py) kill themselves at a fault site ($TETHER_FAULTS) or are killed by the test.
The test decides through a fresh `tether.App` on the same database (no worker in it), reads what
the dead process made durable, and a process without faults must finish the run. Everywhere:
one approval per run, its audit trail created once and intact (`verify_approvals`), the decision
taken once from the mailbox, and the tool call it guards (`act`) run exactly once, or never.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tether
from tether.approvals.digest import digest_key
from tether.store.keys import approval_key
from tether.store.port import CheckpointStatus, RunStatus

from .approval_flows import EXPIRY, STEP, WAIT, approval_of, expected_result, operation
from .children import child_env
from .flows import read_lines
from .matrix import on_backends
from .test_wait_crashes import RECOVERY_BOUND, Reader, State, mailbox, reruns, tally
from .test_wait_crashes import Proc as WaitProc

# serial: recoveries are bounded (RECOVERY_BOUND), which a second test process on the machine
# overruns (seen: 2.24 to 4.34 s).
pytestmark = [pytest.mark.crash, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]
PROC_TIMEOUT = 30.0
BC, AC = "store.before_commit", "store.after_commit"
C, S = CheckpointStatus.COMPLETED, CheckpointStatus.STARTED
RUN = "gate"
TAG = "v1"
AID = approval_of(RUN)
REVIEWER = "rita"
FAST = "0.1"  # the killed process's inline wait: the approval's wait suspends after 0.1 s
ASKED = [("prepare", C), (STEP, C)]  # the checkpoints of a run that asked and waits


# -- processes ----------------------------------------------------------------------------------


class Proc(WaitProc):
    """One process of tests.crash.approval_flows, its output kept in a log file (the waits'
    process otherwise: wait, killed, kill, output)."""

    def __init__(self, side: Path, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.side, self.name = side, name
        self.log = side / f"{name}.log"
        full = child_env(CRASH_SIDE_DIR=str(side), **env)
        with open(self.log, "wb") as out:
            self.wall_started = time.time()
            self.started = time.monotonic()
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "tests.crash.approval_flows", *argv],
                cwd=ROOT,
                env=full,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.pid = self.popen.pid

    def results(self) -> dict[str, Any] | None:
        """{run id: result} of a `run` process that finished."""
        path = self.side / f"result-{self.pid}.json"
        return json.loads(path.read_text()) if path.exists() else None


class Spawner:
    """Starts the test's processes; whatever still runs at the end of the test is killed."""

    def __init__(self, db: str, side: Path) -> None:
        self.db, self.side = db, side
        self.procs: list[Proc] = []

    def run(
        self, name: str, runs: dict[str, Any] | None = None, faults: str = "", inline: str = ""
    ) -> Proc:
        """A worker process that starts (or finds) the runs, {id: argument} (default: run
        `gate` of TAG), and waits for their results."""
        env = {"TETHER_FAULTS": faults} if faults else {}
        if inline:
            env["CRASH_INLINE_WAIT"] = inline
        pairs = [
            x
            for run_id, arg in (runs or {RUN: {"tag": TAG}}).items()
            for x in (run_id, json.dumps(arg))
        ]
        return self._start(name, ["run", self.db, str(self.side), *pairs], env)

    def decide(
        self,
        name: str,
        aid: str,
        option: str,
        reviewer: str,
        barrier: Path | None = None,
        faults: str = "",
    ) -> Proc:
        """A process that decides the approval (no worker in it); its outcome goes to
        `<name>.json`, after `barrier` appears if one is given."""
        argv = ["decide", self.db, aid, option, reviewer, str(self.side / f"{name}.json")]
        argv += [str(barrier)] if barrier is not None else []
        return self._start(name, argv, {"TETHER_FAULTS": faults} if faults else {})

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
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


@pytest.fixture
async def reader(db_url: str) -> AsyncIterator[Reader]:
    """A fresh App on the test's database with no worker: it reads runs and approvals, and
    decides them as a client would."""
    r = Reader(db_url)
    await r.app.open()
    yield r
    await r.app.close()


# -- what the database holds ----------------------------------------------------------------------


async def stored_status(reader: Reader, aid: str = AID) -> str | None:
    """The approval's status as stored (list_approvals shows a pending one past its expiry as
    expired), or None if it does not exist."""
    record = await reader.app.engine.store.get_approval(aid)
    return None if record is None else record.status


async def events(reader: Reader, aid: str = AID) -> list[str]:
    return [e.event for e in await reader.app.approval_history(aid)]


async def decide(reader: Reader, aid: str = AID, option: str = "approve") -> tether.Decision:
    """Decide as REVIEWER, from the test's App (no worker), with the digest the approval shows."""
    shown = await reader.app.get_approval(aid)
    return await reader.app.decide(
        aid, option, reviewer=REVIEWER, operation_digest=shown.operation_digest
    )


async def pending_approval(reader: Reader, *procs: Proc) -> tether.Approval:
    """The run's approval, once it is pending and its checkpoint is recorded (the run waits)."""

    async def check() -> tether.Approval | None:
        found = await reader.app.list_approvals(run_id=RUN)
        if not found or (await reader.checkpoint(RUN, STEP)) is None:
            return None
        return found[0]

    return await reader.until("a pending approval", check, *procs)


async def check_one_approval(reader: Reader, status: str, history: list[str]) -> None:
    """Exactly one approval for the run, with this status and audit trail (created once), its
    hash chain intact."""
    listed = await reader.app.list_approvals(status=None, run_id=RUN)
    assert [(a.id, a.status) for a in listed] == [(AID, status)]
    assert listed[0].operation_digest == tether.operation_digest(
        RUN, STEP, operation(TAG), key=await digest_key(reader.app.engine.store, 0.0)
    )
    assert await events(reader) == history
    assert await reader.app.verify_approvals() == {AID: []}


def effects(side: Path) -> list[str]:
    return read_lines(side / "effects")


def bodies(side: Path) -> list[str]:
    return read_lines(side / f"bodies-{RUN}")


# -- 1 and 2. SIGKILL around asking, waiting, taking the decision and acting on it --------------


@dataclass(frozen=True)
class Point:
    """One crash point of run `gate`: how the first process dies, when the test decides, and
    what the dead process leaves durable."""

    faults: str  # the killed process's $TETHER_FAULTS ("": the test kills it, see `kill_at`)
    # When the test decides: "dead" after the kill, with no process running; "alive" while the
    # killed process still holds the run (it dies later, acting on the decision); "recovery"
    # while the recovering process waits (nothing was asked before the kill); "before" before
    # a second process, started after a suspended first one was killed, dies taking it.
    decide: str
    left: list[tuple[str, CheckpointStatus]]  # the run's checkpoints after the kill
    approval: str | None  # the approval's stored status after the kill (None: none exists)
    status: RunStatus = RunStatus.RUNNING  # the run's status after the kill
    ran: tuple[str, ...] = ("prepare",)  # the bodies the dead processes ran
    inline: str = ""  # the killed process's inline wait ("": the library's, 2 s)
    kill_at: RunStatus | None = None  # without faults: killed once the run asked and is so


DECIDED = [*ASKED, (WAIT, C)]
ACTED = ("prepare", "act")
CREATE = f"create_approval:{AID}"
ASK = f"write_checkpoint:{STEP}:completed"
SUSPEND = f"suspend_run:{RUN}"
TAKE = f"take_event:{WAIT}"
ACT_STARTED, ACT_DONE = "write_checkpoint:act:started", "write_checkpoint:act:completed"
FINISH = f"finish_run:{RUN}"
WAITING = RunStatus.WAITING


def fault(site: str, label: str) -> str:
    return f"{site}@{label}=kill"


POINTS = {
    # Killed by the test while the approval's wait holds the run in memory (under its lease),
    # and once the wait has suspended (the run released; it holds nothing).
    "held-in-memory": Point("", "dead", ASKED, "pending", inline="30", kill_at=RunStatus.RUNNING),
    "suspended": Point("", "dead", ASKED, "pending", WAITING, inline=FAST, kill_at=WAITING),
    # Creating the approval: lost (asked anew, by the next process), or made without the run's
    # record of it (the next process finds it, already decided, and creates no second one).
    "create-before_commit": Point(fault(BC, CREATE), "recovery", [("prepare", C)], None),
    "create-after_commit": Point(fault(AC, CREATE), "dead", [("prepare", C)], "pending"),
    # The run's checkpoint of having asked.
    "checkpoint-before_commit": Point(fault(BC, ASK), "dead", [("prepare", C)], "pending"),
    "checkpoint-after_commit": Point(fault(AC, ASK), "dead", ASKED, "pending"),
    # The wait's suspension: lost (still running under the dead lease), or made.
    "suspend-before_commit": Point(fault(BC, SUSPEND), "dead", ASKED, "pending", inline=FAST),
    "suspend-after_commit": Point(
        fault(AC, SUSPEND), "dead", ASKED, "pending", WAITING, inline=FAST
    ),
    # Taking the decision from the mailbox into the wait's checkpoint.
    "take-before_commit": Point(fault(BC, TAKE), "before", ASKED, "approved"),
    "take-after_commit": Point(fault(AC, TAKE), "before", DECIDED, "approved"),
    # The tool call the approval guards (at most once, reconciled from its effect).
    "act-started-before_commit": Point(fault(BC, ACT_STARTED), "alive", DECIDED, "approved"),
    "act-started-after_commit": Point(
        fault(AC, ACT_STARTED), "alive", [*DECIDED, ("act", S)], "approved"
    ),
    "act-completed-before_commit": Point(
        fault(BC, ACT_DONE), "alive", [*DECIDED, ("act", S)], "approved", ran=ACTED
    ),
    "act-completed-after_commit": Point(
        fault(AC, ACT_DONE), "alive", [*DECIDED, ("act", C)], "approved", ran=ACTED
    ),
    # The run's end.
    "finish-before_commit": Point(
        fault(BC, FINISH), "alive", [*DECIDED, ("act", C)], "approved", ran=ACTED
    ),
    "finish-after_commit": Point(
        fault(AC, FINISH),
        "alive",
        [*DECIDED, ("act", C)],
        "approved",
        RunStatus.SUCCEEDED,
        ran=ACTED,
    ),
}
# On PostgreSQL (for time), the points where a durable record of the approval carries over the
# crash into another process: the approval created without the run's checkpoint of it, the
# suspended wait decided with no worker, the decision taken but not acted on, and the tool's
# effect made with its completion lost. Left out there: the points where nothing of the
# approval is durable yet (create/checkpoint before_commit: asked anew, as in-memory on
# SQLite), the run held under a dead lease (held-in-memory, suspend-before_commit,
# checkpoint-after_commit: recovered as test_sigkill's runs are on both backends), the take
# rolled back (take-before_commit: test_wait_crashes' event take), and the step and the run's
# end (test_sigkill's charge and finish_run points on both backends).
ON_POSTGRES = [
    "create-after_commit",
    "suspended",
    "take-after_commit",
    "act-completed-before_commit",
]


@pytest.mark.parametrize(("backend", "point"), on_backends(POINTS, ON_POSTGRES))
async def test_kill_at_the_approvals_crash_points(
    point: Point, spawn: Spawner, reader: Reader, crash_tally: dict[str, int], tmp_path: Path
) -> None:
    """Killed at one crash point of asking, waiting, taking the decision or acting on it (see
    POINTS; "held-in-memory" and "suspended": killed by the test while the run waits), decided
    by the test (with no process running wherever the approval outlived the kill), finished by
    a fresh process: approved once, the tool called once, one approval, created once."""
    db = spawn.db
    kills = 1
    if point.decide == "before":
        # The run asks and suspends; its process dies while it waits (holding nothing), and the
        # decision arrives while no worker runs; the next process dies taking it.
        waiting = spawn.run("suspended", inline=FAST)
        await reader.until_status(RUN, RunStatus.WAITING, waiting)
        waiting.kill()
        await waiting.killed()
        kills += 1
        assert (await decide(reader)).status == "approved"
    first = spawn.run("killed", faults=point.faults, inline=point.inline)
    if point.kill_at is not None:
        await pending_approval(reader, first)
        await reader.until_status(RUN, point.kill_at, first)
        first.kill()
    elif point.decide == "alive":
        await pending_approval(reader, first)
        decision = await decide(reader)
        assert (decision.status, decision.reviewer) == ("approved", REVIEWER)
    await first.killed()

    # What the dead process left.
    before = await reader.state(RUN)
    assert before.status is point.status
    assert before.states() == point.left
    assert await stored_status(reader) == point.approval
    if point.approval is not None:
        assert (await events(reader))[0] == "created"
    assert bodies(tmp_path) == list(point.ran)
    assert len(effects(tmp_path)) == ("act" in point.ran)
    if point.decide == "dead":  # decided with no worker running, from a fresh App
        listed = await reader.app.list_approvals(run_id=RUN)
        assert [(a.id, a.status) for a in listed] == [(AID, "pending")]
        assert not any(p.alive() for p in spawn.procs)  # no process runs the run
        decision = await decide(reader)
        assert (decision.status, decision.approved, decision.reviewer) == (
            "approved",
            True,
            REVIEWER,
        )
        assert [(e.key, e.consumed_by) for e in mailbox(db)] == [(approval_key(AID), None)]

    last = spawn.run("recover")
    if point.decide == "recovery":
        await pending_approval(reader, last)
        await decide(reader)
    seconds = await last.wait()
    ran_after = bodies(tmp_path)[len(point.ran) :]
    await check_finished(reader, tmp_path, last, before, ran_after, crash_tally, seconds, kills)


async def check_finished(
    reader: Reader,
    side: Path,
    last: Proc,
    before: State,
    ran_after: list[str],
    crash_tally: dict[str, int],
    seconds: float,
    kills: int = 1,
) -> None:
    """The run `gate` ended approved, its tool called once, one approval decided once."""
    after = await reader.state(RUN)
    tally(
        crash_tally,
        kills=kills,
        lost=last.popen.returncode != 0 or after.status is not RunStatus.SUCCEEDED,
        duplicates=reruns(before, ran_after) + max(0, len(effects(side)) - 1),
        recovery=seconds,
    )
    assert last.popen.returncode == 0, last.output()
    expected = expected_result(TAG, "approved", REVIEWER)
    assert last.results() == {RUN: expected}
    assert after.status is RunStatus.SUCCEEDED
    assert after.record is not None
    assert json.loads(after.record.result or "null") == expected
    assert after.states() == [*DECIDED, ("act", C)]
    # Each body once; the tool's effect once (reconciled, not repeated, when its completion
    # was lost).
    assert bodies(side) == ["prepare", "act"]
    assert len(effects(side)) == 1
    await check_one_approval(reader, "approved", ["created", "decided"])
    decided = (await reader.app.approval_history(AID))[1]
    assert (decided.actor, decided.detail["status"]) == (REVIEWER, "approved")
    # The decision reached the run once, and its wait took it.
    assert [(e.key, e.consumed_by) for e in mailbox(reader.db)] == [(approval_key(AID), WAIT)]
    assert await reader.workers() == 0
    assert seconds < RECOVERY_BOUND, f"recovery took {seconds:.2f}s"


# -- a decider killed at its commit --------------------------------------------------------------


DECIDER_SITES = {"before_commit": BC, "after_commit": AC}


@pytest.mark.parametrize(("backend", "site"), on_backends(DECIDER_SITES, ["after_commit"]))
async def test_kill_the_decider(
    site: str, spawn: Spawner, reader: Reader, crash_tally: dict[str, int], tmp_path: Path
) -> None:
    """The process deciding dies at the decision's commit while the run waits (suspended, in a
    live worker process): before it, nothing was decided or audited and the run still waits;
    after it, the decision stands and the run takes it."""
    waiter = spawn.run("waiter", inline=FAST)
    await reader.until_status(RUN, RunStatus.WAITING, waiter)
    decider = spawn.decide(
        "decider", AID, "approve", REVIEWER, faults=f"{site}@change_approval:{AID}=kill"
    )
    await decider.killed()
    decided_at = time.monotonic()
    if site == BC:
        assert await stored_status(reader) == "pending"
        assert await events(reader) == ["created"]
        assert mailbox(spawn.db) == []
        await asyncio.sleep(0.3)  # the live worker would have seen a decision by now
        still = await reader.state(RUN)
        assert (still.status, still.states()) == (RunStatus.WAITING, ASKED)
        assert waiter.alive(), waiter.output()
        await decide(reader)  # the run still waits: a decision now ends it
        decided_at = time.monotonic()
    await waiter.wait()
    seconds = time.monotonic() - decided_at
    await check_finished(
        reader, tmp_path, waiter, State(None, []), bodies(tmp_path)[1:], crash_tally, seconds
    )


# -- 3. two processes decide one approval at the same moment ------------------------------------

ROUNDS = 5


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_two_processes_decide_at_once(spawn: Spawner, reader: Reader, tmp_path: Path) -> None:
    """Two OS processes, each with its own App on the database, decide the same pending
    approval when one file appears (one approves, the other rejects): exactly one decision
    stands, the other is refused as already decided, and the run does what the winner said.
    Five approvals (five runs), each raced once."""
    runs = {f"race-{i}": {"tag": f"r{i}"} for i in range(ROUNDS)}
    worker = spawn.run("worker", runs, inline=FAST)  # the runs suspend while they wait

    async def all_pending() -> bool:
        return len(await reader.app.list_approvals(limit=100)) == ROUNDS

    await reader.until("every run's approval", all_pending, worker)
    who = {"approve": "alice", "reject": "bob"}
    deciders = {
        run_id: [
            spawn.decide(
                f"{who[option]}-{run_id}",
                approval_of(run_id),
                option,
                who[option],
                tmp_path / f"go-{run_id}",
            )
            for option in who
        ]
        for run_id in runs
    }

    async def all_ready() -> bool:
        return all(
            Path(f"{p.log.with_suffix('.json')}.ready").exists()
            for pair in deciders.values()
            for p in pair
        )

    await reader.until("every decider at its barrier", all_ready, *deciders["race-0"])
    winners: dict[str, str] = {}
    overlapped = 0
    for run_id, pair in deciders.items():
        (tmp_path / f"go-{run_id}").touch()
        for proc in pair:
            await proc.wait()
            assert proc.popen.returncode == 0, proc.output()
        outcomes = {
            p.name.partition("-")[0]: json.loads(p.log.with_suffix(".json").read_text())
            for p in pair
        }
        won = [name for name, o in outcomes.items() if "status" in o]
        lost = [name for name, o in outcomes.items() if "refused" in o]
        assert len(won) == 1, (run_id, outcomes)
        assert len(lost) == 1, (run_id, outcomes)
        assert outcomes[lost[0]]["refused"] == "already_decided", (run_id, outcomes)
        status = "approved" if won[0] == "alice" else "rejected"
        assert outcomes[won[0]]["status"] == status
        winners[run_id] = won[0]
        a, b = outcomes.values()
        overlapped += a["began"] < b["ended"] and b["began"] < a["ended"]
    await worker.wait()
    assert worker.popen.returncode == 0, worker.output()

    # Each run did what its winner decided: the tool ran once for each approval, never for a
    # rejection.
    results = worker.results()
    for run_id, winner in winners.items():
        status = "approved" if winner == "alice" else "rejected"
        tag = runs[run_id]["tag"]
        assert results is not None
        assert results[run_id] == expected_result(tag, status, winner), run_id
        ran = read_lines(tmp_path / f"bodies-{run_id}")
        assert ran == (["prepare", "act"] if status == "approved" else ["prepare"]), run_id
        aid = approval_of(run_id)
        listed = await reader.app.list_approvals(status=None, run_id=run_id)
        assert [(a.id, a.status) for a in listed] == [(aid, status)]
        history = await reader.app.approval_history(aid)
        loser = "bob" if winner == "alice" else "alice"
        assert [(e.event, e.actor) for e in history] == [
            ("created", None),
            ("decided", winner),
            ("refused", loser),
        ]
        assert history[2].detail["reason"] == "already_decided"
    approved = sum(w == "alice" for w in winners.values())
    assert len(effects(tmp_path)) == approved
    assert await reader.app.verify_approvals() == {approval_of(r): [] for r in runs}
    # Mostly the two calls ran at the same time (each started before the other ended); a
    # round where one process was scheduled late still decides once, as asserted above.
    assert overlapped >= 1, "no round had the two decisions in flight at once"


# -- 4. an approval expires while nothing runs -------------------------------------------------

EXPIRES = 2.0
# After the expiry, processes die one after another on the way to closing it: recording that
# the timer won (before and after its commit), closing the approval (the same), and recording
# the closure; then one finishes. (SQLite; on PostgreSQL the run goes straight to the last
# process: its expiry path commits the same writes in the same order.)
EXPIRY_CHAIN = [
    (f"{BC}@write_checkpoint:{WAIT}:completed=kill", [], "pending", ["created"]),
    (f"{AC}@write_checkpoint:{WAIT}:completed=kill", [WAIT], "pending", ["created"]),
    (f"{BC}@change_approval:{AID}=kill", [WAIT], "pending", ["created"]),
    (f"{AC}@change_approval:{AID}=kill", [WAIT], "expired", ["created", "expired"]),
    (
        f"{AC}@write_checkpoint:{EXPIRY}:completed=kill",
        [WAIT, EXPIRY],
        "expired",
        ["created", "expired"],
    ),
]
EXPIRY_CASES = {"decided-after-the-restart": True, "decided-while-nothing-runs": False}


@pytest.mark.parametrize(
    ("backend", "after"), on_backends(EXPIRY_CASES, ["decided-after-the-restart"])
)
async def test_expiry_across_a_restart(
    after: bool,
    backend: str,
    spawn: Spawner,
    reader: Reader,
    crash_tally: dict[str, int],
    tmp_path: Path,
) -> None:
    """A run asks with expires_in=2s and dies right after the approval exists; nothing runs
    until it is past its expiry; the next process ends the run with the decision `expired`,
    and a decision after that is refused as expired. Decided before the restart (while nothing
    runs), the decision is refused the same way and closes the approval as expired; the run
    takes that closure."""
    arg = {"tag": TAG, "expires": EXPIRES}
    first = spawn.run("killed", {RUN: arg}, faults=f"{AC}@create_approval:{AID}=kill")
    await first.killed()
    kills = 1
    shown = await reader.app.get_approval(AID)
    assert shown.status == "pending"
    created, expires_at = shown.created_at.timestamp(), shown.expires_at.timestamp()
    assert expires_at == pytest.approx(created + EXPIRES)
    await asyncio.sleep(max(0.0, expires_at + 0.2 - time.time()))
    # Past its expiry the approval shows as expired, though nothing closed it yet.
    listed = await reader.app.list_approvals(status=None, run_id=RUN)
    assert [(a.id, a.status) for a in listed] == [(AID, "expired")]
    assert await reader.app.list_approvals(run_id=RUN) == []  # not pending any more
    assert await stored_status(reader) == "pending"
    history = ["created"]
    if not after:
        with pytest.raises(tether.ApprovalRefused) as refused:
            await decide(reader)
        assert refused.value.reason == "expired"
        history = ["created", "expired", "refused"]  # closed by the refused decision
        assert await stored_status(reader) == "expired"
        assert [(e.key, e.consumed_by) for e in mailbox(spawn.db)] == [(approval_key(AID), None)]
    assert await events(reader) == history

    chain = EXPIRY_CHAIN if after and backend == "sqlite" else []
    for i, (faults, left, status, trail) in enumerate(chain):
        proc = spawn.run(f"killed-{i}", {RUN: arg}, faults=faults)
        await proc.killed()
        kills += 1
        state = await reader.state(RUN)
        assert state.status is RunStatus.RUNNING, faults
        assert state.states() == [("prepare", C), (STEP, C)] + [(n, C) for n in left], faults
        assert await stored_status(reader) == status, faults
        assert await events(reader) == trail, faults

    before = await reader.state(RUN)
    last = spawn.run("recover", {RUN: arg})
    seconds = await last.wait()
    after_state = await reader.state(RUN)
    tally(
        crash_tally,
        kills=kills,
        lost=last.popen.returncode != 0 or after_state.status is not RunStatus.SUCCEEDED,
        duplicates=reruns(before, bodies(tmp_path)[1:]),
        recovery=seconds,
    )
    assert last.popen.returncode == 0, last.output()
    expected = expected_result(TAG, "expired", None)
    assert last.results() == {RUN: expected}
    assert after_state.status is RunStatus.SUCCEEDED
    # The timer won (or, decided while nothing ran, the closure the refused decision sent).
    closing = [(WAIT, C), (EXPIRY, C)] if after else [(WAIT, C)]
    assert after_state.states() == [("prepare", C), (STEP, C), *closing]
    taken = after_state.cp(WAIT)
    assert taken is not None
    assert taken.result is not None
    won = json.loads(taken.result)["key"]
    assert won == ("tether:timer:expiry" if after else approval_key(AID))
    assert bodies(tmp_path) == ["prepare"]  # the tool never ran
    assert effects(tmp_path) == []
    # A closure is sent to the run only when someone else closed the approval (a refused
    # decision); its wait took it. A run that closes its approval itself sends itself nothing.
    assert [(e.key, e.consumed_by) for e in mailbox(spawn.db)] == (
        [] if after else [(approval_key(AID), WAIT)]
    )
    assert await stored_status(reader) == "expired"
    if after:
        assert await events(reader) == ["created", "expired"]  # closed once, by the run
        with pytest.raises(tether.ApprovalRefused) as refused:
            await decide(reader)
        assert refused.value.reason == "expired"
    await check_one_approval(reader, "expired", ["created", "expired", "refused"])
    entries = await reader.app.approval_history(AID)
    assert entries[1].actor is None
    assert (entries[2].actor, entries[2].detail["reason"]) == (REVIEWER, "expired")
    assert await reader.workers() == 0
    assert seconds < RECOVERY_BOUND, f"recovery took {seconds:.2f}s"

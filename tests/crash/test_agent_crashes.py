"""An agent run across SIGKILL, on real SQLite files and on PostgreSQL (a fresh schema per test):
the worker process dies at every commit boundary of the run (each model step and its streamed
tokens, each tool step, the parallel tool calls, the approval's create, checkpoint, suspension
and take, the guarded tool, the run's end), in the middle of a tool body and in the middle of a
model call; the approval is decided by the test (while no worker runs wherever the approval
outlived the kill); a fresh process finishes the run.

The killed process (`python -m tests.crash.agent_flows run ...`, workflow `helper` of
agent_flows.py) kills itself at a fault site ($TETHER_FAULTS, exact labels) or is killed by the
test while a body hangs or the run waits. The test reads what the dead process made durable,
then checks, exactly: the run's answer; every model call and tool body ran once in all, except
the ones the dead process ran without their completion becoming durable, which ran once more
(so at most twice); the guarded tool only after the decision; one approval, created once, its
audit chain intact; the checkpoints in order, each once; and the "tokens" stream, read from
offset 0 with its resets applied, holds each model step's text once (nothing of a killed attempt
survives), and read from any offset is the suffix of the whole.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tether
from tether.approvals.digest import digest_key
from tether.store.keys import approval_key
from tether.store.port import CheckpointStatus, RunStatus
from tether.store.port.streams import StreamEntry, StreamKind
from tether.store.rules import unretracted

from .agent_flows import (
    CHECKPOINTS,
    EXPECTED,
    GUARDED,
    MODEL,
    STEP,
    STREAM,
    TEXTS,
    TOOLS,
    WAIT,
    approval_of,
    operation,
    read_bodies,
    words,
)
from .backends import ro_query
from .children import child_env
from .matrix import on_backends
from .test_wait_crashes import RECOVERY_BOUND, Reader, State, mailbox, reruns, tally
from .test_wait_crashes import Proc as WaitProc

# serial: recoveries are bounded (RECOVERY_BOUND), as in test_wait_crashes.py.
pytestmark = [pytest.mark.crash, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]
BC, AC = "store.before_commit", "store.after_commit"
C = CheckpointStatus.COMPLETED
RUN = "helper-1"
AID = approval_of(RUN)
REVIEWER = "rita"
FAST = "0.1"  # the killed process's inline wait: the approval's wait suspends after 0.1 s
BODIES = set(MODEL) | set(TOOLS)  # the checkpoints that are a body execution


# -- processes ----------------------------------------------------------------------------------


class Proc(WaitProc):
    """One process of tests.crash.agent_flows running run RUN, its output kept in a log file."""

    def __init__(self, db: str, side: Path, name: str, env: dict[str, str]) -> None:
        self.side, self.name = side, name
        self.log = side / f"{name}.log"
        full = child_env(CRASH_SIDE_DIR=str(side), **env)
        with open(self.log, "wb") as out:
            self.wall_started = time.time()
            self.started = time.monotonic()
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "tests.crash.agent_flows", "run", db, str(side), RUN],
                cwd=ROOT,
                env=full,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.pid = self.popen.pid

    def results(self) -> dict[str, Any] | None:
        path = self.side / f"result-{self.pid}.json"
        return json.loads(path.read_text()) if path.exists() else None


class Spawner:
    """Starts the test's processes; whatever still runs at the end of the test is killed."""

    def __init__(self, db: str, side: Path) -> None:
        self.db, self.side = db, side
        self.procs: list[Proc] = []

    def run(self, name: str, faults: str = "", hang: str = "", inline: str = "") -> Proc:
        env = {"TETHER_FAULTS": faults} if faults else {}
        if hang:
            env["CRASH_HANG_IN"] = hang
        if inline:
            env["CRASH_INLINE_WAIT"] = inline
        proc = Proc(self.db, self.side, name, env)
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
    """A fresh App on the test's database with no worker: it reads, and decides approvals."""
    r = Reader(db_url)
    await r.app.open()
    yield r
    await r.app.close()


# -- what the database holds ----------------------------------------------------------------------


async def decide(reader: Reader) -> tether.Decision:
    """Approve as REVIEWER, from the test's App (no worker), with the digest the approval shows."""
    shown = await reader.app.get_approval(AID)
    decision = await reader.app.decide(
        AID, "approve", reviewer=REVIEWER, operation_digest=shown.operation_digest
    )
    assert (decision.status, decision.approved, decision.reviewer) == ("approved", True, REVIEWER)
    return decision


async def pending_approval(reader: Reader, *procs: Proc) -> tether.Approval:
    """The run's approval, once it is pending and its checkpoint is recorded (the run waits)."""

    async def check() -> tether.Approval | None:
        found = await reader.app.list_approvals(run_id=RUN)
        if not found or (await reader.checkpoint(RUN, STEP)) is None:
            return None
        return found[0]

    return await reader.until("a pending approval", check, *procs)


async def stored_status(reader: Reader) -> str | None:
    record = await reader.app.engine.store.get_approval(AID)
    return None if record is None else record.status


async def entries(reader: Reader) -> list[StreamEntry]:
    """The whole "tokens" stream as stored (with each entry's writer)."""
    return await reader.app.engine.store.read_stream(RUN, STREAM, 0, 10_000)


def live_text(found: list[StreamEntry]) -> dict[str, str]:
    """{writer: the text of its chunks no reset retracts}, for the writers that have some."""
    live = set(unretracted(found))
    text: dict[str, str] = {}
    for e in found:
        if e.offset in live:
            text[e.writer] = text.get(e.writer, "") + json.loads(e.data)
    return text


def bodies(side: Path) -> list[str]:
    return [name for name, _ in read_bodies(side)]


# -- the crash points -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One crash point of the run: how the first process dies, when the test decides, and what
    the dead process leaves durable."""

    # When the test approves: "recovery" while the recovering process waits (the approval did
    # not outlive the kill); "dead" after the kill, while no process runs; "alive" while the
    # killed process waits (it dies later); "before" after a first process, suspended waiting,
    # was killed (no process runs then), and before the process that dies at `faults`.
    decide: str
    left: tuple[str, ...]  # the run's checkpoints after the kill (all completed), in order
    faults: str = ""  # the killed process's $TETHER_FAULTS ("": the test kills it)
    hang: str = ""  # this body hangs, and the test kills the process then
    inflight: tuple[str, ...] = ()  # bodies that ran in the dead process, their outcome lost
    # A parallel tool call whose checkpoint may or may not be durable at the kill (it may share
    # the transaction of its sibling's, or commit before): not in `left` nor `inflight`.
    maybe: str = ""
    partial: str = ""  # the model step whose attempt's chunks are durable and not retracted
    approval: str | None = None  # the approval's stored status after the kill (None: none)
    status: RunStatus = RunStatus.RUNNING  # the run's status after the kill
    inline: str = ""  # the killed process's inline wait ("": the library's, 2 s)
    kill_at: RunStatus | None = None  # without faults nor hang: killed once the run waits so


def upto(name: str) -> tuple[str, ...]:
    """The checkpoints of a run up to `name`, included."""
    return tuple(CHECKPOINTS[: CHECKPOINTS.index(name) + 1])


def before(name: str) -> tuple[str, ...]:
    return tuple(CHECKPOINTS[: CHECKPOINTS.index(name)])


def fault(site: str, label: str) -> str:
    return f"{site}@{label}=kill"


def done(name: str) -> str:
    return f"write_checkpoint:{name}:completed"


APPEND = f"append_stream:{STREAM}"  # a process's first: its first model call's tokens
SIBLING = {"metrics": "logs", "logs": "metrics"}
ALL = tuple(CHECKPOINTS)


def step_points(
    name: str, decide: str = "recovery", approval: str | None = None
) -> dict[str, Point]:
    """A model or tool step killed at the commit of its completion: before it (the body ran, its
    outcome is lost; a model call's tokens are durable, not yet retracted), and after it."""
    model = name in MODEL
    return {
        f"{name}-before_commit": Point(
            decide,
            tuple(n for n in before(name) if n != SIBLING.get(name)),
            fault(BC, done(name)),
            inflight=(name,),
            maybe=SIBLING.get(name, ""),
            partial=name if model else "",
            approval=approval,
        ),
        f"{name}-after_commit": Point(
            decide,
            tuple(n for n in upto(name) if n != SIBLING.get(name)),
            fault(AC, done(name)),
            maybe=SIBLING.get(name, ""),
            approval=approval,
        ),
    }


POINTS = {
    # The first model call's tokens: their append lost, or durable without the step's completion
    # (the next attempt retracts them).
    "stream-before_commit": Point("recovery", (), fault(BC, APPEND), inflight=(MODEL[0],)),
    "stream-after_commit": Point(
        "recovery", (), fault(AC, APPEND), inflight=(MODEL[0],), partial=MODEL[0]
    ),
    **step_points(MODEL[0]),
    **step_points("search_docs"),
    **step_points(MODEL[1]),
    # The two tool calls that run at once.
    **step_points("metrics"),
    **step_points("logs"),
    **step_points(MODEL[2]),
    # Killed by the test in the middle of a model call (half its tokens durable), and in the
    # middle of a tool body while the other tool call of the turn has completed.
    "agent.model#2-mid-call": Point(
        "recovery", upto("search_docs"), hang=MODEL[1], inflight=(MODEL[1],), partial=MODEL[1]
    ),
    "metrics-mid-body": Point(
        "recovery", (*upto(MODEL[1]), "logs"), hang="metrics", inflight=("metrics",)
    ),
    # Asking: the approval lost (asked anew), or made without the run's record of it (the next
    # process finds it, decided meanwhile, and makes no second one).
    "create-before_commit": Point("recovery", upto(MODEL[2]), fault(BC, f"create_approval:{AID}")),
    "create-after_commit": Point(
        "dead", upto(MODEL[2]), fault(AC, f"create_approval:{AID}"), approval="pending"
    ),
    "checkpoint-before_commit": Point(
        "dead", upto(MODEL[2]), fault(BC, done(STEP)), approval="pending"
    ),
    "checkpoint-after_commit": Point("dead", upto(STEP), fault(AC, done(STEP)), approval="pending"),
    # Waiting: killed by the test while the wait holds the run in memory (under its lease), and
    # once it suspended; killed at the suspension's commit (lost, or made).
    "held-in-memory": Point(
        "dead", upto(STEP), approval="pending", inline="30", kill_at=RunStatus.RUNNING
    ),
    "suspended": Point(
        "dead",
        upto(STEP),
        approval="pending",
        status=RunStatus.WAITING,
        inline=FAST,
        kill_at=RunStatus.WAITING,
    ),
    "suspend-before_commit": Point(
        "dead", upto(STEP), fault(BC, f"suspend_run:{RUN}"), approval="pending", inline=FAST
    ),
    "suspend-after_commit": Point(
        "dead",
        upto(STEP),
        fault(AC, f"suspend_run:{RUN}"),
        approval="pending",
        status=RunStatus.WAITING,
        inline=FAST,
    ),
    # Taking the decision from the mailbox into the wait's checkpoint.
    "take-before_commit": Point(
        "alive", upto(STEP), fault(BC, f"take_event:{WAIT}"), approval="approved"
    ),
    "take-after_commit": Point(
        "alive", upto(WAIT), fault(AC, f"take_event:{WAIT}"), approval="approved"
    ),
    # The guarded tool, and the last model call (its tokens: the first append of a process that
    # starts after the decision).
    **step_points(GUARDED, "alive", "approved"),
    "restart-mid-body": Point(
        "alive", upto(WAIT), hang=GUARDED, inflight=(GUARDED,), approval="approved"
    ),
    **step_points(MODEL[3], "alive", "approved"),
    "agent.model#4-mid-call": Point(
        "alive",
        upto(GUARDED),
        hang=MODEL[3],
        inflight=(MODEL[3],),
        partial=MODEL[3],
        approval="approved",
    ),
    "final-stream-before_commit": Point(
        "before", upto(GUARDED), fault(BC, APPEND), inflight=(MODEL[3],), approval="approved"
    ),
    "final-stream-after_commit": Point(
        "before",
        upto(GUARDED),
        fault(AC, APPEND),
        inflight=(MODEL[3],),
        partial=MODEL[3],
        approval="approved",
    ),
    # The run's end.
    "finish-before_commit": Point(
        "alive", ALL, fault(BC, f"finish_run:{RUN}"), approval="approved"
    ),
    "finish-after_commit": Point(
        "alive",
        ALL,
        fault(AC, f"finish_run:{RUN}"),
        approval="approved",
        status=RunStatus.SUCCEEDED,
    ),
}
# On PostgreSQL (for time), the points where something the dead process wrote carries over into
# the next one and must be taken as it is: a model call's tokens durable without its completion
# (retracted by the next attempt), a tool call's completion durable beside its sibling killed
# mid-body, the approval made without the run's record of it and decided while nothing runs, a
# suspended wait decided while nothing runs, the decision taken but not acted on, the final
# answer's tokens durable in a process that replayed the rest. The other points commit the same
# writes through the same store methods, which test_sigkill and test_approval_crashes kill on
# both backends.
ON_POSTGRES = [
    "stream-after_commit",
    "metrics-mid-body",
    "create-after_commit",
    "suspended",
    "take-after_commit",
    "final-stream-after_commit",
]


@pytest.mark.parametrize(("backend", "point"), on_backends(POINTS, ON_POSTGRES))
async def test_kill_the_agent_at_every_commit_boundary(
    point: Point, spawn: Spawner, reader: Reader, crash_tally: dict[str, int], tmp_path: Path
) -> None:
    """Killed at one crash point of the agent run (see POINTS), decided by the test, finished by
    a fresh process: the same answer, each body once (once more where the dead process lost its
    outcome), the guarded tool after the decision, one approval, and the tokens streamed once."""
    kills = 1
    if point.decide == "before":
        waiting = spawn.run("suspended", inline=FAST)
        await reader.until_status(RUN, RunStatus.WAITING, waiting)
        waiting.kill()
        await waiting.killed()
        kills += 1
        await decide(reader)
    first = spawn.run("killed", point.faults, point.hang, point.inline)
    if point.decide == "alive":
        await pending_approval(reader, first)
        await decide(reader)
    if point.kill_at is not None:
        await pending_approval(reader, first)
        await reader.until_status(RUN, point.kill_at, first)
        first.kill()
    elif point.hang:
        await hung(reader, point, first)
        first.kill()
    await first.killed()

    # What the dead processes left.
    state = await reader.state(RUN)
    stream = await entries(reader)
    ran = bodies(tmp_path)
    check_left(point, state, stream, ran)
    assert await stored_status(reader) == point.approval
    if point.decide == "dead":  # decided with no worker running, from a fresh App
        listed = await reader.app.list_approvals(run_id=RUN)
        assert [(a.id, a.status) for a in listed] == [(AID, "pending")]
        assert not any(p.alive() for p in spawn.procs)
        await decide(reader)
        assert [(e.key, e.consumed_by) for e in mailbox(spawn.db)] == [(approval_key(AID), None)]

    last = spawn.run("recover")
    if point.decide == "recovery":
        await pending_approval(reader, last)
        await decide(reader)
    seconds = await last.wait()
    after = await reader.state(RUN)
    ran_after = bodies(tmp_path)[len(ran) :]
    tally(
        crash_tally,
        kills=kills,
        lost=last.popen.returncode != 0 or after.status is not RunStatus.SUCCEEDED,
        duplicates=reruns(state, ran_after),
        recovery=seconds,
    )
    assert last.popen.returncode == 0, last.output()
    assert last.results() == {RUN: EXPECTED}
    await check_finished(reader, tmp_path, state, stream, ran, point)
    if point.decide != "recovery":  # else the recovery included the test's decision
        assert seconds < RECOVERY_BOUND, f"recovery took {seconds:.2f}s"


async def hung(reader: Reader, point: Point, proc: Proc) -> None:
    """Until the hanging body has begun, the run's other checkpoints of `left` are durable, and
    (in a model call) the first half of its tokens too."""
    marker = proc.side / f"started-{point.hang}"

    async def check() -> bool:
        if not marker.exists():
            return False
        if tuple(n for n, _ in (await reader.state(RUN)).states()) != point.left:
            return False
        if point.partial:
            return live_text(await entries(reader)).get(point.partial) == half_text(point.partial)
        return True

    await reader.until(f"{point.hang} hanging", check, proc)


def half_text(step: str) -> str:
    """What a model call that hangs has streamed: the first half of its words."""
    chunks = words(TEXTS[MODEL.index(step)])
    return "".join(chunks[: len(chunks) // 2])


def check_left(point: Point, state: State, stream: list[StreamEntry], ran: list[str]) -> None:
    """What the dead process made durable, and which bodies it ran."""
    assert state.status is point.status
    assert all(status is C for _, status in state.states()), state.states()
    names = [n for n, _ in state.states()]
    assert tuple(n for n in names if n != point.maybe) == point.left
    # The bodies it ran: those whose completion is durable, and those whose outcome it lost.
    count = Counter(ran)
    assert count[point.maybe] <= 1
    if point.maybe in names:
        assert count[point.maybe] == 1
    expected = Counter(n for n in (*point.left, *point.inflight) if n in BODIES)
    assert Counter({n: k for n, k in count.items() if n != point.maybe}) == expected
    # Its tokens: every completed model step's text, and the killed attempt's (none retracted
    # yet: a reset is written by the next attempt).
    live = {MODEL[k]: TEXTS[k] for k, m in enumerate(MODEL) if m in names}
    if point.partial:
        live[point.partial] = (
            half_text(point.partial) if point.hang else TEXTS[MODEL.index(point.partial)]
        )
    assert live_text(stream) == live
    assert all(e.kind is StreamKind.CHUNK for e in stream)


async def check_finished(
    reader: Reader,
    side: Path,
    state: State,
    stream: list[StreamEntry],
    ran: list[str],
    point: Point,
) -> None:
    """The run `helper` ended with the expected answer, each body run as often as it must be, one
    approval decided once, the checkpoints once each, the tokens once each."""
    after = await reader.state(RUN)
    assert after.status is RunStatus.SUCCEEDED
    assert after.record is not None
    assert json.loads(after.record.result or "null") == EXPECTED
    # The checkpoints each once, each in its first attempt, each at the position of its call
    # (the tool calls run concurrently: the order they were recorded in may differ).
    assert sorted(after.states()) == sorted((n, C) for n in CHECKPOINTS)
    rows = ro_query(
        reader.db,
        "SELECT position, name, status, attempts FROM tether_checkpoints WHERE run_id = ?",
        RUN,
    )
    assert sorted(rows, key=lambda r: int(r[0])) == [
        (str(i), n, "completed", 1) for i, n in enumerate(CHECKPOINTS)
    ]

    # Each body once in all, except those the dead process ran without a durable outcome: once
    # more (twice in all). Those completed before the kill never ran again.
    done = {n for n, _ in state.states()}
    every = read_bodies(side)
    total = Counter(n for n, _ in every)
    assert set(total) == BODIES
    before_kill = Counter(ran)
    for name in BODIES:
        again = 0 if name in done else 1
        assert total[name] == before_kill[name] + again, name
        assert total[name] == (2 if name in point.inflight else 1) or name == point.maybe, name
        assert 1 <= total[name] <= 2, name

    # One approval, created and decided once, its hash chain intact; the guarded tool ran only
    # after the decision.
    listed = await reader.app.list_approvals(status=None, run_id=RUN)
    assert [(a.id, a.status) for a in listed] == [(AID, "approved")]
    assert listed[0].operation_digest == tether.operation_digest(
        RUN, STEP, operation(), key=await digest_key(reader.app.engine.store, 0.0)
    )
    history = await reader.app.approval_history(AID)
    assert [(e.event, e.actor) for e in history] == [("created", None), ("decided", REVIEWER)]
    assert await reader.app.verify_approvals() == {AID: []}
    assert [(e.key, e.consumed_by) for e in mailbox(reader.db)] == [(approval_key(AID), WAIT)]
    decided_at = history[1].at.timestamp()
    guarded = [at for name, at in every if name == GUARDED]
    assert guarded, "the guarded tool never ran"
    assert all(at >= decided_at for at in guarded), (guarded, decided_at)

    # The tokens: the stream the dead process left, then the rest, appended; one reset, naming
    # exactly the killed attempt's chunks, if they were durable; each model step's text once.
    whole = await entries(reader)
    assert whole[: len(stream)] == stream
    assert [e.offset for e in whole] == list(range(len(whole)))
    resets = [e for e in whole if e.kind is StreamKind.RESET]
    if point.partial:
        killed = [e.offset for e in stream if e.writer == point.partial]
        assert killed
        assert [(e.writer, json.loads(e.data)) for e in resets] == [(point.partial, killed)]
    else:
        assert resets == []
    assert live_text(whole) == dict(zip(MODEL, TEXTS, strict=True))
    live = set(unretracted(whole))
    assert [e.writer for e in whole if e.offset in live] == [
        m for m, text in zip(MODEL, TEXTS, strict=True) for _ in words(text)
    ]
    # A reader from offset 0 that applies the resets sees exactly the model's text; a reader
    # from any offset k reads the suffix of that stream from k.
    read = [x async for x in reader.app.read_stream(RUN, STREAM, follow=False)]
    assert shown(read) == "".join(TEXTS)
    assert [o for o, _ in read] == list(range(len(whole)))
    for k in range(len(read) + 1):
        suffix = [x async for x in reader.app.read_stream(RUN, STREAM, k, follow=False)]
        assert suffix == read[k:], k
        assert shown(suffix) == "".join(json.loads(e.data) for e in whole[k:] if e.offset in live)
    assert await reader.workers() == 0


def shown(read: list[tuple[int, object]]) -> str:
    """The text a reader shows from these (offset, entry) pairs: chunks, minus those a reset
    retracts (resets may name chunks before where it began to read)."""
    chunks: dict[int, object] = {}
    for offset, entry in read:
        if isinstance(entry, tether.StreamReset):
            for gone in entry.offsets:
                chunks.pop(gone, None)
        else:
            chunks[offset] = entry
    return "".join(str(chunks[k]) for k in sorted(chunks))

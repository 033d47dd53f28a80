"""The random soak, model-checked: seeded random workflows (steps, flaky steps with retries,
durable sleeps, events, approvals decided by a script, child runs, streams, and branches run at
once with gather: steps, waits and children in concurrent tasks) run by two worker processes on
one database while the test kills one of them with SIGKILL every few seconds and starts it
again, or stalls it with SIGSTOP for longer than its lease and lets it go on (alive all along:
the other worker adopts its runs, and its own writes are refused), until every run has ended.
Then everything the database and the side files hold must equal what the model
(tests/faults/soak.py) computes from the specs alone: runs by status, results, step checkpoints
(one per step call, with the model's attempts), approvals decided once, events taken once, the
visible text of every stream, child runs. A step body may run more than once only where a kill
cut an execution short: between its start and the commit of its checkpoint.

The workload comes from a seed (the date, unless $TETHER_SOAK_SEED), printed on failure with the
command that replays it; the kills' moments are not replayed exactly (they depend on timing). CI
runs a bounded soak ($TETHER_SOAK_RUNS=40 runs started over $TETHER_SOAK_SECONDS=20 s, about 25
s in all, 5-7 kills) on SQLite, and a smaller one on PostgreSQL; `make soak` runs a long one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from tests.crash.backends import drop_schema, ro_query
from tests.crash.children import child_env
from tests.faults import figures
from tests.postgres_server import with_schema

import tether

from .soak import (
    LEASE,
    REVIEWER,
    STREAM,
    WORKFLOW,
    Expected,
    event_payload,
    expect,
    generate,
    make_app,
)

ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("TETHER_SOAK_SEED") or date.today().strftime("%Y%m%d"))
RUNS = int(os.environ.get("TETHER_SOAK_RUNS") or 40)
SECONDS = float(os.environ.get("TETHER_SOAK_SECONDS") or 20)  # runs start over this window
FINISH = 60.0  # after the window: the time every run has to end
STUCK = 10.0  # runs asleep this long on an event they were sent are lost wake-ups: stop there
KILL_EVERY = (2.5, 4.5)  # seconds between kills, drawn from the seed (shorter in short soaks)
MIN_KILLS = 3
TARGETED = 0.7  # the share of kills aimed at a worker with a step body in flight
STALLS = 0.3  # the share of blows that stall (SIGSTOP, then SIGCONT) instead of killing
STALL = LEASE + 1.5  # seconds a stalled worker stays stopped: past its lease
SIZES = {"sqlite": (RUNS, SECONDS), "postgres": (max(RUNS // 3, 8), max(SECONDS * 0.6, 10))}


# The soak found a lost wake-up on PostgreSQL (suspend_run's UPDATE looked for events with the
# snapshot its statement began with); fixed by locking the run's row first (lock_run). A run
# asleep on an event it was sent is reported as such in the failure message.
Key = tuple[str, str, int]  # (run id, step checkpoint name, attempt)


def replay_hint(backend: str) -> str:
    return (
        f"soak seed {SEED}; replay its workload with: TETHER_SOAK_SEED={SEED} "
        f"TETHER_SOAK_RUNS={RUNS} TETHER_SOAK_SECONDS={SECONDS:g} "
        f".venv/bin/pytest tests/faults/test_soak.py -k {backend}"
    )


# -- the worker processes ---------------------------------------------------------------------


def _resume(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # killed meanwhile
        os.kill(pid, signal.SIGCONT)


class Workers:
    """Two worker processes (tests.faults.soak worker) on one database, killed and restarted."""

    def __init__(self, db: str, side: Path) -> None:
        self.db, self.side = db, side
        self.logs: list[Path] = []
        self.log: dict[int, Path] = {}  # pid -> its log
        self.kills: dict[int, float] = {}  # pid -> time (time.time()) just before its SIGKILL
        # pid -> times (time.time()) just before its SIGSTOPs: each cut its executions short.
        self.stalls: dict[int, list[float]] = {}
        self.thaw_at: dict[int, float] = {}  # pid of a stopped worker -> when it goes on
        self.mid_body = 0  # kills and stalls that found a step body of the process in flight
        self.procs = [self._spawn(), self._spawn()]

    def _spawn(self) -> subprocess.Popen[bytes]:
        log = self.side / f"worker-{len(self.logs)}.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.soak", "worker", self.db, str(self.side)],
                cwd=ROOT, env=child_env(), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.log[proc.pid] = log
        return proc

    def in_flight(self, slot: int) -> int:
        """Step bodies the worker in `slot` has started and not ended."""
        pid = self.procs[slot].pid
        records, _ = read_bodies(self.side, only_pid=pid)
        return sum(1 if r["e"] == "start" else -1 for r in records)

    def kill(self, slot: int) -> None:
        proc = self.procs[slot]
        self.mid_body += self.in_flight(slot) > 0
        self.kills[proc.pid] = time.time()
        self.thaw_at.pop(proc.pid, None)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        self.procs[slot] = self._spawn()

    def stall(self, slot: int) -> None:
        """Stop the worker (alive, its row and pid there) for longer than its lease."""
        proc = self.procs[slot]
        self.mid_body += self.in_flight(slot) > 0
        self.stalls.setdefault(proc.pid, []).append(time.time())
        os.kill(proc.pid, signal.SIGSTOP)
        self.thaw_at[proc.pid] = time.monotonic() + STALL
        # Also let it go from a thread: stopped while it held SQLite's write lock, it blocks
        # the driver's own writes (and the reads queued behind them), so the driver's loop
        # might never come back to thaw() it.
        timer = threading.Timer(STALL, _resume, (proc.pid,))
        timer.daemon = True
        timer.start()

    def thaw(self, everyone: bool = False) -> None:
        """Let the stopped workers whose stall is over go on."""
        for pid, at in list(self.thaw_at.items()):
            if everyone or time.monotonic() >= at:
                os.kill(pid, signal.SIGCONT)
                del self.thaw_at[pid]

    def stopped(self, slot: int) -> bool:
        return self.procs[slot].pid in self.thaw_at

    def cuts(self) -> dict[int, list[float]]:
        """pid -> the times its executions were cut short: its stalls, then its kill."""
        out = {pid: list(times) for pid, times in self.stalls.items()}
        for pid, at in self.kills.items():
            out.setdefault(pid, []).append(at)
        return out

    def died(self) -> str | None:
        """What a worker that exited by itself said (none should)."""
        for proc in self.procs:
            if proc.poll() is not None:
                return (
                    f"worker {proc.pid} exited with {proc.returncode}: {tail(self.log[proc.pid])}"
                )
        return None

    def stop(self) -> list[int]:
        self.thaw(everyone=True)
        for proc in self.procs:
            # A worker respawned just now may not handle SIGTERM yet (still starting Python):
            # told to stop only once it can, so that its exit code says how it stopped.
            deadline = time.monotonic() + 30
            ready = self.side / f"ready-{proc.pid}"
            while proc.poll() is None and not ready.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=30))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        return codes


def tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


# -- the side files ---------------------------------------------------------------------------


def read_bodies(side: Path, only_pid: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """The step bodies' notes from every process (or one), and how many lines were torn (a
    process killed in the middle of its append: only its last line may be)."""
    records, torn = [], 0
    pattern = "bodies-*.jsonl" if only_pid is None else f"bodies-{only_pid}.jsonl"
    for path in sorted(side.glob(pattern)):
        text = path.read_text(encoding="utf-8")
        lines = text.split("\n")
        if lines[-1]:  # no newline at the end: the last append was cut short
            torn += 1
        records += [json.loads(line) for line in lines[:-1]]
    return records, torn


@dataclass
class Execution:
    pid: int
    start: float
    end: float | None = None
    outcome: str | None = None


def check_bodies(
    records: list[dict[str, Any]], cuts: dict[int, list[float]], expected: dict[Key, str]
) -> tuple[list[str], Counter[str]]:
    """Problems with the step bodies' executions, and counts: every attempt the model makes
    ran, and none other; an attempt ran again only after a kill or a stall cut short the
    process that ran it before, after that execution began (cuts: pid -> times of its SIGKILL
    and SIGSTOPs); the last execution of each attempt ended as the model says."""
    problems: list[str] = []
    runs: dict[Key, dict[int, Execution]] = {}
    for r in records:
        key, pid = (r["run"], r["step"], r["attempt"]), r["pid"]
        found = runs.setdefault(key, {}).get(pid)
        if r["e"] == "start":
            if found is not None:
                problems.append(f"{key}: started twice in process {pid}")
            runs[key][pid] = Execution(pid, r["t"])
        elif found is None or found.end is not None:
            problems.append(f"{key}: an end in process {pid} without a start before it")
        else:
            found.end, found.outcome = r["t"], r["outcome"]
    counts: Counter[str] = Counter()
    for key in sorted(set(runs) | set(expected)):
        executions = sorted(runs.get(key, {}).values(), key=lambda e: e.start)
        if key not in expected:
            problems.append(f"{key}: ran {len(executions)} time(s), but the model never asks")
            continue
        if not executions:
            problems.append(f"{key}: the model asks for it, but it never ran")
            continue
        counts["attempts"] += 1
        counts["executions"] += len(executions)
        for earlier, later in pairwise(executions):
            times = [c for c in cuts.get(earlier.pid, []) if earlier.start <= c < later.start]
            killed = times[0] if times else None
            if killed is None:
                problems.append(
                    f"{key}: ran again in process {later.pid} at {later.start:.3f}, but process "
                    f"{earlier.pid} (started it at {earlier.start:.3f}, cut at "
                    f"{cuts.get(earlier.pid)}) was not cut short by a kill before that"
                )
            elif earlier.end is None or earlier.end > killed:
                counts["re-executed: killed mid-body"] += 1
            else:
                counts["re-executed: killed after the body, before its checkpoint"] += 1
                gap = killed - earlier.end
                counts["longest body end -> kill gap (ms)"] = max(
                    counts["longest body end -> kill gap (ms)"], round(gap * 1000)
                )
        last = executions[-1]
        if last.outcome != expected[key]:
            problems.append(
                f"{key}: its last execution (process {last.pid}) ended {last.outcome!r}, "
                f"the model says {expected[key]!r}"
            )
    return problems, counts


# -- the driver -------------------------------------------------------------------------------


async def drive(
    app: tether.App, db: str, specs: list[dict[str, Any]], models: dict[str, Expected],
    workers: Workers, window: float, hint: str,
) -> dict[str, tether.RunStatus]:  # fmt: skip
    """Start the runs, send their events and decide their approvals as the script says, kill a
    worker every few seconds, until every run of the model has ended (or the time is up).
    Returns the final status of every run in the database."""
    rng = random.Random(SEED ^ 0x5EED)
    family = {e.id for m in models.values() for e in m.family()}
    t0 = time.monotonic()
    started: dict[str, float] = {}
    sent: set[tuple[str, str]] = set()
    seen: dict[str, float] = {}  # approval id -> when the driver first saw it pending
    decided: set[str] = set()
    every = (KILL_EVERY[0], max(KILL_EVERY[0], min(KILL_EVERY[1], window / (MIN_KILLS + 0.5))))
    next_kill, postponed = t0 + rng.uniform(*every), 0.0
    deadline = t0 + window + FINISH
    next_look, stuck_since = t0, None
    statuses: dict[str, tether.RunStatus] = {}
    while time.monotonic() < deadline:
        now = time.monotonic()
        for spec in specs:
            if spec["id"] not in started and now - t0 >= spec["start_after"]:
                await app.start(WORKFLOW, {"ops": spec["ops"]}, id=spec["id"])
                started[spec["id"]] = now
        for run_id, at in started.items():
            for key, after in models[run_id].events.items():
                if (run_id, key) not in sent and now - at >= after:
                    await app.send(run_id, key, event_payload(run_id, key))
                    sent.add((run_id, key))
        for ap in await app.list_approvals("pending", limit=10_000):
            script = models[ap.run_id].approvals.get(ap.operation["label"])
            assert script is not None, f"an approval the model never asks for: {ap}; {hint}"
            choice, after = script
            seen.setdefault(ap.id, now)
            if ap.id not in decided and now - seen[ap.id] >= after:
                await app.decide(ap.id, choice, reviewer=REVIEWER,
                                 operation_digest=ap.operation_digest)  # fmt: skip
                decided.add(ap.id)
        statuses = {r.id: r.status for r in await app.list_runs(limit=100_000)}
        left = [i for i in family if not statuses.get(i, tether.RunStatus.PENDING).terminal]
        if len(started) == len(specs) and not left:
            break
        if len(started) == len(specs) and now >= next_look:  # stuck for good: stop waiting
            next_look = now + 1.0
            stuck_since = (stuck_since or now) if await lost_wakeups(app, db, left) else None
            if stuck_since is not None and now - stuck_since >= STUCK:
                break
        died = workers.died()
        assert died is None, f"{died}; {hint}"
        workers.thaw()
        if now >= next_kill:
            busy = [-1 if workers.stopped(s) else workers.in_flight(s) for s in (0, 1)]
            if rng.random() >= TARGETED or max(busy) > 0 or postponed >= 1.0:
                slot = busy.index(max(busy)) if max(busy) > 0 else rng.randrange(2)
                if rng.random() < STALLS and not any(map(workers.stopped, (0, 1))):
                    workers.stall(slot)
                else:
                    workers.kill(slot)
                next_kill, postponed = now + rng.uniform(*every), 0.0
            else:  # wait a little for a body in flight to kill
                next_kill, postponed = now + 0.05, postponed + 0.05
        await asyncio.sleep(0.05)
    return statuses


# -- what the database holds ------------------------------------------------------------------


def view(e: Expected) -> dict[str, Any]:
    """The model of a run, in the shape `observe` reads runs in."""
    return {
        "status": e.status,
        "result": e.result,
        "steps": e.steps,
        "stream": e.stream,
        "approvals": {
            label: ("approved" if c == "approve" else "rejected")
            for label, (c, _) in e.approvals.items()
        },
        "events": sorted(e.events),
        "duplicate step checkpoints": 0,
    }


async def observe(app: tether.App, db: str) -> dict[str, dict[str, Any]]:
    """Every run in the database, in the shape of `view`."""
    runs: dict[str, dict[str, Any]] = {}
    approvals = await app.list_approvals(None, limit=100_000)
    events = ro_query(db, "SELECT run_id, key, consumed_by FROM tether_events")
    for info in await app.list_runs(limit=100_000):
        record = await app.engine.store.get_run(info.id)
        assert record is not None
        history = await app.engine.store.load_history(info.id)
        names = [c.name for c in history if c.kind == "step"]
        runs[info.id] = {
            "status": record.status.value,
            "result": None if record.result is None else json.loads(record.result),
            "steps": {c.name: (c.status.value, c.attempts) for c in history if c.kind == "step"},
            "stream": await visible(app, info.id),
            "approvals": {a.operation["label"]: a.status for a in approvals if a.run_id == info.id},
            "events": sorted(
                k
                for r, k, by in events
                if r == info.id and by is not None and not k.startswith("tether:")
            ),
            "duplicate step checkpoints": len(names) - len(set(names)),
        }
    return runs


async def visible(app: tether.App, run_id: str) -> list[str]:
    """The stream's chunks that no reset marker retracted, in order."""
    chunks: dict[int, Any] = {}
    async with contextlib.aclosing(app.read_stream(run_id, STREAM, follow=False)) as entries:
        async for offset, entry in entries:
            if isinstance(entry, tether.StreamReset):
                for gone in entry.offsets:
                    chunks.pop(gone)
            else:
                chunks[offset] = entry
    return [chunks[o] for o in sorted(chunks)]


async def lost_wakeups(app: tether.App, db: str, run_ids: list[str]) -> bool:
    """Whether every one of these unfinished runs is a lost wake-up: waiting, with an event it
    waits for delivered and untaken (or waiting for a child run that is one)."""
    asleep = set()
    for run_id in run_ids:
        record = await app.engine.store.get_run(run_id)
        rows = ro_query(db, "SELECT key FROM tether_events WHERE run_id = ? AND consumed_by IS "
                        "NULL", run_id)  # fmt: skip
        keys = set(record.wake_on) if record is not None else set()
        if record is not None and record.status is tether.RunStatus.WAITING:
            if keys & {key for (key,) in rows}:
                asleep.add(run_id)
            elif keys & {f"tether:child:{other}" for other in run_ids}:
                asleep.add(run_id)  # its child is lost
    return bool(run_ids) and asleep == set(run_ids)


async def diagnose(app: tether.App, db: str, run_ids: list[str], workers: Workers) -> str:
    """What the database holds of these runs, and what the workers logged last."""
    out = []
    for run_id in run_ids:
        record = await app.engine.store.get_run(run_id)
        history = await app.engine.store.load_history(run_id)
        mailbox = ro_query(db, "SELECT id, key, consumed_by FROM tether_events WHERE run_id = ?",
                           run_id)  # fmt: skip
        out += [f"run {run_id}: {record}",
                "  history: " + ", ".join(f"{c.name}={c.status.value}/{c.attempts}"
                                          for c in history),
                f"  mailbox: {mailbox}"]  # fmt: skip
    workers_rows = ro_query(db, "SELECT id, pid FROM tether_workers")
    out.append(f"workers: {workers_rows}; killed: {workers.kills}")
    out += [f"{log.name}:\n{tail(log, 8)}" for log in workers.logs if log.stat().st_size]
    return "\n".join(out)


def tally(runs: dict[str, dict[str, Any]]) -> Counter[str]:
    """The counters the soak compares: runs by status, step checkpoints by status and their
    attempts, approvals by status, events taken, visible stream chunks."""
    counts: Counter[str] = Counter()
    for run in runs.values():
        counts[f"runs {run['status']}"] += 1
        for status, attempts in run["steps"].values():
            counts[f"step checkpoints {status}"] += 1
            counts["step attempts"] += attempts
        for status in run["approvals"].values():
            counts[f"approvals {status}"] += 1
        counts["events taken"] += len(run["events"])
        counts["stream chunks visible"] += len(run["stream"])
    return counts


async def mailbox_and_audit(app: tether.App, db: str) -> Counter[str]:
    """Rows of the mailboxes (events sent by the driver, approval decisions, child ends) and
    of the approvals' audit trails."""
    counts: Counter[str] = Counter()
    for _, key, by in ro_query(db, "SELECT run_id, key, consumed_by FROM tether_events"):
        kind = key.split(":")[1] if key.startswith("tether:") else "event"
        counts[f"mailbox {kind} {'taken' if by is not None else 'left'}"] += 1
    for ap in await app.list_approvals(None, limit=100_000):
        for entry in await app.approval_history(ap.id):
            if entry.event == "decided":
                counts["audit: decisions"] += 1
    return counts


def expected_mailbox(models: list[Expected]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for m in models:
        counts["mailbox event taken"] += len(m.events)
        counts["mailbox approval taken"] += len(m.approvals)
        counts["mailbox child taken"] += len(m.children)
        counts["audit: decisions"] += len(m.approvals)
    return +counts


# -- the soak ---------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def soak_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(backend, URL): a SQLite file, or a schema of its own in the session's PostgreSQL."""
    if request.param == "sqlite":
        yield "sqlite", f"sqlite:///{tmp_path / 'soak.db'}"
        return
    url = with_schema(request.getfixturevalue("postgres_url"), f"t_{uuid.uuid4().hex[:12]}")
    yield "postgres", url
    with contextlib.suppress(Exception):
        drop_schema(url)


@pytest.mark.crash
@pytest.mark.serial  # kills on a schedule; a run asleep STUCK seconds on its event is lost
@pytest.mark.timeout(int(SECONDS + FINISH + 120))
async def test_random_workflows_end_as_the_model_says_while_workers_are_killed(
    soak_db: tuple[str, str], tmp_path: Path
) -> None:
    backend, db = soak_db
    runs, window = SIZES[backend]
    hint = replay_hint(backend)
    print(hint)  # shown with the output of a failed test
    specs = generate(SEED, runs, window)
    models = {s["id"]: expect(s["id"], s["ops"]) for s in specs}
    family = [e for m in models.values() for e in m.family()]
    side = tmp_path / "side"
    side.mkdir()

    app = make_app(db, side)  # the driver's: no worker in this process
    await app.open()
    try:
        began = time.monotonic()
        workers = Workers(db, side)
        try:
            statuses = await drive(app, db, specs, models, workers, window, hint)
        finally:
            codes = workers.stop()
        seconds = time.monotonic() - began
        observed = await observe(app, db)
        mailbox = await mailbox_and_audit(app, db)
        verified = await app.verify_approvals()  # {approval id: problems of its trail}
        lost = [e.id for e in family if statuses.get(e.id) != tether.RunStatus(e.status)]
        report = await diagnose(app, db, lost, workers) if lost else ""
        asleep = await lost_wakeups(app, db, lost)
    finally:
        await app.close()
    expected = {e.id: view(e) for e in family}
    wrong = {i: {"model": expected.get(i), "database": observed.get(i)}
             for i in sorted(set(expected) | set(observed))
             if expected.get(i) != observed.get(i)}  # fmt: skip
    records, torn = read_bodies(side)
    wanted = {(e.id, name, attempt): outcome
              for e in family for (name, attempt), outcome in e.bodies.items()}  # fmt: skip
    problems, counts = check_bodies(records, workers.cuts(), wanted)
    record_figures(f"soak ({backend})", family, observed, workers, counts, problems, lost, seconds)

    stuck = " (all asleep on events they were sent: lost wake-ups)" if asleep else ""
    assert lost == [], (
        f"runs not ended as the model says after {seconds:.0f} s{stuck}; {hint}\n{report}"
    )
    assert codes == [0, 0], f"the last workers' exit codes; {hint}"
    for log in workers.logs:
        errors = [ln for ln in log.read_text(errors="replace").splitlines()
                  if ln.startswith(("ERROR", "CRITICAL", "Traceback"))]  # fmt: skip
        assert errors == [], f"{log.name}: {tail(log)}; {hint}"
    assert tally(observed) == tally(expected), hint
    assert wrong == {}, hint
    assert mailbox == expected_mailbox(family), hint
    assert {aid: found for aid, found in verified.items() if found} == {}, hint
    assert len(verified) == sum(len(e.approvals) for e in family), hint
    assert problems == [], hint
    assert torn <= len(workers.kills), hint  # only a killed process's last line may be torn
    blows = len(workers.kills) + sum(map(len, workers.stalls.values()))
    assert blows >= MIN_KILLS, f"too few kills and stalls for a soak; {hint}"


def record_figures(
    name: str, family: list[Expected], observed: dict[str, dict[str, Any]], workers: Workers,
    counts: Counter[str], problems: list[str], lost: list[str], seconds: float,
) -> None:  # fmt: skip
    """The soak's figures, recorded before its asserts, so a failed soak shows them too."""
    done = sum(s == "completed" for run in observed.values() for s, _ in run["steps"].values())
    again = [counts["re-executed: killed mid-body"],
             counts["re-executed: killed after the body, before its checkpoint"]]  # fmt: skip
    figures.record(f"{name}: runs (children included)", len(family))
    figures.record(f"{name}: worker processes killed", len(workers.kills))
    figures.record(f"{name}: worker processes stalled past their lease",
                   sum(map(len, workers.stalls.values())))  # fmt: skip
    figures.record(f"{name}: kills and stalls that landed while a step body ran",
                   workers.mid_body)  # fmt: skip
    figures.record(f"{name}: step checkpoints completed", done)
    figures.record(f"{name}: step completions recorded twice",
                   sum(run["duplicate step checkpoints"] for run in observed.values()))  # fmt: skip
    figures.record(f"{name}: step bodies re-executed after a kill cut them short", sum(again))
    figures.record(f"{name}: step bodies re-executed without a kill",
                   sum("ran again" in p for p in problems))  # fmt: skip
    figures.record(f"{name}: longest gap from a re-executed body's end to its kill (ms)",
                   counts["longest body end -> kill gap (ms)"])  # fmt: skip
    figures.record(
        f"{name}: approvals decided", sum(len(r["approvals"]) for r in observed.values())
    )
    figures.record(f"{name}: events taken", sum(len(r["events"]) for r in observed.values()))
    figures.record(f"{name}: lost runs", len(lost))
    figures.record(f"{name}: seconds", round(seconds, 1))


# -- the checker itself -----------------------------------------------------------------------


def test_the_body_check_allows_a_second_execution_only_after_a_kill_cut_the_first_short() -> None:
    def note(e: str, pid: int, t: float, outcome: str | None = None) -> dict[str, Any]:
        return {"e": e, "run": "r", "step": "work", "attempt": 1, "pid": pid, "t": t,
                "outcome": outcome}  # fmt: skip

    model = {("r", "work", 1): "ok"}
    once = [note("start", 1, 1.0), note("end", 1, 1.1, "ok")]
    assert check_bodies(once, {}, model) == ([], Counter(attempts=1, executions=1))

    cut = [note("start", 1, 1.0), note("start", 2, 3.0), note("end", 2, 3.1, "ok")]
    problems, counts = check_bodies(cut, {1: [2.0]}, model)
    assert (problems, counts["re-executed: killed mid-body"]) == ([], 1)

    twice = [*once, note("start", 2, 3.0), note("end", 2, 3.1, "ok")]
    assert check_bodies(twice, {}, model)[0] == [
        "('r', 'work', 1): ran again in process 2 at 3.000, but process 1 (started it at "
        "1.000, cut at None) was not cut short by a kill before that"
    ]
    # Killed only after the second execution began: the first was not what the kill cut short.
    assert len(check_bodies(twice, {1: [3.5]}, model)[0]) == 1
    # A stall before the first execution began does not explain the second either; one while
    # it ran does, even when the stalled process ends its body after the other began.
    assert len(check_bodies(twice, {1: [0.5]}, model)[0]) == 1
    stalled = [note("start", 1, 1.0), note("start", 2, 3.0), note("end", 1, 3.2, "ok"),
               note("end", 2, 3.1, "ok")]  # fmt: skip
    problems, counts = check_bodies(stalled, {1: [1.5]}, model)
    assert (problems, counts["re-executed: killed mid-body"]) == ([], 1)
    assert check_bodies(once, {}, {("r", "work", 1): "fail"})[0] == [
        "('r', 'work', 1): its last execution (process 1) ended 'ok', the model says 'fail'"
    ]
    assert check_bodies(once, {}, {("r", "work", 2): "ok"})[0] == [
        "('r', 'work', 1): ran 1 time(s), but the model never asks",
        "('r', 'work', 2): the model asks for it, but it never ran",
    ]


def test_the_workload_and_its_model_follow_from_the_seed_alone() -> None:
    specs = generate(7, 30, 10.0)
    assert specs == generate(7, 30, 10.0)
    assert specs != generate(8, 30, 10.0)
    kinds = Counter(op["op"] for spec in specs for op in spec["ops"])
    assert set(kinds) == {"step", "flaky", "sleep", "stream", "event", "approval", "child",
                          "gather"}  # fmt: skip
    model = expect("r", [
        {"op": "flaky", "fails": 2, "ms": 1},
        {"op": "stream", "n": 2, "in": "step", "fails": 1, "ms": 1},
        {"op": "approval", "choice": "reject", "decide_after": 0,
         "then": [{"op": "step", "ms": 1}], "else": [{"op": "flaky", "fails": 1, "ms": 1}]},
        {"op": "child", "ops": [{"op": "step", "ms": 1}]},
        {"op": "event", "send_after": 0},
        {"op": "flaky", "fails": 99, "ms": 1},
        {"op": "step", "ms": 1},
    ])  # fmt: skip
    assert (model.status, model.result) == ("failed", None)
    assert model.steps == {"flaky": ("completed", 3), "emit": ("completed", 2),
                           "flaky#2": ("completed", 2), "flaky#3": ("failed", 4)}  # fmt: skip
    assert model.stream == ["1.0@2", "1.1@2"]
    assert (model.approvals, model.events) == ({"2": ("reject", 0)}, {"e4": 0})
    assert [(c.id, c.result) for c in model.children] == [("r/child:soak", ["0:ok"])]
    fan = expect("f", [
        {"op": "step", "ms": 1},
        {"op": "gather", "branches": [
            [{"op": "step", "ms": 1}, {"op": "child", "ops": [{"op": "step", "ms": 1}]}],
            [{"op": "flaky", "fails": 1, "ms": 1}, {"op": "step", "ms": 1},
             {"op": "event", "send_after": 0}],
        ]},
        {"op": "gather", "branches": [[{"op": "step", "ms": 1}], [{"op": "sleep", "ms": 1}]]},
    ])  # fmt: skip
    assert fan.steps == {"work": ("completed", 1), "work@0": ("completed", 1),
                         "flaky@1": ("completed", 2), "work@1": ("completed", 1),
                         "work@2": ("completed", 1)}  # fmt: skip
    assert [c.id for c in fan.children] == ["f/child:soak@0"]
    assert fan.result == ["0:ok", [["1.0.0:ok", ["0:ok"]], ["1.1.0:ok@2", "1.1.1:ok", "f/e1.1.2"]],
                          [["2.0.0:ok"], [None]]]  # fmt: skip
    assert fan.events == {"e1.1.2": 0}

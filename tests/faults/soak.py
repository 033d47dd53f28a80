"""The random soak's workload, its model, and its worker process (tests/faults/test_soak.py).

`generate(seed, runs, window)` builds run specs, plain JSON: a list of operations per run, each
one of
    {"op": "step", "ms": M}                     a step whose body takes M ms
    {"op": "flaky", "fails": F, "ms": M}        a step whose attempts 1..F raise (then retried);
                                                F = DOOMED fails every attempt: the run fails
    {"op": "sleep", "ms": M}                    a durable sleep
    {"op": "stream", "n": N, "in": "step"|"workflow", "fails": F, "ms": M}
                                                N chunks written to the run's stream "out", by a
                                                step whose attempts 1..F raise after writing
                                                (their chunks retracted), or by workflow code
    {"op": "event", "send_after": S}            wait for the event "e<label>", which the driver
                                                sends S seconds after it started the run
    {"op": "approval", "choice": "approve"|"reject", "decide_after": S, "then": [...],
     "else": [...]}                             ask an approval, which the driver decides as
                                                `choice` S seconds after it saw it; then walk
                                                one branch or the other
    {"op": "child", "ops": [...]}               a child run of the same workflow, awaited
    {"op": "gather", "branches": [[...], ...]}  branches run at once (asyncio.gather of helper
                                                coroutines): each its steps, sleeps, events
                                                and children, in a task of its own
Approval branches and children hold steps, flaky steps, sleeps and streams only; gather
branches hold steps, flaky steps, sleeps, events and children (never a step that fails for
good: which steps of the other branches then end is up to the scheduler).

One workflow, `soak`, interprets a spec, so every worker process runs the same code. Every step
body appends a JSON line to `bodies-<pid>.jsonl` in the side folder (flushed and fsynced) when it
starts and when it ends: (run, checkpoint name, attempt, pid, time, outcome), so the test counts
body executions across processes killed with SIGKILL and can tell which were in flight at a kill.

`expect(run_id, ops)` is the model: from the spec alone, the run's final status and result, its
step checkpoints (status, attempts), the outcome of every step attempt, its approvals, events,
the visible chunks of its stream, and its children's models.

`python -m tests.faults.soak worker DB SIDE_DIR` is one worker process: the App's in-process
worker (which first recovers the runs of dead workers on this host), until SIGTERM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.crash.backends import database_url
from tests.crash.flows import _append

import tether
from tether.core.context import StepContext, current_step

WORKFLOW = "soak"
STREAM = "out"
REVIEWER = "soak-script"
MAX_ATTEMPTS = 4
DOOMED = 99  # a flaky step failing this many times fails for good, and its run with it
# Retry delays 0.3, 0.6, 1.2 s: with INLINE_WAIT the later ones suspend the run durably.
RETRY = tether.Retry(max_attempts=MAX_ATTEMPTS, initial_delay=timedelta(seconds=0.3), jitter=0.0)
INLINE_WAIT = 0.5  # waits (sleeps, events, approvals, retries) longer than this suspend the run
LEASE = 3.0  # seconds; the driver's stalls last longer
SIMPLE = ("step", "flaky", "sleep", "stream")
Spec = dict[str, Any]


# -- the workload -----------------------------------------------------------------------------


def generate(seed: int, runs: int, window: float) -> list[Spec]:
    """`runs` root run specs from `seed`, started over `window` seconds."""
    rng = random.Random(seed)
    specs = []
    for i in range(runs):
        ops = [_op(rng, top=True) for _ in range(rng.randint(3, 7))]
        if rng.random() < 0.08:
            ops.insert(rng.randint(1, len(ops)), {"op": "flaky", "fails": DOOMED, "ms": 20})
        start = round(rng.uniform(0, window), 3)
        specs.append({"id": f"soak-{seed}-{i:03d}", "start_after": start, "ops": ops})
    return specs


def _op(rng: random.Random, *, top: bool, branch: bool = False) -> Spec:
    kinds = ["step"] * 5 + ["flaky"] * 2 + ["sleep"] * 2
    if branch:
        kinds += ["event", "child"]
    else:
        kinds += ["stream"] * 3
    if top:
        kinds += ["event"] * 2 + ["approval"] * 2 + ["child", "gather", "gather"]
    kind = rng.choice(kinds)
    if kind == "step":
        return {"op": "step", "ms": rng.randint(5, 400)}
    if kind == "flaky":
        return {"op": "flaky", "fails": rng.randint(1, 2), "ms": rng.randint(5, 200)}
    if kind == "sleep":
        return {"op": "sleep", "ms": rng.choice([50, 300, 800, 1500])}
    if kind == "stream":
        where = rng.choice(["step", "step", "workflow"])
        fails = rng.choice([0, 0, 1]) if where == "step" else 0
        return {"op": "stream", "n": rng.randint(1, 6), "in": where, "fails": fails,
                "ms": rng.randint(20, 300)}  # fmt: skip
    if kind == "event":
        return {"op": "event", "send_after": round(rng.uniform(0, 4), 3)}
    if kind == "approval":
        return {"op": "approval", "choice": rng.choice(["approve", "approve", "reject"]),
                "decide_after": round(rng.uniform(0, 2), 3),
                "then": [_op(rng, top=False) for _ in range(rng.randint(1, 2))],
                "else": [_op(rng, top=False) for _ in range(rng.randint(1, 2))]}  # fmt: skip
    if kind == "gather":
        return {"op": "gather", "branches": [
            [_op(rng, top=False, branch=True) for _ in range(rng.randint(1, 3))]
            for _ in range(rng.randint(2, 3))
        ]}  # fmt: skip
    return {"op": "child", "ops": [_op(rng, top=False) for _ in range(rng.randint(1, 3))]}


def event_key(label: str) -> str:
    return f"e{label}"


def event_payload(run_id: str, key: str) -> str:
    return f"{run_id}/{key}"


def chunk(label: str, j: int, attempt: int | None) -> str:
    """Chunk j of the stream op `label`, written by step attempt `attempt` (None: workflow)."""
    return f"{label}.{j}@{'wf' if attempt is None else attempt}"


def branch_prefix(label: str, approved: bool) -> str:
    return f"{label}{'t' if approved else 'e'}"


# -- the model --------------------------------------------------------------------------------


@dataclass
class Expected:
    """What one run must end as, whatever was killed on the way."""

    id: str
    status: str = "succeeded"
    result: Any = None
    steps: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (status, attempts)
    bodies: dict[tuple[str, int], str] = field(default_factory=dict)  # (name, attempt) -> outcome
    approvals: dict[str, tuple[str, float]] = field(default_factory=dict)  # label -> choice, after
    events: dict[str, float] = field(default_factory=dict)  # key -> send after (s)
    stream: list[str] = field(default_factory=list)  # the visible chunks, in order
    children: list[Expected] = field(default_factory=list)

    def family(self) -> list[Expected]:
        """This run and its descendants."""
        return [self, *(d for c in self.children for d in c.family())]


class _Fails(Exception):
    """A step of the model failed for good: the run ends there."""


def expect(run_id: str, ops: list[Spec]) -> Expected:
    """The model of the run `run_id` of `soak({"ops": ops})`."""
    exp = Expected(run_id)
    seen: dict[str, Counter[str]] = {"": Counter()}  # per workflow task: "" the root, "@i"
    tasks = [0]  # the tasks the root created so far (gather's branches, in order)
    task = ""  # the task the model is in

    def name(base: str) -> str:  # checkpoint names, numbered as the engine does, per task
        count = seen.setdefault(task, Counter())
        count[base] += 1
        return f"{base}{task}" if count[base] == 1 else f"{base}{task}#{count[base]}"

    def step(base: str, fails: int) -> int:
        checkpoint = name(base)
        attempts = min(fails + 1, MAX_ATTEMPTS)
        for a in range(1, attempts + 1):
            exp.bodies[checkpoint, a] = "fail" if a <= fails else "ok"
        done = fails < MAX_ATTEMPTS
        exp.steps[checkpoint] = ("completed" if done else "failed", attempts)
        if not done:
            raise _Fails(checkpoint)
        return attempts

    def walk(ops: list[Spec], prefix: str) -> list[Any]:
        return [do(op, f"{prefix}{j}") for j, op in enumerate(ops)]

    def do(op: Spec, label: str) -> Any:
        kind = op["op"]
        if kind == "step":
            step("work", 0)
            return f"{label}:ok"
        if kind == "flaky":
            return f"{label}:ok@{step('flaky', op['fails'])}"
        if kind == "sleep":
            return None
        if kind == "stream":
            attempt = step("emit", op["fails"]) if op["in"] == "step" else None
            exp.stream += [chunk(label, j, attempt) for j in range(op["n"])]
            return op["n"]
        if kind == "event":
            key = event_key(label)
            exp.events[key] = op["send_after"]
            return event_payload(run_id, key)
        if kind == "approval":
            approved = op["choice"] == "approve"
            exp.approvals[label] = (op["choice"], op["decide_after"])
            branch = walk(op["then"] if approved else op["else"], branch_prefix(label, approved))
            return {"status": "approved" if approved else "rejected", "branch": branch}
        if kind == "gather":
            return [in_task(branch, f"{label}.{b}.") for b, branch in enumerate(op["branches"])]
        child = expect(f"{run_id}/{name('child:' + WORKFLOW)}", op["ops"])
        exp.children.append(child)
        if child.status != "succeeded":
            raise _Fails(child.id)
        return child.result

    def in_task(ops: list[Spec], prefix: str) -> list[Any]:
        nonlocal task
        task = f"@{tasks[0]}"
        tasks[0] += 1
        try:
            return walk(ops, prefix)
        finally:
            task = ""

    try:
        exp.result = walk(ops, "")
    except _Fails:
        exp.status, exp.result = "failed", None
    return exp


# -- the App the worker processes run ---------------------------------------------------------


class Flake(Exception):
    """A planned failure of a step attempt."""


def make_app(db: str | Path, side_dir: str | Path) -> tether.App:
    """An App on `db` with the `soak` workflow; step bodies note themselves in `side_dir`."""
    side = Path(side_dir)
    # A short lease: a worker stalled (SIGSTOP) for longer loses its runs to the other.
    app = tether.App(database_url(db), lease_duration=timedelta(seconds=LEASE))
    app.engine.settings = dataclasses.replace(app.engine.settings, inline_wait_max=INLINE_WAIT)

    def note(what: str, outcome: str | None = None) -> StepContext:
        step = current_step()
        assert step is not None
        line = {"e": what, "run": step.run_id, "step": step.name, "attempt": step.attempt,
                "pid": os.getpid(), "t": time.time(), "outcome": outcome}  # fmt: skip
        _append(side / f"bodies-{os.getpid()}.jsonl", json.dumps(line))
        return step

    async def body(ms: int, fails: int, label: str) -> int:
        """A step body: noted, taking `ms`, failing in attempts 1..fails; its attempt."""
        step = note("start")
        await asyncio.sleep(ms / 1000)
        if step.attempt <= fails:
            note("end", "fail")
            raise Flake(f"{label}: planned failure of attempt {step.attempt}")
        note("end", "ok")
        return step.attempt

    @app.step()
    async def work(label: str, ms: int) -> str:
        await body(ms, 0, label)
        return f"{label}:ok"

    @app.step(retry=RETRY)
    async def flaky(label: str, fails: int, ms: int) -> str:
        return f"{label}:ok@{await body(ms, fails, label)}"

    @app.step(retry=RETRY)
    async def emit(label: str, n: int, fails: int, ms: int) -> int:
        step = note("start")
        out = tether.stream(STREAM)
        for j in range(n):
            await out.write(chunk(label, j, step.attempt))
            await asyncio.sleep(ms / 1000 / n)
        if step.attempt <= fails:
            note("end", "fail")
            raise Flake(f"{label}: planned failure of attempt {step.attempt}")
        note("end", "ok")
        return n

    async def walk(ops: list[Spec], prefix: str) -> list[Any]:
        return [await do(op, f"{prefix}{j}") for j, op in enumerate(ops)]

    async def do(op: Spec, label: str) -> Any:
        kind = op["op"]
        if kind == "step":
            return await work(label, op["ms"])
        if kind == "flaky":
            return await flaky(label, op["fails"], op["ms"])
        if kind == "sleep":
            await tether.sleep(timedelta(milliseconds=op["ms"]))
            return None
        if kind == "stream":
            if op["in"] == "step":
                return await emit(label, op["n"], op["fails"], op["ms"])
            for j in range(op["n"]):
                await tether.stream(STREAM).write(chunk(label, j, None))
            return op["n"]
        if kind == "event":
            return await tether.wait_for_event(event_key(label))
        if kind == "approval":
            decision = await tether.approval(f"soak {label}", operation={"label": label},
                                             reviewers=["*"])  # fmt: skip
            branch = op["then"] if decision.approved else op["else"]
            results = await walk(branch, branch_prefix(label, decision.approved))
            return {"status": decision.status, "branch": results}
        if kind == "gather":
            return list(await asyncio.gather(
                *(walk(branch, f"{label}.{b}.") for b, branch in enumerate(op["branches"]))
            ))  # fmt: skip
        return await (await tether.start_child(soak, {"ops": op["ops"]}))

    @app.workflow(name=WORKFLOW)
    async def soak(spec: dict[str, Any]) -> list[Any]:
        return await walk(spec["ops"], "")

    return app


async def serve(db: str, side_dir: str) -> None:
    """Run the worker until SIGTERM."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    (Path(side_dir) / f"ready-{os.getpid()}").touch()  # SIGTERM is handled from here on
    async with make_app(db, side_dir):
        await stop.wait()


if __name__ == "__main__":
    command, db, side = sys.argv[1:]
    assert command == "worker", f"unknown command {command!r}"
    asyncio.run(serve(db, side))

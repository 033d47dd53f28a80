"""The workflow the approval crash tests kill, and its processes: a step, a human approval, then
an at-most-once tool call (the side effect the approval guards).

`gated({"tag": T, "expires": SECONDS})` runs `prepare`, asks `tether.approval("Deploy T?")`
bound to the operation {"tool": "deploy", "arguments": {"tag": T}} (anyone may decide, expiry
after SECONDS, default an hour), and only when approved runs `act`. Every step body appends its
name to the `bodies` side file and to `bodies-<run id>`, flushed and fsynced (flows.py's
helper), so the test counts body executions across processes killed with SIGKILL; `act` then
appends "<idempotency key>\\t<result>" to `effects` (the effect its reconcile hook finds after a
crash, so that it happens once even when the completion is lost).

`python -m tests.crash.approval_flows run DB SIDE_DIR RUN_ID ARG_JSON [RUN_ID ARG_JSON ...]`
    Opens the app (its in-process worker first recovers the runs of dead workers on this host),
    starts the runs (an existing run with that id is the same run), waits for their results
    and writes {run id: result} as JSON to SIDE_DIR/result-<pid>.json.
`python -m tests.crash.approval_flows decide DB APPROVAL_ID OPTION REVIEWER OUT [BARRIER]`
    Decides the approval as REVIEWER with no worker in this process (App.decide, with the
    digest the approval shows) and writes {"status": ...} or {"refused": reason} as JSON to
    OUT. With BARRIER (a path), it first reads the approval, writes OUT.ready and waits until
    BARRIER exists: the test releases several deciders at one moment.

DB is a database URL (sqlite:///..., postgresql://...?schema=...) or the path of a SQLite file.
Faults come from $TETHER_FAULTS; $CRASH_INLINE_WAIT is the App's inline_wait_max (how long the
approval's wait holds the run in memory before it suspends; default: the library's, 2 s).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import tether
from tether.approvals.flow import approval_id
from tether.core.context import current_step
from tether.core.handle import RunHandle

from .backends import database_url
from .flows import _append, read_lines

WORKFLOW = "gated"
STEP = "approval"  # the checkpoint name of the (only) approval call of a run
WAIT = "approval:wait"  # the checkpoint of its wait for the decision or the expiry
EXPIRY = "approval:expiry"  # the checkpoint of closing it when the expiry timer won


def approval_of(run_id: str) -> str:
    """The id of the approval run `run_id` asks for (deterministic: the same on every replay)."""
    return approval_id(run_id, STEP)


def operation(tag: str) -> dict[str, Any]:
    return {"tool": "deploy", "arguments": {"tag": tag}}


def expected_result(tag: str, status: str, reviewer: str | None) -> dict[str, Any]:
    """What `gated({"tag": tag})` returns when its approval ended with `status`."""
    approved = status == "approved"
    return {
        "status": status,
        "approved": approved,
        "reviewer": reviewer,
        "done": f"deployed(prepared({tag}))" if approved else None,
    }


def make_app(
    db: str | Path, side_dir: str | Path | None = None, inline_wait_max: float | None = None
) -> tether.App:
    """An App on `db` with `gated` registered; side files go to `side_dir` (default:
    $CRASH_SIDE_DIR), waits held inline up to `inline_wait_max` (default: $CRASH_INLINE_WAIT,
    else the library's)."""
    side = Path(side_dir if side_dir is not None else os.environ["CRASH_SIDE_DIR"])
    effects = side / "effects"
    app = tether.App(database_url(db))
    if inline_wait_max is None and os.environ.get("CRASH_INLINE_WAIT"):
        inline_wait_max = float(os.environ["CRASH_INLINE_WAIT"])
    if inline_wait_max is not None:
        app.engine.settings = dataclasses.replace(
            app.engine.settings, inline_wait_max=inline_wait_max
        )

    def count() -> None:
        step = current_step()
        assert step is not None
        _append(side / "bodies", step.name)
        _append(side / f"bodies-{step.run_id}", step.name)

    @app.step()
    async def prepare(tag: str) -> str:
        count()
        return f"prepared({tag})"

    def recorded_act(text: str) -> object:
        """Reconcile: the result `act` recorded with its effect, or NOT_DONE."""
        key = tether.idempotency_key()
        for line in read_lines(effects):
            found, _, result = line.partition("\t")
            if found == key:
                return result
        return tether.NOT_DONE

    @app.step(at_most_once=True, reconcile=recorded_act, timeout=timedelta(seconds=10))
    async def act(text: str) -> str:
        count()
        result = f"deployed({text})"
        _append(effects, f"{tether.idempotency_key()}\t{result}")
        return result

    @app.workflow(name=WORKFLOW)
    async def gated(arg: dict[str, Any]) -> dict[str, Any]:
        tag = arg["tag"]
        prepared = await prepare(tag)
        decision = await tether.approval(
            f"Deploy {tag}?",
            "The crash tests' agent wants to deploy.",
            operation=operation(tag),
            reviewers=["*"],
            expires_in=timedelta(seconds=arg.get("expires", 3600)),
        )
        done = await act(prepared) if decision.approved else None
        return {
            "status": decision.status,
            "approved": decision.approved,
            "reviewer": decision.reviewer,
            "done": done,
        }

    return app


async def run(db: str, side_dir: str, *pairs: str) -> None:
    runs = dict(zip(pairs[::2], (json.loads(a) for a in pairs[1::2]), strict=True))
    app = make_app(db, side_dir)
    async with app:
        handles: list[RunHandle[Any]] = [
            await app.start(WORKFLOW, a, id=i) for i, a in runs.items()
        ]
        results: list[Any] = await asyncio.gather(*(h.result(timeout=60) for h in handles))
    path = Path(side_dir) / f"result-{os.getpid()}.json"
    path.write_text(json.dumps(dict(zip(runs, results, strict=True))), encoding="utf-8")


async def decide(
    db: str, aid: str, option: str, reviewer: str, out: str, barrier: str | None = None
) -> None:
    app = tether.App(database_url(db))
    try:
        await app.open()
        digest = (await app.get_approval(aid)).operation_digest
        if barrier is not None:
            Path(out + ".ready").write_text(str(os.getpid()), encoding="utf-8")
            go = Path(barrier)
            deadline = time.monotonic() + 30
            while not go.exists():  # a tight poll: the deciders leave within ~0.1 ms of it
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no {barrier} within 30 s")
                time.sleep(0.0001)
        began = time.time()
        try:
            decision = await app.decide(aid, option, reviewer=reviewer, operation_digest=digest)
            outcome: dict[str, Any] = {"status": decision.status}
        except tether.ApprovalRefused as exc:
            outcome = {"refused": exc.reason}
        outcome.update(began=began, ended=time.time())
        Path(out).write_text(json.dumps(outcome), encoding="utf-8")
    finally:
        await app.close()


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    asyncio.run(run(*rest) if command == "run" else decide(*rest))

"""The workflow the crash tests kill: five steps, one of them at-most-once with a reconcile hook,
and a recorded `tether.uuid4()` between steps.

Every step body first appends its checkpoint name ("fetch", "transform#2", ...) to the `bodies`
side file (and to `bodies-<run id>`, for tests with several runs), flushed and fsynced, so the
test can count body executions across processes that die with SIGKILL. `charge` then appends
"<idempotency key>\\t<result>" to the `effects` side file: the effect its reconcile hook looks
for after a crash.

Environment of the process that imports this (set by the test for the first process only):
CRASH_HANG_IN=<checkpoint name>  that body writes the marker file `started-<name>` and sleeps 60 s
CRASH_HANG_AFTER_EFFECT=1        with CRASH_HANG_IN=charge: hang after the effect, not before
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import tether
from tether.core.context import current_step

from .backends import database_url

WORKFLOW = "pipeline"
# The checkpoints of one run, in the order the workflow asks for them.
CHECKPOINTS = ["fetch", "transform", "uuid4", "charge", "transform#2", "notify"]
STEPS = ["fetch", "transform", "charge", "transform#2", "notify"]


def expected_result(order: str, token: str) -> dict[str, Any]:
    """What a run of `pipeline(order)` returns, whatever crashed on the way."""
    receipt = f"receipt(t(data({order})))"
    return {"receipt": receipt, "notified": f"sent(t({receipt}))", "uuid": token}


def _append(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []


def make_app(db: str | Path, side_dir: str | Path | None = None) -> tether.App:
    """An App on the database `db` (a URL, or the path of a SQLite file) with the `pipeline`
    workflow registered; side files go to `side_dir` (default: $CRASH_SIDE_DIR)."""
    side = Path(side_dir if side_dir is not None else os.environ["CRASH_SIDE_DIR"])
    bodies, effects = side / "bodies", side / "effects"
    hang_in = os.environ.get("CRASH_HANG_IN")
    hang_after_effect = os.environ.get("CRASH_HANG_AFTER_EFFECT") == "1"
    app = tether.App(database_url(db))

    async def hang(name: str) -> None:
        _append(side / f"started-{name}", str(os.getpid()))
        await asyncio.sleep(60)  # the test kills this process meanwhile
        raise AssertionError(f"step {name} was not killed while it hung")

    async def begin() -> str:
        """Record this body execution; hang here if asked (except for charge's own hang)."""
        step = current_step()
        assert step is not None
        _append(bodies, step.name)
        _append(side / f"bodies-{step.run_id}", step.name)
        if step.name == hang_in and not (step.name == "charge" and hang_after_effect):
            await hang(step.name)
        return step.name

    @app.step()
    async def fetch(order: str) -> str:
        await begin()
        return f"data({order})"

    @app.step()
    async def transform(text: str) -> str:
        await begin()
        return f"t({text})"

    def recorded_charge(text: str) -> object:
        """Reconcile: the result `charge` recorded with its effect, or NOT_DONE."""
        key = tether.idempotency_key()
        for line in read_lines(effects):
            found, _, result = line.partition("\t")
            if found == key:
                return result
        return tether.NOT_DONE

    @app.step(at_most_once=True, reconcile=recorded_charge, timeout=timedelta(seconds=10))
    async def charge(text: str) -> str:
        name = await begin()
        result = f"receipt({text})"
        _append(effects, f"{tether.idempotency_key()}\t{result}")
        if name == hang_in and hang_after_effect:
            await hang(name)
        return result

    @app.step()
    async def notify(text: str) -> str:
        await begin()
        return f"sent({text})"

    @app.workflow(name=WORKFLOW)
    async def pipeline(order: str) -> dict[str, Any]:
        data = await fetch(order)
        shaped = await transform(data)
        token = tether.uuid4()
        receipt = await charge(shaped)
        again = await transform(receipt)
        notified = await notify(again)
        return {"receipt": receipt, "notified": notified, "uuid": str(token)}

    return app

"""The workflows the wait crash tests kill: a durable sleep between two steps, a wait for an
event, two short timers (for two worker processes at once), and a parent that awaits a child run.

Every step body first appends its checkpoint name ("step_before", "tick", ...) to the `bodies`
side file and to `bodies-<run id>` ('/' in the id as '_'), flushed and fsynced, so the test can
count body executions across processes that die with SIGKILL; `pids` says which process ran
each body ("<run id>\t<name>\t<pid>").

Environment of the process that imports this:
CRASH_SIDE_DIR=<dir>         where the side files go (unless make_app is given side_dir)
CRASH_INLINE_WAIT=<seconds>  the App's inline_wait_max: how long a wait holds the run in memory
                             before it suspends (default: the library's, 2 s)
"""

from __future__ import annotations

import dataclasses
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import tether
from tether.core.context import current_step

from .backends import database_url
from .flows import _append

SLEEP_SECONDS = 3.0  # napper's durable sleep
TICK_SECONDS = 0.5  # each of ticker's two sleeps
CHILD_WORKFLOW = "child_flow"


def safe(run_id: str) -> str:
    """A run id as part of a file name (a child's id holds a '/')."""
    return run_id.replace("/", "_")


def child_id(parent_id: str) -> str:
    """The id of the child run `parent` starts: derived from the parent's id and the position."""
    return f"{parent_id}/child:{CHILD_WORKFLOW}"


def make_app(
    db: str | Path, side_dir: str | Path | None = None, inline_wait_max: float | None = None
) -> tether.App:
    """An App on the database `db` (a URL, or the path of a SQLite file) with the wait
    workflows registered; side files go to `side_dir` (default: $CRASH_SIDE_DIR), waits held
    inline up to `inline_wait_max` (default: $CRASH_INLINE_WAIT, else the library's)."""
    side = Path(side_dir if side_dir is not None else os.environ["CRASH_SIDE_DIR"])
    app = tether.App(database_url(db))
    if inline_wait_max is None and os.environ.get("CRASH_INLINE_WAIT"):
        inline_wait_max = float(os.environ["CRASH_INLINE_WAIT"])
    if inline_wait_max is not None:
        app.engine.settings = dataclasses.replace(
            app.engine.settings, inline_wait_max=inline_wait_max
        )

    def count() -> None:
        """Record this body execution (in `bodies`, `bodies-<run id>`, and with the process id
        in `pids`)."""
        step = current_step()
        assert step is not None
        _append(side / "bodies", step.name)
        _append(side / f"bodies-{safe(step.run_id)}", step.name)
        _append(side / "pids", f"{step.run_id}\t{step.name}\t{os.getpid()}")

    @app.step()
    async def step_before(tag: str) -> str:
        count()
        return f"before({tag})"

    @app.step()
    async def step_after(text: str) -> str:
        count()
        return f"after({text})"

    @app.workflow()
    async def napper(tag: str) -> dict[str, Any]:
        before = await step_before(tag)
        await tether.sleep(timedelta(seconds=SLEEP_SECONDS))
        after = await step_after(before)
        return {"before": before, "after": after}

    @app.workflow()
    async def await_go(tag: str) -> dict[str, Any]:
        before = await step_before(tag)
        payload = await tether.wait_for_event("go")
        after = await step_after(f"{before}+{payload['n']}")
        return {"payload": payload, "after": after}

    @app.step()
    async def tick(tag: str) -> str:
        count()
        return f"tick({tag})"

    @app.step()
    async def tock(text: str) -> str:
        count()
        return f"tock({text})"

    @app.workflow()
    async def ticker(tag: str) -> str:
        await tether.sleep(timedelta(seconds=TICK_SECONDS))
        ticked = await tick(tag)
        await tether.sleep(timedelta(seconds=TICK_SECONDS))
        return await tock(ticked)

    @app.step()
    async def child_step(x: int) -> int:
        count()
        return x * 10

    @app.step()
    async def parent_after(x: int) -> int:
        count()
        return x + 1

    @app.workflow(name=CHILD_WORKFLOW)
    async def child_flow(x: int) -> int:
        return await child_step(x)

    @app.workflow()
    async def parent(x: int) -> dict[str, int]:
        from_child = await child_flow(x)
        return {"child": from_child, "after": await parent_after(from_child)}

    return app

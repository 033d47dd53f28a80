"""Giving a failed, dead or held run another go (`app.resume`): which recorded failure ended the
run, so that step alone gets one more attempt while the rest replays as recorded.

A failure the workflow caught and handled stays a failure in the history: retrying it would
send the workflow down the other branch and make unchanged code diverge. It reads the store
and calls its resume operation; it executes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from tether.core.engine import Engine
from tether.errors import ConfigurationError, RunNotFound
from tether.store.port import Checkpoint, CheckpointStatus, RunRecord, RunStatus

RESUMABLE = (RunStatus.FAILED, RunStatus.DEAD, RunStatus.HELD)


def ending_failure(run: RunRecord, history: list[Checkpoint]) -> str | None:
    """The position of the failed checkpoint whose error ended the run, if one did. The runner
    names it in the run's error; a run failed by older code is matched by its error's type and
    message against the failed checkpoints, the last recorded one winning."""
    error = _json(run.error)
    named = error.get("position")
    if isinstance(named, str):
        return named
    if not error:
        return None
    same = [c for c in history if c.status is CheckpointStatus.FAILED
            and _same_error(_json(c.error), error)]  # fmt: skip
    return same[-1].at if same else None


async def resume(engine: Engine, run_id: str) -> RunRecord:
    """Make the run pending again (see Store.resume_run); its workflow's timeout counts from
    now. Raises RunNotFound, ConfigurationError unless it failed, is dead or held, and
    DuplicateRun if an unfinished run of its queue now holds its dedup key."""
    store, now = engine.store, engine.clock.now()
    before = await store.get_run(run_id)
    if before is None:
        raise RunNotFound(f"no run has id {run_id!r}; check the id with `tether runs list`")
    if before.status not in RESUMABLE:
        raise ConfigurationError(
            f"run {run_id!r} is {before.status.value}; only a failed, dead or held run can be "
            f"resumed"
        )
    wf = engine.workflows.get(before.workflow)
    if wf is not None:
        deadline = None if wf.timeout is None else now + wf.timeout.total_seconds()
    elif before.deadline_at is None:
        deadline = None
    else:  # its code is not loaded here (`tether runs resume --database`): the same span
        deadline = now + max(before.deadline_at - before.created_at, 0.0)
    retry = None
    if before.status is RunStatus.FAILED:
        retry = ending_failure(before, await store.load_history(run_id))
    record = await store.resume_run(run_id, now, deadline, retry)
    if record.status is not RunStatus.PENDING:
        raise ConfigurationError(
            f"run {run_id!r} is {record.status.value}; only a failed, dead or held run can be "
            f"resumed"
        )
    return record


def _json(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _same_error(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a.get("type"), a.get("message")) == (b.get("type"), b.get("message"))

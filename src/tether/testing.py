"""The public test kit: an in-memory store, and histories exported from a database and replayed
against current code (golden histories in a test suite).

It builds on the App and the engine's replay; it adds no engine behaviour of its own.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from tether.app import App
from tether.core.replay import ReplayOutcome, replay
from tether.errors import ConfigurationError, NonDeterminismError, RunNotFound
from tether.store.base import Checkpoint, CheckpointStatus
from tether.store.memory import MemoryStore

HISTORY_FORMAT = "tether.history/1"


async def export_history(app: App, run_id: str) -> dict[str, Any]:
    """A run's recorded history as a JSON-ready dict (what `check_history` replays)."""
    await app.open()
    record = await app.engine.store.get_run(run_id)
    if record is None:
        raise RunNotFound(f"no run has id {run_id!r}; check the id with `tether runs list`")
    checkpoints = await app.engine.store.load_history(run_id)
    return {
        "format": HISTORY_FORMAT,
        "run_id": record.id,
        "workflow": record.workflow,
        "args": json.loads(record.args),
        "status": record.status.value,
        "checkpoints": [
            {k: v for k, v in asdict(c).items() if k not in ("started_at", "finished_at")}
            | {"status": c.status.value}
            for c in checkpoints
        ],
    }


async def check_history(app: App, history: dict[str, Any]) -> ReplayOutcome:
    """Replay an exported history against the workflows registered on `app`, running nothing."""
    if history.get("format") != HISTORY_FORMAT:
        raise ConfigurationError(
            f"not a Tether history (format {history.get('format')!r}, expected "
            f"{HISTORY_FORMAT!r}); export one with tether.testing.export_history"
        )
    checkpoints = [
        Checkpoint(**{**c, "status": CheckpointStatus(c["status"])}) for c in history["checkpoints"]
    ]
    args = json.dumps(history["args"])
    return await replay(app.engine, history["run_id"], history["workflow"], args, checkpoints)


async def assert_replays(app: App, history: dict[str, Any]) -> None:
    """Raise NonDeterminismError if the history no longer replays under the current code."""
    outcome = await check_history(app, history)
    if outcome.error is not None:
        raise outcome.error


__all__ = [
    "HISTORY_FORMAT",
    "MemoryStore",
    "NonDeterminismError",
    "ReplayOutcome",
    "assert_replays",
    "check_history",
    "export_history",
]

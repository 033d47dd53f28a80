"""The schedules (one run per cron slot, a cursor per schedule) and runs started at a later time:
the operations of the Sqlite backend, mixed into SqliteStore; one transaction each.

SQLite has one writer at a time, so the compare-and-set of a cursor and the inserts of its
slot's runs commit together or not at all. SQL in sql/sqlite/. It must not import tether.core.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tether.store.base import NewRun, RunStatus
from tether.store.rows import load_sql
from tether.store.schedule_rows import (
    ScheduleRecord,
    ScheduleSpec,
    schedule_from_row,
    spec_to_row,
)

if TYPE_CHECKING:
    from tether.store.sqlite_commit import CommitQueue

_Q, _ = load_sql("sqlite")


def new_run_row(run: NewRun, now: float) -> dict[str, Any]:
    """Parameters of the insert_run query for a run nobody holds yet (as create_run)."""
    status = RunStatus.PENDING if run.wake_at is None else RunStatus.WAITING
    return {"id": run.id, "workflow": run.workflow, "args": run.args, "now": now,
            "deadline_at": run.deadline_at, "parent_id": run.parent_id, "owner": None,
            "status": status.value, "epoch": 0, "lease_expires_at": None, "queue": run.queue,
            "priority": run.priority, "dedup_key": run.dedup_key, "started_by": run.started_by,
            "started_at": None, "wake_at": run.wake_at}  # fmt: skip


class SqliteSchedules:
    """Mixed into SqliteStore."""

    _db: CommitQueue

    async def put_schedule(self, spec: ScheduleSpec, now: float) -> ScheduleRecord:
        def op(c: sqlite3.Connection) -> ScheduleRecord:
            c.execute(_Q["put_schedule"], spec_to_row(spec, now))
            return schedule_from_row(c.execute(_Q["get_schedule"], {"name": spec.name}).fetchone())

        return await self._db.submit(op, write=True, label=f"put_schedule:{spec.name}", multi=True)

    async def advance_schedule(
        self, name: str, cursor: float, slot: float, runs: Sequence[NewRun], now: float
    ) -> bool:
        args = {"name": name, "cursor": cursor, "slot": slot, "now": now}
        rows = [new_run_row(run, now) for run in runs]

        def op(c: sqlite3.Connection) -> bool:
            if c.execute(_Q["advance_schedule"], args).rowcount != 1:
                return False
            c.executemany(_Q["insert_run"], rows)
            return True

        label = f"advance_schedule:{name}"
        return await self._db.submit(op, write=True, label=label, multi=True)

    async def list_schedules(self) -> list[ScheduleRecord]:
        def op(c: sqlite3.Connection) -> list[ScheduleRecord]:
            return [schedule_from_row(r) for r in c.execute(_Q["list_schedules"])]

        return await self._db.submit(op, write=False)

"""The schedules (one run per cron slot, a cursor per schedule) and runs started at a later time:
the operations of the Postgres backend, mixed into PostgresStore; one transaction each.

The compare-and-set of a cursor takes the schedule's row lock: a second worker moving the same
cursor waits for the first to commit, then finds it moved and writes nothing, so the slot's
runs are inserted once. SQL in sql/postgres/. It must not import tether.core.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from tether.store.base import NewRun, RunStatus
from tether.store.rows import load_sql
from tether.store.schedule_rows import (
    ScheduleRecord,
    ScheduleSpec,
    schedule_from_row,
    spec_to_row,
)

_Q, _ = load_sql("postgres")
T = TypeVar("T")
CHANNEL = "tether"  # the NOTIFY channel of PostgresStore: something became due


def new_run_row(run: NewRun, now: float) -> dict[str, Any]:
    """Parameters of the insert_run query for a run nobody holds yet (as create_run)."""
    status = RunStatus.PENDING if run.wake_at is None else RunStatus.WAITING
    return {"id": run.id, "workflow": run.workflow, "args": run.args, "now": now,
            "deadline_at": run.deadline_at, "parent_id": run.parent_id, "owner": None,
            "status": status.value, "epoch": 0, "lease_expires_at": None, "queue": run.queue,
            "priority": run.priority, "dedup_key": run.dedup_key, "started_by": run.started_by,
            "started_at": None, "wake_at": run.wake_at}  # fmt: skip


class PostgresSchedules:
    """Mixed into PostgresStore."""

    async def _tx(self, fn: Callable[[Any], Awaitable[T]], *, write: bool, label: str = "") -> T:
        raise NotImplementedError  # PostgresStore's

    async def _rows(self, query: str, args: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError  # PostgresStore's

    async def put_schedule(self, spec: ScheduleSpec, now: float) -> ScheduleRecord:
        async def op(c: Any) -> ScheduleRecord:
            await c.execute(_Q["put_schedule"], spec_to_row(spec, now))
            row = await (await c.execute(_Q["get_schedule"], {"name": spec.name})).fetchone()
            return schedule_from_row(row)

        return await self._tx(op, write=True, label=f"put_schedule:{spec.name}")

    async def advance_schedule(
        self, name: str, cursor: float, slot: float, runs: Sequence[NewRun], now: float
    ) -> bool:
        args = {"name": name, "cursor": cursor, "slot": slot, "now": now}
        rows = [new_run_row(run, now) for run in runs]

        async def op(c: Any) -> bool:
            if (await c.execute(_Q["advance_schedule"], args)).rowcount != 1:
                return False
            if rows:
                async with c.cursor() as cur:
                    await cur.executemany(_Q["insert_run"], rows)
                await c.execute(f"NOTIFY {CHANNEL}")
            return True

        return await self._tx(op, write=True, label=f"advance_schedule:{name}")

    async def list_schedules(self) -> list[ScheduleRecord]:
        return [schedule_from_row(r) for r in await self._rows(_Q["list_schedules"], {})]

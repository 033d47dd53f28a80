"""The operations on schedules: store one's definition, move its cursor with the runs of the
slots it passed (compare-and-set, so one worker wins each slot), list them.

Written once for both SQL dialects; it must not touch a connection or a driver.
"""

from __future__ import annotations

from collections.abc import Sequence

from tether.store.ops.common import NOTIFY
from tether.store.ops.runs import new_run_params
from tether.store.port import NewRun
from tether.store.port.schedules import ScheduleRecord, ScheduleSpec
from tether.store.query import Op, Query, execute_many, one, select
from tether.store.rows import schedule_from_row, spec_to_row


def put_schedule(spec: ScheduleSpec, now: float) -> Op[ScheduleRecord]:
    yield Query("put_schedule", spec_to_row(spec, now))
    row = yield from one("get_schedule", name=spec.name)
    assert row is not None
    return schedule_from_row(row)


def advance_schedule(
    name: str, cursor: float, slot: float, runs: Sequence[NewRun], now: float
) -> Op[bool]:
    args = {"name": name, "cursor": cursor, "slot": slot, "now": now}
    if (yield Query("advance_schedule", args)) != 1:
        return False
    if runs:
        yield from execute_many("insert_run", [new_run_params(r, now, None, None) for r in runs])
        yield NOTIFY
    return True


def list_schedules() -> Op[list[ScheduleRecord]]:
    return [schedule_from_row(r) for r in (yield from select("list_schedules"))]

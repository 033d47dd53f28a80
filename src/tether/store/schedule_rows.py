"""The Store port's records for schedules: a schedule's definition and its stored row with the
cursor (the latest slot handled), plain data, no I/O.

It must not import tether.store.base (which builds on it), tether.core or any backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CATCH_UP = ("skip", "latest", "all")  # what a schedule does with the slots it missed


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule as the code defines it: which workflow, when (cron in a time zone), and how
    it catches up after downtime."""

    name: str
    workflow: str
    cron: str  # five fields: minute hour day-of-month month day-of-week
    tz: str  # an IANA time zone name, e.g. "Europe/Paris" or "UTC"
    catch_up: str  # one of CATCH_UP


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A schedule as stored: its definition as last registered, and its cursor."""

    name: str
    workflow: str
    cron: str
    tz: str
    catch_up: str
    # The cursor: every slot at or before it is handled (started or skipped for good). It
    # starts at the time the schedule was first registered: no slot before that ever runs.
    last_slot: float
    created_at: float
    updated_at: float

    @property
    def spec(self) -> ScheduleSpec:
        return ScheduleSpec(self.name, self.workflow, self.cron, self.tz, self.catch_up)


def schedule_from_row(row: Sequence[Any]) -> ScheduleRecord:
    """A schedule from its columns: name, workflow, cron, tz, catch_up, last_slot, created_at,
    updated_at."""
    return ScheduleRecord(
        name=row[0], workflow=row[1], cron=row[2], tz=row[3], catch_up=row[4],
        last_slot=float(row[5]), created_at=float(row[6]), updated_at=float(row[7]),
    )  # fmt: skip


def spec_to_row(spec: ScheduleSpec, now: float) -> dict[str, Any]:
    """Parameters of the put_schedule queries: the definition, and `now` (the first cursor)."""
    return {"name": spec.name, "workflow": spec.workflow, "cron": spec.cron, "tz": spec.tz,
            "catch_up": spec.catch_up, "now": now}  # fmt: skip

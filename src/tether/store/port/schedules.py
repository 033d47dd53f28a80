"""The schedules part of the Store port: a schedule's definition and its cursor, and the
operations that move it together with the runs of the slots it passed. It must not import
tether.core or any backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tether.store.port.runs import NewRun

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


class SchedulesPort(Protocol):
    """Schedules."""

    async def put_schedule(self, spec: ScheduleSpec, now: float) -> ScheduleRecord:
        """Insert the schedule with its cursor (last_slot) at `now`, unless one has its name:
        then store its definition (workflow, cron, tz, catch_up) and keep its cursor. Returns
        the schedule as stored."""

    async def advance_schedule(
        self, name: str, cursor: float, slot: float, runs: Sequence[NewRun], now: float
    ) -> bool:
        """Compare-and-set the schedule's cursor: if it is still `cursor`, move it to `slot`
        and insert `runs` (pending, each unless its id exists, as create_run without owner)
        in the same transaction, and return True. Otherwise (another worker moved it first,
        or the schedule is unknown) write nothing and return False."""

    async def list_schedules(self) -> list[ScheduleRecord]:
        """Every stored schedule, by name."""

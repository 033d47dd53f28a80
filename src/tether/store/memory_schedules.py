"""The schedules (one run per cron slot, a cursor per schedule) and runs started at a later time:
the operations of the Memory backend, mixed into MemoryStore; each runs whole under the store's
lock, giving the answers the SQL backends give.

It must not import tether.core.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace

from tether.store.base import NewRun, RunRecord
from tether.store.schedule_rows import ScheduleRecord, ScheduleSpec


class MemorySchedules:
    """Mixed into MemoryStore."""

    _lock: threading.Lock
    _runs: dict[str, RunRecord]
    _schedules: dict[str, ScheduleRecord]

    def _init_schedules(self) -> None:
        """Set up this mixin's state (called by MemoryStore.__init__)."""
        self._schedules = {}

    def _new_run(self, run: NewRun, now: float) -> RunRecord:
        raise NotImplementedError  # MemoryStore's

    async def put_schedule(self, spec: ScheduleSpec, now: float) -> ScheduleRecord:
        with self._lock:
            old = self._schedules.get(spec.name)
            if old is None:
                new = ScheduleRecord(spec.name, spec.workflow, spec.cron, spec.tz, spec.catch_up,
                                     last_slot=now, created_at=now, updated_at=now)  # fmt: skip
            elif old.spec != spec:
                new = replace(old, workflow=spec.workflow, cron=spec.cron, tz=spec.tz,
                              catch_up=spec.catch_up, updated_at=now)  # fmt: skip
            else:
                return old
            self._schedules[spec.name] = new
            return new

    async def advance_schedule(
        self, name: str, cursor: float, slot: float, runs: Sequence[NewRun], now: float
    ) -> bool:
        with self._lock:
            old = self._schedules.get(name)
            if old is None or old.last_slot != cursor:
                return False
            self._schedules[name] = replace(old, last_slot=slot, updated_at=now)
            for run in runs:
                if run.id not in self._runs:
                    self._runs[run.id] = self._new_run(run, now)
            return True

    async def list_schedules(self) -> list[ScheduleRecord]:
        with self._lock:
            return [self._schedules[name] for name in sorted(self._schedules)]

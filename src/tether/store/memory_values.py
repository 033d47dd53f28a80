"""The values a run publishes for callers, and forks (a new run from another's history): the
operations of the Memory backend, mixed into MemoryStore. Each runs whole under the store's
lock, giving the answers the SQL backends give.

It must not import tether.core.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import replace

from tether.store.base import Checkpoint, Lease, NewRun, RunRecord, RunStatus
from tether.store.value_rows import ForkRecord, ValueRecord, value_lease_lost


class MemoryValues:
    """Mixed into MemoryStore."""

    _lock: threading.Lock
    _runs: dict[str, RunRecord]
    _history: dict[str, dict[int, Checkpoint]]
    _events: list[list[object]]  # [id, run id, key, payload, consumed_by] in arrival order
    _values: dict[tuple[str, str], list[ValueRecord]]  # by (run, key), in version order
    _forks: dict[str, ForkRecord]  # by the fork's run id

    def _init_values(self) -> None:
        """Set up this mixin's state (called by MemoryStore.__init__)."""
        self._values = {}
        self._forks = {}

    def _held(self, lease: Lease) -> RunRecord | None:
        raise NotImplementedError  # MemoryStore's

    def _deliver(self, run_id: str, key: str, payload: str, now: float) -> None:
        raise NotImplementedError  # MemoryStore's

    async def set_value(
        self, lease: Lease, key: str, value: str, checkpoint: Checkpoint, now: float
    ) -> int:
        with self._lock:
            if self._held(lease) is None:
                raise value_lease_lost(lease.run_id, lease.worker_id, lease.epoch, key)
            versions = self._values.setdefault((lease.run_id, key), [])
            version = versions[-1].version + 1 if versions else 1
            versions.append(ValueRecord(lease.run_id, key, version, value, checkpoint.seq, now))
            result = json.dumps({"key": key, "version": version})
            self._history.setdefault(lease.run_id, {})[checkpoint.seq] = replace(
                checkpoint,
                result=result,
                position=checkpoint.at,
            )
            return version

    async def get_value(self, run_id: str, key: str) -> ValueRecord | None:
        with self._lock:
            versions = self._values.get((run_id, key))
            return versions[-1] if versions else None

    async def list_values(self, run_id: str) -> list[ValueRecord]:
        with self._lock:
            found = [v[-1] for (run, _), v in self._values.items() if run == run_id and v]
        return sorted(found, key=lambda v: v.key)

    async def fork_run(
        self,
        run: NewRun,
        link: ForkRecord,
        checkpoints: Sequence[Checkpoint],
        events: Sequence[tuple[str, str]],
        now: float,
    ) -> tuple[RunRecord, bool]:
        source = link.source_run_id
        with self._lock:
            existing = self._runs.get(run.id)
            if existing is not None:
                return existing, False
            record = RunRecord(
                id=run.id, workflow=run.workflow, status=RunStatus.PENDING, args=run.args,
                deadline_at=run.deadline_at, parent_id=run.parent_id, queue=run.queue,
                priority=run.priority, started_by=run.started_by, created_at=now,
                updated_at=now,
            )  # fmt: skip
            self._runs[run.id] = record
            self._history[run.id] = {cp.seq: replace(cp, position=cp.at) for cp in checkpoints}
            seqs = {cp.seq for cp in checkpoints}
            names = {cp.name for cp in checkpoints}
            for (holder, key), versions in list(self._values.items()):
                copied = [replace(v, run_id=run.id) for v in versions if v.seq in seqs]
                if holder == source and copied:
                    self._values[(run.id, key)] = copied
            for _, owner, name, payload, consumed_by in list(self._events):
                if (
                    owner == source
                    and not str(name).startswith("tether:")
                    and (consumed_by is None or consumed_by not in names)
                ):
                    self._deliver(run.id, str(name), str(payload), now)
            for key, payload in events:
                self._deliver(run.id, key, payload, now)
            self._forks[run.id] = link
            return record, True

    async def get_fork(self, run_id: str) -> ForkRecord | None:
        with self._lock:
            return self._forks.get(run_id)

    async def list_forks(self, source_run_id: str) -> list[ForkRecord]:
        with self._lock:
            found = [f for f in self._forks.values() if f.source_run_id == source_run_id]
        return sorted(found, key=lambda f: (f.created_at, f.run_id))

"""MemoryStore: the Store port answered from dicts in memory, for fast unit tests.

It must give exactly the answers a real database backend gives (same fencing, same ordering,
same edge cases), so tests written against it stay true on SQLite and PostgreSQL. Data lives as
long as the object. It must not import tether.core or any other backend.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from tether.errors import ApprovalNotFound, LeaseLost, RunNotFound
from tether.store.approval_rows import (
    PENDING,
    ApprovalChange,
    ApprovalRecord,
    AuditEntry,
    ChangeFn,
    Note,
    apply_change,
    approval_key,
    cancel_on_run_end,
    chain,
)
from tether.store.base import (
    Checkpoint,
    CheckpointStatus,
    EventRef,
    HeartbeatReply,
    Lease,
    NewRun,
    QueueLimits,
    RunRecord,
    RunStatus,
    StoreStats,
    WorkerInfo,
    child_key,
    child_outcome,
)
from tether.store.memory_outbox import MemoryOutbox
from tether.store.memory_retention import MemoryRetention
from tether.store.memory_schedules import MemorySchedules
from tether.store.memory_streams import MemoryStreams
from tether.store.memory_values import MemoryValues
from tether.store.rules import duplicate_run, queue_budget, store_stats
from tether.store.user_rows import UserRecord


class MemoryStore(MemoryStreams, MemoryOutbox, MemorySchedules, MemoryValues, MemoryRetention):
    """An in-memory Store. Each method runs whole under one lock and never awaits inside."""

    url: str = "memory://"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, RunRecord] = {}
        self._history: dict[str, dict[int, Checkpoint]] = {}
        self._workers: dict[str, WorkerInfo] = {}
        # Mailboxes: [id, run id, key, payload, consumed_by] in arrival order.
        self._events: list[list[object]] = []
        self._approvals: dict[str, ApprovalRecord] = {}
        self._audit: dict[str, list[AuditEntry]] = {}
        self._users: dict[str, UserRecord] = {}
        self._streams = {}
        self._stream_refs = {}
        # Each concept's mixin keeps its own state (set up in its own _init_* method).
        self._init_outbox()
        self._init_schedules()
        self._init_values()
        self._init_retention()

    async def open(self) -> None:
        """Nothing to connect to."""

    async def close(self) -> None:
        """Nothing to release; the data stays while the object lives."""

    # -- workers ------------------------------------------------------------------------------

    async def register_worker(self, worker: WorkerInfo, now: float) -> None:
        with self._lock:
            old = self._workers.get(worker.id)
            started_at = old.started_at if old is not None else now
            workflows = None if worker.workflows is None else tuple(sorted(worker.workflows))
            self._workers[worker.id] = replace(
                worker, started_at=started_at, heartbeat_at=now, workflows=workflows
            )

    async def list_workers(self, host: str | None = None) -> list[WorkerInfo]:
        with self._lock:
            workers = sorted(self._workers.values(), key=lambda w: w.id)
        return [w for w in workers if host is None or w.host == host]

    async def release_worker(self, worker_id: str, now: float) -> list[str]:
        with self._lock:
            self._workers.pop(worker_id, None)
            released: list[str] = []
            for run in sorted(self._runs.values(), key=lambda r: r.id):
                if run.status is RunStatus.RUNNING and run.owner == worker_id:
                    self._runs[run.id] = replace(
                        run,
                        status=RunStatus.PENDING,
                        owner=None,
                        lease_expires_at=None,
                        wake_at=None,
                        updated_at=now,
                    )
                    released.append(run.id)
            return released

    async def heartbeat(
        self, worker_id: str, leases: Sequence[Lease], lease_until: float, now: float
    ) -> HeartbeatReply:
        with self._lock:
            lost: list[str] = []
            cancel: list[str] = []
            for lease in leases:
                run = self._held(lease)
                if run is None or lease.worker_id != worker_id:
                    lost.append(lease.run_id)
                    continue
                self._runs[run.id] = replace(run, lease_expires_at=lease_until)
                if run.cancel_requested:
                    cancel.append(run.id)
            worker = self._workers.get(worker_id)
            if worker is not None:
                self._workers[worker_id] = replace(worker, heartbeat_at=now)
            return HeartbeatReply(lost=lost, cancel=cancel, unknown=worker is None)

    def another(self) -> None:
        return None  # its data lives in this object: another loop cannot share it safely

    async def database_time(self) -> float | None:
        return None  # one process: its clock is the one clock

    # -- runs ---------------------------------------------------------------------------------

    async def create_run(
        self,
        run: NewRun,
        now: float,
        *,
        owner: str | None = None,
        lease_until: float | None = None,
    ) -> tuple[RunRecord, bool]:
        with self._lock:
            existing = self._runs.get(run.id)
            if existing is not None:
                return existing, False
            if run.dedup_key is not None:
                for other in self._runs.values():
                    if (other.queue, other.dedup_key) == (run.queue, run.dedup_key) and (
                        not other.status.terminal and other.id != run.id
                    ):
                        raise duplicate_run(run.queue, run.dedup_key, other.id)
            record = self._new_run(run, now, owner, lease_until)
            self._runs[run.id] = record
            return record, True

    def _new_run(
        self, run: NewRun, now: float, owner: str | None = None, lease_until: float | None = None
    ) -> RunRecord:
        """The record of a run as create_run makes it (waiting until run.wake_at, if given)."""
        return RunRecord(
            id=run.id,
            workflow=run.workflow,
            args=run.args,
            deadline_at=run.deadline_at,
            parent_id=run.parent_id,
            queue=run.queue,
            priority=run.priority,
            dedup_key=run.dedup_key,
            started_by=run.started_by,
            started_at=None if owner is None else now,
            status=_new_status(run, owner),
            wake_at=None if owner is not None else run.wake_at,
            owner=owner,
            epoch=0 if owner is None else 1,
            lease_expires_at=None if owner is None else lease_until,
            created_at=now,
            updated_at=now,
        )

    async def get_run(self, run_id: str) -> RunRecord | None:
        with self._lock:
            return self._runs.get(run_id)

    async def list_runs(
        self,
        *,
        statuses: Sequence[RunStatus] = (),
        workflow: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        with self._lock:
            runs = list(self._runs.values())
        wanted = set(statuses)
        runs = [
            r
            for r in runs
            if (not wanted or r.status in wanted)
            and (workflow is None or r.workflow == workflow)
            and (before is None or (r.created_at, r.id) < before)
        ]
        runs.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        return runs[: max(limit, 0)]

    async def claim_runs(
        self,
        worker_id: str,
        workflows: Sequence[str],
        now: float,
        lease_until: float,
        limit: int,
        queues: Mapping[str, QueueLimits] | None = None,
    ) -> list[RunRecord]:
        limited = dict(queues or {})
        with self._lock:
            names = set(workflows)
            due = [r for r in self._runs.values() if r.workflow in names and _claimable(r, now)]
            budgets = {name: self._budget(name, q, worker_id, now, limit)
                       for name, q in limited.items()}  # fmt: skip
            order = [r for r in due if r.queue in limited] + [
                r for r in due if r.queue not in limited
            ]
            order.sort(key=lambda r: (r.queue not in limited, -r.priority, r.created_at, r.id))
            claimed: list[RunRecord] = []
            for run in order:
                if len(claimed) >= max(limit, 0):
                    break
                if run.queue in limited:
                    if budgets[run.queue] <= 0:
                        continue
                    budgets[run.queue] -= 1
                new = replace(
                    run,
                    status=RunStatus.RUNNING,
                    owner=worker_id,
                    epoch=run.epoch + 1,
                    lease_expires_at=lease_until,
                    wake_at=None,
                    updated_at=now,
                    started_at=run.started_at if run.started_at is not None else now,
                )
                self._runs[run.id] = new
                claimed.append(new)
            return sorted(claimed, key=lambda r: (-r.priority, r.created_at, r.id))

    def _budget(self, name: str, limits: QueueLimits, worker: str, now: float, room: int) -> int:
        runs = [r for r in self._runs.values() if r.queue == name]
        live = [r for r in runs if r.status is RunStatus.RUNNING
                and r.lease_expires_at is not None and r.lease_expires_at >= now]  # fmt: skip
        mine = sum(1 for r in live if r.owner == worker)
        since = now - limits.period
        started = sum(1 for r in runs if r.started_at is not None and r.started_at >= since)
        return queue_budget(limits, len(live), mine, started, room)

    async def next_wake_at(self, workflows: Sequence[str]) -> float | None:
        with self._lock:
            names = set(workflows)
            times: list[float] = []
            for run in self._runs.values():
                if run.workflow not in names:
                    continue
                if run.status in _DUE_AT and run.wake_at is not None:
                    times.append(run.wake_at)
                elif run.status is RunStatus.RUNNING and run.lease_expires_at is not None:
                    times.append(run.lease_expires_at)
            return min(times, default=None)

    async def cancel_run(self, run_id: str, error: str, now: float) -> RunRecord:
        with self._lock:
            if run_id not in self._runs:
                raise RunNotFound(f"no run has id {run_id!r}; check the id or list runs")
            todo = [run_id]
            while todo:  # the run, then its unfinished descendants
                current = self._runs[todo.pop()]
                todo += [r.id for r in self._runs.values()
                         if r.parent_id == current.id and not r.status.terminal]  # fmt: skip
                if current.status.terminal:
                    continue
                if current.status is RunStatus.RUNNING:
                    self._runs[current.id] = replace(current, cancel_requested=True, updated_at=now)
                    continue
                self._runs[current.id] = replace(
                    current, status=RunStatus.CANCELLED, error=error, owner=None,
                    lease_expires_at=None, wake_at=None, wake_on=(), cancel_requested=False,
                    finished_at=now, updated_at=now,
                )  # fmt: skip
                self._close_approvals(current.id, RunStatus.CANCELLED, now)
                if current.parent_id is not None:
                    outcome = child_outcome(RunStatus.CANCELLED, None, error)
                    self._deliver(current.parent_id, child_key(current.id), outcome, now)
            return self._runs[run_id]

    async def resume_run(
        self, run_id: str, now: float, deadline_at: float | None, retry: str | None = None
    ) -> RunRecord:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                raise RunNotFound(f"no run has id {run_id!r}; check the id or list runs")
            if run.status not in (RunStatus.FAILED, RunStatus.DEAD, RunStatus.HELD):
                return run
            if run.dedup_key is not None:
                for other in self._runs.values():
                    if (other.queue, other.dedup_key) == (run.queue, run.dedup_key) and (
                        not other.status.terminal
                    ):
                        raise duplicate_run(run.queue, run.dedup_key, other.id)
            history = self._history.get(run_id, {})
            for seq, cp in list(history.items()):
                if cp.status is CheckpointStatus.FAILED and cp.at == retry:
                    history[seq] = replace(cp, status=CheckpointStatus.RETRYING, retry_at=now)
            resumed = replace(run, status=RunStatus.PENDING, result=None, error=None, owner=None,
                              lease_expires_at=None, wake_at=None, wake_on=(), failures=0,
                              cancel_requested=False, finished_at=None, updated_at=now,
                              deadline_at=deadline_at)  # fmt: skip
            self._runs[run_id] = resumed
            return resumed

    # -- mailboxes ----------------------------------------------------------------------------

    async def deliver_event(self, run_id: str, key: str, payload: str, now: float) -> RunRecord:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                raise RunNotFound(f"no run has id {run_id!r}; check the id or list runs")
            if not run.status.terminal:
                self._deliver(run_id, key, payload, now)
            return run

    async def take_event(
        self, lease: Lease, keys: Sequence[str], checkpoint: Checkpoint, now: float
    ) -> str | None:
        with self._lock:
            run = self._fenced(lease)
            for event in self._events:
                if event[1] == run.id and event[2] in keys and event[4] is None:
                    event[4] = checkpoint.name
                    key = str(event[2])
                    result = f'{{"key":{json.dumps(key)},"value":{event[3]}}}'
                    self._history.setdefault(run.id, {})[checkpoint.seq] = replace(
                        _stamped(checkpoint), result=result
                    )
                    return result
            return None

    async def events_after(self, event_id: int, limit: int = 1000) -> list[EventRef]:
        with self._lock:
            return [EventRef(int(str(e[0])), str(e[1]), str(e[2])) for e in
                    self._events[event_id : event_id + max(limit, 0)]]  # fmt: skip

    async def last_event_id(self) -> int:
        with self._lock:
            return len(self._events)

    async def poll_changes(self) -> bool:
        return False  # one process: every change is announced in-process

    async def stats(self) -> StoreStats:
        with self._lock:
            by_status: dict[str, int] = {}
            for run in self._runs.values():
                by_status[run.status.value] = by_status.get(run.status.value, 0) + 1
            pending = [a.created_at for a in self._approvals.values() if a.status == PENDING]
        return store_stats(by_status, len(pending), min(pending, default=None))

    def _deliver(self, run_id: str, key: str, payload: str, now: float) -> None:
        self._events.append([len(self._events) + 1, run_id, key, payload, None])
        run = self._runs[run_id]
        if run.status is RunStatus.WAITING and key in run.wake_on:
            self._runs[run_id] = replace(run, wake_at=now, updated_at=now)

    # -- history and fenced writes ------------------------------------------------------------

    async def load_history(self, run_id: str) -> list[Checkpoint]:
        with self._lock:
            history = self._history.get(run_id, {})
            return [history[seq] for seq in sorted(history)]

    async def write_checkpoint(self, lease: Lease, checkpoint: Checkpoint, now: float) -> None:
        with self._lock:
            run = self._fenced(lease)
            self._history.setdefault(run.id, {})[checkpoint.seq] = _stamped(checkpoint)

    async def suspend_run(
        self, lease: Lease, wake_at: float | None, now: float, wake_on: Sequence[str] = ()
    ) -> None:
        with self._lock:
            run = self._fenced(lease)
            waiting = run.cancel_requested or any(
                e[1] == run.id and e[2] in wake_on and e[4] is None for e in self._events
            )
            self._runs[run.id] = replace(
                run, status=RunStatus.WAITING, owner=None, lease_expires_at=None,
                wake_at=now if waiting else wake_at, wake_on=tuple(wake_on), updated_at=now,
                failures=0, error=None,
            )  # fmt: skip

    async def finish_run(
        self,
        lease: Lease,
        status: RunStatus,
        result: str | None,
        error: str | None,
        now: float,
    ) -> None:
        if not RunStatus(status).terminal:
            raise ValueError(
                f"finish_run needs a terminal status (succeeded, failed, cancelled, dead), got "
                f"{status!r}"
            )
        with self._lock:
            self._end(self._fenced(lease), RunStatus(status), result, error, now)

    async def fail_execution(
        self, lease: Lease, error: str, failures: int, retry_at: float | None, now: float
    ) -> None:
        with self._lock:
            run = replace(self._fenced(lease), failures=failures)
            if retry_at is None:
                self._end(run, RunStatus.DEAD, None, error, now)
                return
            self._runs[run.id] = replace(
                run, status=RunStatus.WAITING, error=error, owner=None, lease_expires_at=None,
                wake_at=retry_at, wake_on=(), updated_at=now,
            )  # fmt: skip

    async def hold_run(
        self, lease: Lease, error: str, failures: int, wake_at: float, now: float
    ) -> None:
        with self._lock:
            run = self._fenced(lease)
            self._runs[run.id] = replace(
                run, status=RunStatus.HELD, error=error, failures=failures, owner=None,
                lease_expires_at=None, wake_at=wake_at, wake_on=(), updated_at=now,
            )  # fmt: skip

    async def wake_held(self, workflows: Sequence[str], now: float) -> int:
        with self._lock:
            held = [r for r in self._runs.values()
                    if r.status is RunStatus.HELD and r.workflow in workflows
                    and (r.wake_at is None or r.wake_at > now)]  # fmt: skip
            for run in held:
                self._runs[run.id] = replace(run, wake_at=now, updated_at=now)
            return len(held)

    async def dead_letter_unserved(
        self, since: float, error: Callable[[str, str], str], now: float
    ) -> list[str]:
        with self._lock:
            live = [w for w in self._workers.values() if w.heartbeat_at >= since]
            if any(w.workflows is None for w in live):
                return []
            served = {name for w in live for name in w.workflows or ()}
            dead = sorted(
                (r for r in self._runs.values() if r.workflow not in served
                 and (due := _due_since(r)) is not None and due < since),
                key=lambda r: r.id,
            )  # fmt: skip
            for run in dead:
                self._end(run, RunStatus.DEAD, None, error(run.id, run.workflow), now)
            return [r.id for r in dead]

    def _end(
        self, run: RunRecord, status: RunStatus, result: str | None, error: str | None, now: float
    ) -> None:
        """End the run (call with the lock held): its row, its approvals, its parent."""
        self._runs[run.id] = replace(
            run, status=status, result=result, error=error, owner=None, lease_expires_at=None,
            wake_at=None, wake_on=(), cancel_requested=False, finished_at=now, updated_at=now,
        )  # fmt: skip
        self._close_approvals(run.id, status, now)
        if run.parent_id is not None:
            outcome = child_outcome(status, result, error)
            self._deliver(run.parent_id, child_key(run.id), outcome, now)

    # -- approvals ----------------------------------------------------------------------------

    async def create_approval(
        self, lease: Lease, record: ApprovalRecord, now: float
    ) -> tuple[ApprovalRecord, bool]:
        with self._lock:
            self._fenced(lease)
            existing = self._approvals.get(record.id)
            if existing is not None:
                return existing, False
            self._save(chain(record, [Note("created", None, {"title": record.title})], now))
            return self._approvals[record.id], True

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        with self._lock:
            return self._approvals.get(approval_id)

    async def list_approvals(
        self, *, status: str | None = None, run_id: str | None = None, limit: int = 100
    ) -> list[ApprovalRecord]:
        with self._lock:
            found = [a for a in self._approvals.values()
                     if (status is None or a.status == status)
                     and (run_id is None or a.run_id == run_id)]  # fmt: skip
        found.sort(key=lambda a: (a.created_at, a.id))
        return found[: max(limit, 0)]

    async def change_approval(
        self, approval_id: str, change: ChangeFn, now: float
    ) -> tuple[ApprovalRecord, ApprovalChange]:
        with self._lock:
            record = self._approvals.get(approval_id)
            if record is None:
                raise ApprovalNotFound(
                    f"no approval has id {approval_id!r}; list them with `tether approvals list`"
                )
            run = self._runs.get(record.run_id)
            outcome = change(record, None if run is None else run.status.value, now)
            self._save(apply_change(record, outcome, now))
            if outcome.event is not None and run is not None and not run.status.terminal:
                self._deliver(run.id, approval_key(approval_id), outcome.event, now)
            return self._approvals[approval_id], outcome

    async def approval_audit(self, approval_id: str) -> list[AuditEntry]:
        with self._lock:
            return list(self._audit.get(approval_id, []))

    # -- users ------------------------------------------------------------------------------

    async def put_user(self, user: UserRecord) -> None:
        with self._lock:
            self._users[user.name] = user

    async def get_user(self, name: str) -> UserRecord | None:
        with self._lock:
            return self._users.get(name)

    async def user_by_token(self, token_hash: str) -> UserRecord | None:
        with self._lock:
            return next((u for u in self._users.values() if u.token_hash == token_hash), None)

    async def list_users(self) -> list[UserRecord]:
        with self._lock:
            return [self._users[name] for name in sorted(self._users)]

    async def revoke_user(self, name: str, now: float) -> UserRecord | None:
        with self._lock:
            user = self._users.get(name)
            if user is not None and user.revoked_at is None:
                user = self._users[name] = replace(user, revoked_at=now)
            return user

    def _save(self, saved: tuple[ApprovalRecord, list[AuditEntry]]) -> None:
        record, entries = saved
        self._approvals[record.id] = record
        self._audit.setdefault(record.id, []).extend(entries)

    def _close_approvals(self, run_id: str, status: RunStatus, now: float) -> None:
        for record in list(self._approvals.values()):
            if record.run_id == run_id and record.status == PENDING:
                self._save(apply_change(record, cancel_on_run_end(record, status.value, now), now))

    # -- helpers (call with the lock held) ----------------------------------------------------

    def _held(self, lease: Lease) -> RunRecord | None:
        run = self._runs.get(lease.run_id)
        if (
            run is None
            or run.status is not RunStatus.RUNNING
            or run.owner != lease.worker_id
            or run.epoch != lease.epoch
        ):
            return None
        return run

    def _fenced(self, lease: Lease) -> RunRecord:
        run = self._held(lease)
        if run is None:
            raise LeaseLost(
                f"worker {lease.worker_id!r} no longer holds run {lease.run_id!r} at epoch "
                f"{lease.epoch} (another worker adopted it, or it ended); stop executing it"
            )
        return run


_DUE_AT = (RunStatus.PENDING, RunStatus.WAITING, RunStatus.HELD)  # claimable from wake_at on


def _stamped(checkpoint: Checkpoint) -> Checkpoint:
    """The checkpoint as the store keeps it: with its position."""
    return checkpoint if checkpoint.position else replace(checkpoint, position=checkpoint.at)


def _due_since(run: RunRecord) -> float | None:
    """Since when a worker could have claimed the run (None: it is not claimable)."""
    if run.status is RunStatus.PENDING:
        return run.wake_at if run.wake_at is not None else run.updated_at
    if run.status is RunStatus.WAITING:
        return run.wake_at
    if run.status is RunStatus.RUNNING:
        return run.lease_expires_at
    return None


def _new_status(run: NewRun, owner: str | None) -> RunStatus:
    if owner is not None:
        return RunStatus.RUNNING
    return RunStatus.PENDING if run.wake_at is None else RunStatus.WAITING


def _claimable(run: RunRecord, now: float) -> bool:
    if run.status is RunStatus.PENDING:
        return run.wake_at is None or run.wake_at <= now
    if run.status in (RunStatus.WAITING, RunStatus.HELD):
        return run.wake_at is not None and run.wake_at <= now
    if run.status is RunStatus.RUNNING:
        return run.lease_expires_at is not None and run.lease_expires_at < now
    return False

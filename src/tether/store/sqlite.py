"""The SQLite backend of the Store port: each operation is one function of a connection,
committed through the group commit of sqlite_commit (many runs share one fsync).

WAL mode and synchronous=FULL by default: a checkpoint is durable when its operation returns.
SQL lives in sql/sqlite/*.sql. This module must not import tether.core.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tether import faults
from tether.errors import RunNotFound
from tether.store.base import (
    Checkpoint,
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
from tether.store.rows import (
    checkpoint_from_row,
    checkpoint_values,
    load_sql,
    page_params,
    run_from_row,
    worker_from_row,
    worker_params,
)
from tether.store.rules import duplicate_run, queue_budget, store_stats
from tether.store.sqlite_approvals import (
    SqliteApprovals,
    close_approvals,
    deliver_event,
    lease_lost,
)
from tether.store.sqlite_commit import CommitQueue, parse_sqlite_url
from tether.store.sqlite_outbox import SqliteOutbox
from tether.store.sqlite_retention import SqliteRetention
from tether.store.sqlite_schedules import SqliteSchedules
from tether.store.sqlite_streams import SqliteStreams
from tether.store.sqlite_users import SqliteUsers
from tether.store.sqlite_values import SqliteValues

_Q, _MIGRATIONS = load_sql("sqlite")
_UPSERT_CHECKPOINT = _Q["upsert_checkpoint"]


class SqliteStore(
    SqliteApprovals,
    SqliteUsers,
    SqliteStreams,
    SqliteOutbox,
    SqliteSchedules,
    SqliteValues,
    SqliteRetention,
):
    """Store on one SQLite file; several processes may share the file."""

    def __init__(self, url: str, *, busy_timeout: float = 30.0) -> None:
        self.url = url
        self.path, self.synchronous = parse_sqlite_url(url)
        self._busy_timeout = busy_timeout
        self._db = CommitQueue(self.path, self.synchronous, _MIGRATIONS, busy_timeout=busy_timeout)

    async def open(self) -> None:
        await self._db.open()

    def another(self) -> SqliteStore:
        return SqliteStore(self.url, busy_timeout=self._busy_timeout)

    async def close(self) -> None:
        await self._db.close()

    # -- the port ---------------------------------------------------------------------------

    async def register_worker(self, worker: WorkerInfo, now: float) -> None:
        args = worker_params(worker, now)
        await self._db.submit(
            lambda c: c.execute(_Q["upsert_worker"], args),
            write=True,
            label=f"register_worker:{worker.id}",
        )

    async def list_workers(self, host: str | None = None) -> list[WorkerInfo]:
        def op(c: sqlite3.Connection) -> list[WorkerInfo]:
            return [worker_from_row(row) for row in c.execute(_Q["list_workers"], {"host": host})]

        return await self._db.submit(op, write=False)

    async def release_worker(self, worker_id: str, now: float) -> list[str]:
        def op(c: sqlite3.Connection) -> list[str]:
            rows = c.execute(_Q["release_worker_runs"], {"id": worker_id, "now": now})
            ids = sorted(r[0] for r in rows)
            c.execute(_Q["delete_worker"], {"id": worker_id})
            return ids

        return await self._db.submit(
            op, write=True, label=f"release_worker:{worker_id}", multi=True
        )

    async def heartbeat(
        self, worker_id: str, leases: Sequence[Lease], lease_until: float, now: float
    ) -> HeartbeatReply:
        def op(c: sqlite3.Connection) -> HeartbeatReply:
            lost, cancel = [], []
            for lease in leases:
                row = c.execute(
                    _Q["extend_lease"],
                    {
                        "run_id": lease.run_id,
                        "worker": worker_id,
                        "epoch": lease.epoch,
                        "lease_until": lease_until,
                    },
                ).fetchone()
                if row is None:
                    lost.append(lease.run_id)
                elif row[0]:
                    cancel.append(lease.run_id)
            touched = c.execute(_Q["touch_worker"], {"id": worker_id, "now": now}).rowcount
            return HeartbeatReply(lost=lost, cancel=cancel, unknown=touched == 0)

        return await self._db.submit(op, write=True, label="heartbeat", multi=True)

    async def create_run(
        self,
        run: NewRun,
        now: float,
        *,
        owner: str | None = None,
        lease_until: float | None = None,
    ) -> tuple[RunRecord, bool]:
        status = RunStatus.RUNNING if owner else RunStatus.PENDING
        wake_at = None if owner else run.wake_at  # app.start_at: waiting until then
        status = RunStatus.WAITING if wake_at is not None else status
        epoch = 1 if owner else 0
        lease = lease_until if owner else None
        args = {
            "id": run.id,
            "workflow": run.workflow,
            "args": run.args,
            "now": now,
            "deadline_at": run.deadline_at,
            "parent_id": run.parent_id,
            "owner": owner,
            "status": status.value,
            "epoch": epoch,
            "lease_expires_at": lease,
            "queue": run.queue,
            "priority": run.priority,
            "dedup_key": run.dedup_key,
            "started_by": run.started_by,
            # A run created already claimed has started: rate limits count it.
            "started_at": now if owner else None,
            "wake_at": wake_at,
        }

        def op(c: sqlite3.Connection) -> tuple[RunRecord, bool]:
            try:
                inserted = c.execute(_Q["insert_run"], args).rowcount == 1
            except sqlite3.IntegrityError:
                holder = c.execute(_Q["dedup_holder"], args).fetchone()
                raise duplicate_run(
                    run.queue, run.dedup_key, holder[0] if holder else "?"
                ) from None
            if inserted:
                created = RunRecord(
                    id=run.id,
                    workflow=run.workflow,
                    status=status,
                    args=run.args,
                    owner=owner,
                    epoch=epoch,
                    lease_expires_at=lease,
                    wake_at=wake_at,
                    deadline_at=run.deadline_at,
                    created_at=now,
                    updated_at=now,
                    parent_id=run.parent_id,
                    queue=run.queue,
                    priority=run.priority,
                    dedup_key=run.dedup_key,
                    started_at=now if owner else None,
                    started_by=run.started_by,
                )
                return created, True
            return run_from_row(c.execute(_Q["get_run"], {"id": run.id}).fetchone()), False

        return await self._db.submit(op, write=True, label=f"create_run:{run.id}")

    async def get_run(self, run_id: str) -> RunRecord | None:
        def op(c: sqlite3.Connection) -> RunRecord | None:
            row = c.execute(_Q["get_run"], {"id": run_id}).fetchone()
            return None if row is None else run_from_row(row)

        return await self._db.submit(op, write=False)

    async def list_runs(
        self,
        *,
        statuses: Sequence[RunStatus] = (),
        workflow: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        args = {
            "any_status": not statuses,
            "statuses": json.dumps([str(s) for s in statuses]),
            "workflow": workflow,
            "limit": max(0, limit),
            **page_params(before),
        }
        return await self._db.submit(
            lambda c: [run_from_row(r) for r in c.execute(_Q["list_runs"], args)], write=False
        )

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
        base = {"worker": worker_id, "workflows": json.dumps(list(workflows)), "now": now,
                "lease_until": lease_until}  # fmt: skip

        def op(c: sqlite3.Connection) -> list[RunRecord]:
            rows: list[Any] = []
            room = limit
            for name, limits in limited.items():  # SQLite's write lock serializes claims
                load = {**base, "queue": name, "since": now - limits.period}
                running, mine, started = c.execute(_Q["queue_load"], load).fetchone()
                budget = queue_budget(limits, running, mine, started, room)
                if budget:
                    rows += c.execute(_Q["claim_queue"], {**load, "limit": budget}).fetchall()
                    room = limit - len(rows)
            if room > 0:
                args = {**base, "limited": json.dumps(list(limited)), "limit": room}
                rows += c.execute(_Q["claim_runs"], args).fetchall()
            # RETURNING has no order: give them back in claim order.
            return sorted(
                (run_from_row(r) for r in rows), key=lambda r: (-r.priority, r.created_at, r.id)
            )

        return await self._db.submit(op, write=True, label="claim_runs")

    async def next_wake_at(self, workflows: Sequence[str]) -> float | None:
        args = {"workflows": json.dumps(list(workflows))}

        def op(c: sqlite3.Connection) -> float | None:
            value = c.execute(_Q["next_wake_at"], args).fetchone()[0]
            return None if value is None else float(value)

        return await self._db.submit(op, write=False)

    async def load_history(self, run_id: str) -> list[Checkpoint]:
        return await self._db.submit(
            lambda c: [
                checkpoint_from_row(r) for r in c.execute(_Q["load_history"], {"run_id": run_id})
            ],
            write=False,
        )

    async def write_checkpoint(self, lease: Lease, checkpoint: Checkpoint, now: float) -> None:
        cp = checkpoint
        args = checkpoint_values(lease.run_id, cp, cp.result, lease.worker_id, lease.epoch)

        def op(c: sqlite3.Connection) -> None:
            if c.execute(_UPSERT_CHECKPOINT, args).rowcount != 1:
                raise lease_lost(c, lease)

        label = f"write_checkpoint:{cp.name}:{cp.status.value}" if faults.ENABLED else ""
        await self._db.submit(op, write=True, label=label)

    def _fenced(
        self, lease: Lease, query: str, **extra: Any
    ) -> Callable[[sqlite3.Connection], None]:
        args = {"run_id": lease.run_id, "worker": lease.worker_id, "epoch": lease.epoch, **extra}

        def op(c: sqlite3.Connection) -> None:
            if c.execute(_Q[query], args).rowcount != 1:
                raise lease_lost(c, lease)

        return op

    async def suspend_run(
        self, lease: Lease, wake_at: float | None, now: float, wake_on: Sequence[str] = ()
    ) -> None:
        op = self._fenced(
            lease, "suspend_run", wake_at=wake_at, now=now, wake_on=json.dumps(list(wake_on))
        )
        await self._db.submit(op, write=True, label=f"suspend_run:{lease.run_id}")

    async def finish_run(
        self,
        lease: Lease,
        status: RunStatus,
        result: str | None,
        error: str | None,
        now: float,
    ) -> None:
        if not RunStatus(status).terminal:
            raise ValueError(f"finish_run needs a terminal status, not {status!r}")
        op = self._finish(lease, RunStatus(status), result, error, None, now)
        await self._db.submit(op, write=True, label=f"finish_run:{lease.run_id}", multi=True)

    def _finish(
        self,
        lease: Lease,
        status: RunStatus,
        result: str | None,
        error: str | None,
        failures: int | None,
        now: float,
    ) -> Callable[[sqlite3.Connection], None]:
        args = {"run_id": lease.run_id, "worker": lease.worker_id, "epoch": lease.epoch,
                "status": str(status), "result": result, "error": error, "now": now,
                "failures": failures}  # fmt: skip

        def op(c: sqlite3.Connection) -> None:
            row = c.execute(_Q["finish_run"], args).fetchone()
            if row is None:
                raise lease_lost(c, lease)
            _ended(c, lease.run_id, row[0], status, result, error, now)

        return op

    async def fail_execution(
        self, lease: Lease, error: str, failures: int, retry_at: float | None, now: float
    ) -> None:
        label = f"fail_execution:{lease.run_id}"
        if retry_at is None:
            op = self._finish(lease, RunStatus.DEAD, None, error, failures, now)
            await self._db.submit(op, write=True, label=label, multi=True)
            return
        op = self._fenced(lease, "fail_execution", error=error, failures=failures,
                          retry_at=retry_at, now=now)  # fmt: skip
        await self._db.submit(op, write=True, label=label)

    async def hold_run(
        self, lease: Lease, error: str, failures: int, wake_at: float, now: float
    ) -> None:
        op = self._fenced(lease, "hold_run", error=error, failures=failures, wake_at=wake_at,
                          now=now)  # fmt: skip
        await self._db.submit(op, write=True, label=f"hold_run:{lease.run_id}")

    async def wake_held(self, workflows: Sequence[str], now: float) -> int:
        args = {"workflows": json.dumps(list(workflows)), "now": now}
        return await self._db.submit(lambda c: c.execute(_Q["wake_held"], args).rowcount,
                                     write=True, label="wake_held")  # fmt: skip

    async def database_time(self) -> float | None:
        return None  # the file has no clock: every process on its machine reads the same one

    async def dead_letter_unserved(
        self, since: float, error: Callable[[str, str], str], now: float
    ) -> list[str]:
        def unserved(c: sqlite3.Connection) -> list[tuple[str, str, str | None]]:
            live = [row[0] for row in c.execute(_Q["live_workflows"], {"since": since})]
            if any(names is None for names in live):
                return []  # an older worker: what it serves is unknown
            served = sorted({name for names in live for name in json.loads(names)})
            args = {"since": since, "served": json.dumps(served)}
            return c.execute(_Q["unserved_runs"], args).fetchall()

        def op(c: sqlite3.Connection) -> list[str]:
            buried = []
            for run_id, workflow, parent_id in unserved(c):  # again, under the write lock
                text = error(run_id, workflow)
                c.execute(_Q["bury_run"], {"id": run_id, "error": text, "now": now})
                _ended(c, run_id, parent_id, RunStatus.DEAD, None, text, now)
                buried.append(run_id)
            return buried

        # Mostly there are none: a read then, not a write transaction (and its fsync).
        if not await self._db.submit(unserved, write=False):
            return []
        return await self._db.submit(op, write=True, label="dead_letter_unserved", multi=True)

    async def cancel_run(self, run_id: str, error: str, now: float) -> RunRecord:
        def op(c: sqlite3.Connection) -> RunRecord:
            row = c.execute(_Q["get_run"], {"id": run_id}).fetchone()
            if row is None:
                raise RunNotFound(f"no run has id {run_id!r}; check the id with `tether runs list`")
            todo = [run_id]
            while todo:  # the run, then its unfinished descendants
                current = todo.pop()
                args = {"id": current, "error": error, "now": now}
                if c.execute(_Q["cancel_unowned"], args).rowcount == 0:
                    c.execute(_Q["cancel_owned"], args)
                else:
                    close_approvals(c, current, RunStatus.CANCELLED, now)
                    parent = c.execute(
                        "SELECT parent_id FROM tether_runs WHERE id = ?", (current,)
                    ).fetchone()[0]
                    if parent is not None:
                        outcome = child_outcome(RunStatus.CANCELLED, None, error)
                        deliver_event(c, parent, child_key(current), outcome, now)
                todo += [r[0] for r in c.execute(_Q["children"], {"id": current})]
            return run_from_row(c.execute(_Q["get_run"], {"id": run_id}).fetchone())

        return await self._db.submit(op, write=True, label=f"cancel_run:{run_id}", multi=True)

    async def resume_run(
        self, run_id: str, now: float, deadline_at: float | None, retry: str | None = None
    ) -> RunRecord:
        args = {"id": run_id, "now": now, "deadline_at": deadline_at, "retry": retry}

        def op(c: sqlite3.Connection) -> RunRecord:
            try:
                resumed = c.execute(_Q["resume_run"], args).rowcount == 1
            except sqlite3.IntegrityError:  # its dedup key is held by an unfinished run now
                run = run_from_row(c.execute(_Q["get_run"], args).fetchone())
                holder = c.execute(
                    _Q["dedup_holder"], {"queue": run.queue, "dedup_key": run.dedup_key}
                ).fetchone()
                raise duplicate_run(
                    run.queue, run.dedup_key, holder[0] if holder else "?"
                ) from None
            if resumed:
                c.execute(_Q["resume_checkpoints"], args)
            row = c.execute(_Q["get_run"], args).fetchone()
            if row is None:
                raise RunNotFound(f"no run has id {run_id!r}; check the id or list runs")
            return run_from_row(row)

        return await self._db.submit(op, write=True, label=f"resume_run:{run_id}", multi=True)

    async def deliver_event(self, run_id: str, key: str, payload: str, now: float) -> RunRecord:
        def op(c: sqlite3.Connection) -> RunRecord:
            row = c.execute(_Q["get_run"], {"id": run_id}).fetchone()
            if row is None:
                raise RunNotFound(f"no run has id {run_id!r}; check the id with `tether runs list`")
            record = run_from_row(row)
            if not record.status.terminal:
                deliver_event(c, run_id, key, payload, now)
            return record

        return await self._db.submit(op, write=True, label=f"deliver_event:{key}", multi=True)

    async def take_event(
        self, lease: Lease, keys: Sequence[str], checkpoint: Checkpoint, now: float
    ) -> str | None:
        fence = {"run_id": lease.run_id, "worker": lease.worker_id, "epoch": lease.epoch}
        query = {"run_id": lease.run_id, "keys": json.dumps(list(keys))}
        cp = checkpoint
        # A look at an empty mailbox is a read: only an event to take costs a write.
        if not await self._db.submit(
            lambda c: c.execute(_Q["oldest_event"], query).fetchone() is not None, write=False
        ):
            return None

        def op(c: sqlite3.Connection) -> str | None:
            if c.execute(_Q["lease_held"], fence).fetchone() is None:
                raise lease_lost(c, lease)
            row = c.execute(_Q["oldest_event"], query).fetchone()
            if row is None:
                return None
            event_id, key, payload = row
            c.execute(_Q["consume_event"], {"id": event_id, "by": cp.name, "now": now})
            result = f'{{"key":{json.dumps(key)},"value":{payload}}}'
            c.execute(
                _UPSERT_CHECKPOINT,
                checkpoint_values(lease.run_id, cp, result, lease.worker_id, lease.epoch),
            )
            return result

        return await self._db.submit(op, write=True, label=f"take_event:{cp.name}", multi=True)

    async def events_after(self, event_id: int, limit: int = 1000) -> list[EventRef]:
        args = {"after": event_id, "limit": limit}
        return await self._db.submit(
            lambda c: [EventRef(*r) for r in c.execute(_Q["events_after"], args)], write=False
        )

    async def last_event_id(self) -> int:
        return await self._db.submit(
            lambda c: int(c.execute(_Q["last_event_id"]).fetchone()[0]), write=False
        )

    async def poll_changes(self) -> bool:
        return await self._db.poll_changes()

    async def stats(self) -> StoreStats:
        def op(c: sqlite3.Connection) -> StoreStats:
            rows = c.execute(_Q["store_stats"]).fetchall()  # one statement: one snapshot
            by_status = {status: n for status, n, _ in rows if status is not None}
            ((pending, oldest),) = [(n, at) for status, n, at in rows if status is None]
            return store_stats(by_status, pending, oldest)

        return await self._db.submit(op, write=False)


def _ended(
    c: sqlite3.Connection,
    run_id: str,
    parent_id: str | None,
    status: RunStatus,
    result: str | None,
    error: str | None,
    now: float,
) -> None:
    """What ending a run does beside its row, in its transaction: its pending approvals are
    cancelled, and its parent is told."""
    close_approvals(c, run_id, status, now)
    if parent_id is not None:
        deliver_event(c, parent_id, child_key(run_id), child_outcome(status, result, error), now)

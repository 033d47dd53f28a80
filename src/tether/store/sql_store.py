"""The Store port on a SQL database: each operation of tether.store.ops run by a driver.

One class serves SQLite and PostgreSQL: a method only says which operation to run, whether it
reads or writes, and whether it has several statements (which a shared commit must keep whole).
What differs between the databases is in the drivers (store/drivers/) and the named queries
(sql/<dialect>/). It must not import tether.core or a database driver's library.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Protocol, TypeVar

from tether import faults
from tether.store.ops import (
    actions,
    approvals,
    checkpoints,
    events,
    outbox,
    retention,
    runs,
    schedules,
    streams,
    users,
    values,
    workers,
)
from tether.store.port import (
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
)
from tether.store.port.actions import NEWEST, ActionRecord
from tether.store.port.approvals import (
    ApprovalChange,
    ApprovalRecord,
    AuditEntry,
    ChangeFn,
    Eligible,
)
from tether.store.port.maintenance import StorageSizes, WalState
from tether.store.port.outbox import (
    OutboxMessage,
    OutboxSettlement,
    OutboxStatus,
    TransactionBody,
    TransactionOutcome,
)
from tether.store.port.retention import START, Cursor, Purge
from tether.store.port.schedules import ScheduleRecord, ScheduleSpec
from tether.store.port.streams import StreamAppend, StreamEntry
from tether.store.port.users import UserRecord
from tether.store.port.values import ForkRecord, ValueRecord
from tether.store.query import Op, Queries
from tether.store.rows import COLUMNS

T = TypeVar("T")


class Driver(Protocol):
    """What a SQL database gives the store: operations run on its connections (a write is
    committed when it returns; `multi`: it has several statements, kept whole in a shared
    commit), a transaction step's body on a guarded connection, and upkeep."""

    url: str
    dialect: str
    has_clock: bool  # a server clock to judge leases by (PostgreSQL); else the local one
    queries: Queries
    run_tables: tuple[str, ...]  # the tables of a run's rows, in the order a purge deletes
    stream_tables: tuple[str, ...]

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def read(self, make: Callable[[], Op[T]], *, multi: bool = False) -> T: ...
    async def write(
        self, make: Callable[[], Op[T]], *, label: str = "", multi: bool = True
    ) -> T: ...
    async def slowly(self, make: Callable[[], Op[T]], *, write: bool, label: str = "") -> T: ...
    async def transaction(
        self,
        check: Callable[[], Op[None]],
        body: TransactionBody,
        after: Callable[[TransactionOutcome], Op[T]],
        *,
        label: str = "",
    ) -> T: ...
    async def poll_changes(self) -> bool: ...
    async def compact(self, max_pages: int) -> int: ...
    async def vacuum(self) -> int | None: ...
    async def checkpoint_wal(self) -> WalState | None: ...
    async def storage_sizes(self) -> StorageSizes: ...


def queries(dialect: str) -> Queries:
    """The store's named queries and migrations of a dialect."""
    return Queries("tether.store", dialect, COLUMNS)


class SqlStore:
    """The Store port's operations on a driver; the backends add what differs (connections,
    maintenance) by giving it theirs."""

    url: str
    driver: Driver

    async def open(self) -> None:
        await self.driver.open()

    async def close(self) -> None:
        await self.driver.close()

    # -- workers ----------------------------------------------------------------------------

    async def register_worker(self, worker: WorkerInfo, now: float) -> None:
        await self.driver.write(lambda: workers.register_worker(worker, now),
                                label=f"register_worker:{worker.id}", multi=False)  # fmt: skip

    async def list_workers(self, host: str | None = None) -> list[WorkerInfo]:
        return await self.driver.read(lambda: workers.list_workers(host))

    async def release_worker(self, worker_id: str, now: float) -> list[str]:
        return await self.driver.write(lambda: workers.release_worker(worker_id, now),
                                       label=f"release_worker:{worker_id}")  # fmt: skip

    async def heartbeat(
        self, worker_id: str, leases: Sequence[Lease], lease_until: float, now: float
    ) -> HeartbeatReply:
        return await self.driver.write(
            lambda: workers.heartbeat(worker_id, leases, lease_until, now), label="heartbeat"
        )

    async def database_time(self) -> float | None:
        if not self.driver.has_clock:
            return None
        return await self.driver.read(runs.database_time)

    # -- runs -------------------------------------------------------------------------------

    async def create_run(
        self,
        run: NewRun,
        now: float,
        *,
        owner: str | None = None,
        lease_until: float | None = None,
        version: str | None = None,
    ) -> tuple[RunRecord, bool]:
        return await self.driver.write(
            lambda: runs.create_run(run, now, owner, lease_until, version),
            label=f"create_run:{run.id}",
            multi=False,
        )

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self.driver.read(lambda: runs.get_run(run_id))

    async def list_runs(
        self,
        *,
        statuses: Sequence[RunStatus] = (),
        workflow: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
        queue: str | None = None,
        version: str | None = None,
        started_by: str | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
        id_prefix: str | None = None,
    ) -> list[RunRecord]:
        # A maker of the operation, not the operation: a read may be tried again.
        make = partial(runs.list_runs, statuses, workflow, limit, before, queue, version,
                       started_by, created_after, created_before, id_prefix)  # fmt: skip
        return await self.driver.read(make)

    async def claim_runs(
        self,
        worker_id: str,
        workflows: Sequence[str],
        now: float,
        lease_until: float,
        limit: int,
        queues: Mapping[str, QueueLimits] | None = None,
        *,
        version: str | None = None,
        live_since: float | None = None,
    ) -> list[RunRecord]:
        limited = dict(queues or {})
        return await self.driver.write(
            lambda: runs.claim_runs(worker_id, workflows, now, lease_until, limit, limited,
                                    version, live_since),
            label="claim_runs", multi=bool(limited),
        )  # fmt: skip

    async def next_wake_at(
        self,
        workflows: Sequence[str],
        *,
        version: str | None = None,
        live_since: float | None = None,
    ) -> float | None:
        return await self.driver.read(lambda: runs.next_wake_at(workflows, version, live_since))

    async def move_version(self, run_id: str, version: str | None, now: float) -> RunRecord:
        return await self.driver.write(lambda: runs.move_version(run_id, version, now),
                                       label=f"move_version:{run_id}")  # fmt: skip

    async def version_counts(self) -> dict[str | None, int]:
        return await self.driver.read(runs.version_counts)

    async def suspend_run(
        self, lease: Lease, wake_at: float | None, now: float, wake_on: Sequence[str] = ()
    ) -> None:
        await self.driver.write(lambda: runs.suspend_run(lease, wake_at, now, wake_on),
                                label=f"suspend_run:{lease.run_id}")  # fmt: skip

    async def finish_run(
        self,
        lease: Lease,
        status: RunStatus,
        result: str | None,
        error: str | None,
        now: float,
        *,
        checkpoints: Sequence[Checkpoint] = (),
    ) -> None:
        if not RunStatus(status).terminal:
            raise ValueError(f"finish_run needs a terminal status, not {status!r}")
        ended, done = RunStatus(status), tuple(checkpoints)
        await self.driver.write(
            lambda: runs.finish_run(lease, ended, result, error, None, now, done),
            label=f"finish_run:{lease.run_id}",
        )

    async def fail_execution(
        self, lease: Lease, error: str, failures: int, retry_at: float | None, now: float
    ) -> None:
        label = f"fail_execution:{lease.run_id}"
        if retry_at is None:
            dead = RunStatus.DEAD
            await self.driver.write(
                lambda: runs.finish_run(lease, dead, None, error, failures, now), label=label
            )
            return
        await self.driver.write(
            lambda: runs.fail_execution(lease, error, failures, retry_at, now),
            label=label, multi=False,
        )  # fmt: skip

    async def hold_run(
        self, lease: Lease, error: str, failures: int, wake_at: float, now: float
    ) -> None:
        await self.driver.write(lambda: runs.hold_run(lease, error, failures, wake_at, now),
                                label=f"hold_run:{lease.run_id}", multi=False)  # fmt: skip

    async def wake_held(self, workflows: Sequence[str], now: float) -> int:
        return await self.driver.write(lambda: runs.wake_held(workflows, now), label="wake_held",
                                       multi=False)  # fmt: skip

    async def dead_letter_unserved(
        self, since: float, error: Callable[[str, str], str], now: float
    ) -> list[str]:
        # Mostly there are none: a read then, not a write transaction (and its commit).
        if not await self.driver.read(lambda: runs.unserved_runs(since), multi=True):
            return []
        return await self.driver.write(lambda: runs.dead_letter_unserved(since, error, now),
                                       label="dead_letter_unserved")  # fmt: skip

    async def cancel_run(self, run_id: str, error: str, now: float) -> RunRecord:
        return await self.driver.write(lambda: runs.cancel_run(run_id, error, now),
                                       label=f"cancel_run:{run_id}")  # fmt: skip

    async def resume_run(
        self, run_id: str, now: float, deadline_at: float | None, retry: str | None = None
    ) -> RunRecord:
        return await self.driver.write(lambda: runs.resume_run(run_id, now, deadline_at, retry),
                                       label=f"resume_run:{run_id}")  # fmt: skip

    async def stats(self, now: float) -> StoreStats:
        return await self.driver.read(lambda: runs.stats(now))

    # -- checkpoints and events -------------------------------------------------------------

    async def load_history(self, run_id: str) -> list[Checkpoint]:
        return await self.driver.read(lambda: checkpoints.load_history(run_id))

    async def load_histories(self, run_ids: Sequence[str]) -> dict[str, list[Checkpoint]]:
        return await self.driver.read(lambda: checkpoints.load_histories(run_ids))

    async def write_checkpoint(self, lease: Lease, checkpoint: Checkpoint, now: float) -> None:
        cp = checkpoint
        label = f"write_checkpoint:{cp.name}:{cp.status.value}" if faults.ENABLED else ""
        await self.driver.write(lambda: checkpoints.write_checkpoint(lease, cp, cp.result),
                                label=label, multi=False)  # fmt: skip

    async def deliver_event(self, run_id: str, key: str, payload: str, now: float) -> RunRecord:
        return await self.driver.write(lambda: events.deliver_event(run_id, key, payload, now),
                                       label=f"deliver_event:{key}")  # fmt: skip

    async def take_event(
        self, lease: Lease, keys: Sequence[str], checkpoint: Checkpoint, now: float
    ) -> str | None:
        # A look at an empty mailbox is a read: only an event to take costs a write.
        if not await self.driver.read(lambda: events.has_event(lease.run_id, keys)):
            return None
        return await self.driver.write(lambda: events.take_event(lease, keys, checkpoint, now),
                                       label=f"take_event:{checkpoint.name}")  # fmt: skip

    async def events_after(self, event_id: int, limit: int = 1000) -> list[EventRef]:
        return await self.driver.read(lambda: events.events_after(event_id, limit))

    async def last_event_id(self) -> int:
        return await self.driver.read(events.last_event_id)

    async def poll_changes(self) -> bool:
        return await self.driver.poll_changes()

    # -- approvals --------------------------------------------------------------------------

    async def create_approval(
        self, lease: Lease, record: ApprovalRecord, now: float
    ) -> tuple[ApprovalRecord, bool]:
        return await self.driver.write(lambda: approvals.create_approval(lease, record, now),
                                       label=f"create_approval:{record.id}")  # fmt: skip

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        return await self.driver.read(lambda: approvals.get_approval(approval_id))

    async def list_approvals(
        self,
        *,
        status: str | None = None,
        run_id: str | None = None,
        limit: int = 100,
        reviewer: Eligible | None = None,
    ) -> list[ApprovalRecord]:
        return await self.driver.read(
            lambda: approvals.list_approvals(status, run_id, limit, reviewer)
        )

    async def change_approval(
        self, approval_id: str, change: ChangeFn, now: float
    ) -> tuple[ApprovalRecord, ApprovalChange]:
        return await self.driver.write(lambda: approvals.change_approval(approval_id, change, now),
                                       label=f"change_approval:{approval_id}")  # fmt: skip

    async def approval_audit(self, approval_id: str) -> list[AuditEntry]:
        return await self.driver.read(lambda: approvals.approval_audit(approval_id))

    async def approval_steps(
        self, after: tuple[str, int] = ("", 0), limit: int = 1000
    ) -> list[tuple[str, int, str]]:
        return await self.driver.read(lambda: approvals.approval_steps(after, limit))

    async def database_secret(self, name: str, fresh: str, now: float) -> str:
        return await self.driver.write(lambda: approvals.database_secret(name, fresh, now),
                                       label=f"database_secret:{name}")  # fmt: skip

    # -- users ------------------------------------------------------------------------------

    async def put_user(self, user: UserRecord) -> None:
        await self.driver.write(lambda: users.put_user(user), label=f"put_user:{user.name}",
                                multi=False)  # fmt: skip

    async def get_user(self, name: str) -> UserRecord | None:
        return await self.driver.read(lambda: users.get_user(name))

    async def user_by_token(self, token_hash: str) -> UserRecord | None:
        return await self.driver.read(lambda: users.user_by_token(token_hash))

    async def list_users(self) -> list[UserRecord]:
        return await self.driver.read(users.list_users)

    async def revoke_user(self, name: str, now: float) -> UserRecord | None:
        return await self.driver.write(lambda: users.revoke_user(name, now),
                                       label=f"revoke_user:{name}", multi=False)  # fmt: skip

    # -- sessions ---------------------------------------------------------------------------

    async def create_session(self, session: users.SessionRecord, now: float) -> None:
        await self.driver.write(lambda: users.create_session(session, now),
                                label=f"create_session:{session.user}")  # fmt: skip

    async def get_session(self, id_hash: str, now: float) -> users.SessionRecord | None:
        return await self.driver.read(lambda: users.get_session(id_hash, now))

    async def touch_session(self, id_hash: str, now: float) -> users.SessionRecord | None:
        return await self.driver.write(lambda: users.touch_session(id_hash, now),
                                       label="touch_session", multi=False)  # fmt: skip

    async def end_session(self, id_hash: str, now: float) -> bool:
        return await self.driver.write(lambda: users.end_session(id_hash, now),
                                       label="end_session", multi=False)  # fmt: skip

    async def end_sessions(self, user: str, now: float) -> int:
        return await self.driver.write(lambda: users.end_sessions(user, now),
                                       label=f"end_sessions:{user}", multi=False)  # fmt: skip

    # -- actions ----------------------------------------------------------------------------

    async def record_action(self, action: ActionRecord) -> int:
        return await self.driver.write(lambda: actions.record_action(action),
                                       label=f"record_action:{action.action}",
                                       multi=False)  # fmt: skip

    async def list_actions(
        self,
        *,
        subject: str | None = None,
        actor: str | None = None,
        before: int = NEWEST,
        limit: int = 100,
    ) -> list[ActionRecord]:
        return await self.driver.read(lambda: actions.list_actions(subject, actor, before, limit))

    # -- streams ----------------------------------------------------------------------------

    async def append_stream(
        self, lease: Lease, key: str, entries: Sequence[StreamAppend], now: float
    ) -> list[int]:
        return await self.driver.write(lambda: streams.append_stream(lease, key, entries, now),
                                       label=f"append_stream:{key}")  # fmt: skip

    async def read_stream(
        self, run_id: str, key: str, offset: int, limit: int
    ) -> list[StreamEntry]:
        return await self.driver.read(lambda: streams.read_stream(run_id, key, offset, limit))

    async def stream_unretracted(self, run_id: str, key: str, writer: str) -> list[int]:
        return await self.driver.read(lambda: streams.stream_unretracted(run_id, key, writer))

    # -- schedules --------------------------------------------------------------------------

    async def put_schedule(self, spec: ScheduleSpec, now: float) -> ScheduleRecord:
        return await self.driver.write(lambda: schedules.put_schedule(spec, now),
                                       label=f"put_schedule:{spec.name}")  # fmt: skip

    async def advance_schedule(
        self, name: str, cursor: float, slot: float, runs: Sequence[NewRun], now: float
    ) -> bool:
        return await self.driver.write(
            lambda: schedules.advance_schedule(name, cursor, slot, runs, now),
            label=f"advance_schedule:{name}",
        )

    async def list_schedules(self) -> list[ScheduleRecord]:
        return await self.driver.read(schedules.list_schedules)

    # -- values and forks -------------------------------------------------------------------

    async def set_value(
        self, lease: Lease, key: str, value: str, checkpoint: Checkpoint, now: float
    ) -> int:
        return await self.driver.write(
            lambda: values.set_value(lease, key, value, checkpoint, now), label=f"set_value:{key}"
        )

    async def get_value(self, run_id: str, key: str) -> ValueRecord | None:
        return await self.driver.read(lambda: values.get_value(run_id, key))

    async def list_values(self, run_id: str) -> list[ValueRecord]:
        return await self.driver.read(lambda: values.list_values(run_id))

    async def fork_run(
        self,
        run: NewRun,
        link: ForkRecord,
        checkpoints: Sequence[Checkpoint],
        events: Sequence[tuple[str, str]],
        now: float,
    ) -> tuple[RunRecord, bool]:
        return await self.driver.write(
            lambda: values.fork_run(run, link, checkpoints, events, now),
            label=f"fork_run:{run.id}",
        )

    async def get_fork(self, run_id: str) -> ForkRecord | None:
        return await self.driver.read(lambda: values.get_fork(run_id))

    async def list_forks(self, source_run_id: str) -> list[ForkRecord]:
        return await self.driver.read(lambda: values.list_forks(source_run_id))

    # -- transactions and the outbox --------------------------------------------------------

    async def run_transaction(
        self, lease: Lease, body: TransactionBody, checkpoint: Checkpoint, now: float
    ) -> str:
        return await self.driver.transaction(
            lambda: outbox.check_transaction(lease, checkpoint), body,
            lambda done: outbox.record_transaction(lease, checkpoint, done, now),
            label=f"run_transaction:{checkpoint.name}",
        )  # fmt: skip

    async def claim_outbox(
        self, worker_id: str, now: float, claim_until: float, limit: int
    ) -> list[OutboxMessage]:
        return await self.driver.write(
            lambda: outbox.claim_outbox(worker_id, now, claim_until, limit),
            label="claim_outbox", multi=False,
        )  # fmt: skip

    async def settle_outbox(
        self, message_id: str, claim: int, settlement: OutboxSettlement, now: float
    ) -> bool:
        return await self.driver.write(
            lambda: outbox.settle_outbox(message_id, claim, settlement, now),
            label=f"settle_outbox:{settlement.status.value}", multi=False,
        )  # fmt: skip

    async def next_outbox_at(self) -> float | None:
        return await self.driver.read(outbox.next_outbox_at)

    async def list_outbox(
        self,
        *,
        status: OutboxStatus | None = None,
        run_id: str | None = None,
        limit: int = 100,
    ) -> list[OutboxMessage]:
        return await self.driver.read(lambda: outbox.list_outbox(status, run_id, limit))

    async def retry_outbox(self, message_id: str, now: float) -> OutboxMessage | None:
        return await self.driver.write(lambda: outbox.retry_outbox(message_id, now),
                                       label="retry_outbox")  # fmt: skip

    # -- retention and upkeep ---------------------------------------------------------------

    async def purge_runs(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        tables = self.driver.run_tables
        return await self.driver.slowly(
            lambda: retention.purge_runs(before, limit, after, dry_run, tables),
            write=not dry_run, label="purge_runs",
        )  # fmt: skip

    async def purge_streams(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        tables = self.driver.stream_tables
        return await self.driver.slowly(
            lambda: retention.purge_streams(before, limit, after, dry_run, tables),
            write=not dry_run, label="purge_streams",
        )  # fmt: skip

    async def purge_approvals(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        return await self.driver.slowly(
            lambda: retention.purge_approvals(before, limit, after, dry_run),
            write=not dry_run, label="purge_approvals",
        )  # fmt: skip

    async def compact(self, max_pages: int) -> int:
        return await self.driver.compact(max_pages)

    async def vacuum(self) -> int | None:
        return await self.driver.vacuum()

    async def checkpoint_wal(self) -> WalState | None:
        return await self.driver.checkpoint_wal()

    async def storage_sizes(self) -> StorageSizes:
        return await self.driver.storage_sizes()

"""The Store port: the short list of atomic operations the engine needs from a database.

Each operation is one transaction: it happens whole or not at all. Writes made on behalf of a run
are fenced by a Lease (run id, worker id, epoch): a worker whose lease was taken over gets
LeaseLost and must stop executing that run. Backends implement this Protocol and nothing more;
all engine logic lives above it, once. Times are float seconds since the epoch (UTC); values
(arguments, results, errors) are JSON text made by tether.serde, opaque to the store.
This module must not import tether.core or any backend.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from tether.store.approval_rows import ApprovalChange, ApprovalRecord, AuditEntry, ChangeFn
from tether.store.outbox_rows import (
    OutboxMessage,
    OutboxSettlement,
    OutboxStatus,
    TransactionBody,
)
from tether.store.retention_rows import START, Cursor, Purge, StorageSizes, WalState
from tether.store.schedule_rows import ScheduleRecord, ScheduleSpec
from tether.store.stream_rows import StreamAppend, StreamEntry
from tether.store.user_rows import UserRecord
from tether.store.value_rows import ForkRecord, ValueRecord


class RunStatus(StrEnum):
    PENDING = "pending"  # created, not yet claimed (or released after a crash)
    RUNNING = "running"  # owned by a worker through a lease
    WAITING = "waiting"  # suspended until wake_at (timer, retry delay) or a wake-up
    # Replay diverged from its history (a deploy changed the workflow's code): unfinished,
    # its approvals pending and its parent not told; claimable again at wake_at (a backoff,
    # or at once when a worker starts), so code that replays it (a rollback) takes it on.
    HELD = "held"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the workflow's own code failed it (an exception it did not catch)
    CANCELLED = "cancelled"
    # Dead-lettered: the engine could not execute it (an undecodable checkpoint, no code for
    # its workflow...), settings.max_executions times in a row or past a grace period. Ended
    # for callers like failed; an operator resumes it after a fix.
    DEAD = "dead"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.DEAD)


class CheckpointStatus(StrEnum):
    STARTED = "started"  # at-most-once marker: the body may have run, outcome unknown
    RETRYING = "retrying"  # an attempt failed; the next one is due at retry_at
    COMPLETED = "completed"
    FAILED = "failed"  # final failure; replay re-raises the recorded error


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: str
    workflow: str
    status: RunStatus
    args: str  # JSON of the positional and keyword arguments
    result: str | None = None  # JSON, when succeeded
    error: str | None = None  # JSON {type, message, traceback}, when failed or cancelled
    owner: str | None = None  # worker id holding the lease
    epoch: int = 0  # incremented by every claim; fences stale writers
    lease_expires_at: float | None = None
    wake_at: float | None = None  # a waiting run becomes claimable at this time
    deadline_at: float | None = None  # the workflow's timeout, as an absolute time
    cancel_requested: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0
    finished_at: float | None = None
    parent_id: str | None = None  # the run that started this one as a child
    wake_on: tuple[str, ...] = ()  # mailbox keys whose arrival wakes this waiting run
    queue: str | None = None
    priority: int = 0
    dedup_key: str | None = None
    started_at: float | None = None  # when a worker first claimed it (rate limits count these)
    started_by: str | None = None  # who started it (approvals with separate duties refuse them)
    failures: int = 0  # consecutive executions that failed outside the workflow's code


def child_key(child_id: str) -> str:
    """The mailbox key on which a parent learns that its child run ended."""
    return f"tether:child:{child_id}"


def child_outcome(status: RunStatus | str, result: str | None, error: str | None) -> str:
    """The payload of a child's end in its parent's mailbox: how it ended, with the texts of
    its result and error (the mailbox row is the parent's record of the child's end)."""
    return json.dumps({"status": str(status), "result": result, "error": error})


@dataclass(frozen=True, slots=True)
class EventRef:
    id: int
    run_id: str
    key: str


@dataclass(frozen=True, slots=True)
class Checkpoint:
    seq: int  # the row's key in the run's history: the order in which it was first recorded
    name: str  # "search_docs", "search_docs#2", "now#3", "search_docs@1" (in a workflow task)
    kind: str  # "step", "now", "uuid4", "random", ...
    status: CheckpointStatus
    result: str | None = None  # JSON
    error: str | None = None  # JSON {type, message, traceback}
    attempts: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    # A RETRYING checkpoint's: when the next attempt is due; an at-most-once STARTED marker's:
    # when its attempt is over for certain (its timeout); a started wait's: its deadline.
    retry_at: float | None = None
    # Its identity, the same on every execution (see POSITIONS); "" reads as str(seq), the
    # position of checkpoints recorded before positions, all in the workflow's own task.
    position: str = ""
    # A step's (a child start's) arguments, compared on replay: their canonical JSON, or
    # {"$digest": its sha256} when long; None where not recorded (an older row, not JSON).
    args: str | None = None

    @property
    def at(self) -> str:
        """Its position."""
        return self.position or str(self.seq)


# A checkpoint's position: the path of the workflow task that asked for it from the root task
# (each step the index of a task among those its parent task created), then the checkpoint's
# sequence within that task, "/"-joined: "3" is the workflow's own fourth checkpoint, "1/0"
# the first of the second task it created. Scheduling does not move it: it depends only on
# the code and the recorded results.
POSITIONS = "task path / sequence in the task"


@dataclass(frozen=True, slots=True)
class Lease:
    run_id: str
    worker_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class NewRun:
    id: str
    workflow: str
    args: str
    deadline_at: float | None = None
    parent_id: str | None = None
    queue: str | None = None
    priority: int = 0  # higher is claimed sooner, within a queue and outside queues alike
    dedup_key: str | None = None  # unique among the queue's unfinished runs
    started_by: str | None = None
    wake_at: float | None = None  # created waiting until then (app.start_at); None: due now


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """Limits a queue's runs are claimed under; None is unlimited."""

    concurrency: int | None = None  # running at once, across all workers
    worker_concurrency: int | None = None  # running at once on one worker
    rate: int | None = None  # first claims (starts) per `period` seconds
    period: float = 60.0


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    id: str
    host: str
    pid: int
    pid_token: str  # identifies this incarnation of the pid (process start time), against reuse
    started_at: float = 0.0
    heartbeat_at: float = 0.0
    workflows: tuple[str, ...] | None = None  # what it claims; None: unknown (an older worker)
    # Where its pid means something: the kernel's boot and the PID namespace. A worker is
    # judged by its pid only where both are this process's own ("" where unknown).
    boot_id: str = ""
    pid_ns: str = ""


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    lost: list[str]  # run ids whose lease this worker no longer holds
    cancel: list[str]  # run ids it holds that someone asked to cancel
    unknown: bool = False  # the worker has no row (it was deleted): it must register again


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counts for monitoring (/metrics), read in one transaction."""

    runs: Mapping[RunStatus, int]  # every status, 0 when it has no run
    pending_approvals: int
    oldest_pending_approval_at: float | None  # created_at of the oldest pending approval


class Store(Protocol):
    """A database that Tether can run on. One method, one transaction."""

    url: str

    async def open(self) -> None:
        """Connect and bring the schema to the current version (idempotent)."""

    async def close(self) -> None:
        """Finish pending writes and release connections."""

    def another(self) -> Store | None:
        """Another handle on the same database with connections of its own, not yet open,
        for a thread with its own event loop (the worker's keepalive); None where the data
        lives in this one object (memory)."""

    async def register_worker(self, worker: WorkerInfo, now: float) -> None:
        """Insert or refresh this worker's row (host, pid, the workflows it serves, heartbeat)."""

    async def list_workers(self, host: str | None = None) -> list[WorkerInfo]:
        """Workers known to the database, optionally only those on one host."""

    async def release_worker(self, worker_id: str, now: float) -> list[str]:
        """Forget a dead worker: every run it leased becomes claimable now (its lease is
        expired, its epoch kept so the next claim fences the dead owner). Returns their ids."""

    async def heartbeat(
        self, worker_id: str, leases: Sequence[Lease], lease_until: float, now: float
    ) -> HeartbeatReply:
        """Extend the leases this worker still holds to lease_until and refresh its row.
        Reports leases it lost, runs it holds whose cancellation was requested, and whether
        its row is gone (then it must register again)."""

    async def database_time(self) -> float | None:
        """The database server's clock (seconds since the epoch), which leases are judged by
        when workers on many machines share it; None where the database has no clock of its
        own (SQLite, memory: the local clock is the one clock)."""

    async def create_run(
        self,
        run: NewRun,
        now: float,
        *,
        owner: str | None = None,
        lease_until: float | None = None,
    ) -> tuple[RunRecord, bool]:
        """Insert the run unless its id exists. Returns (the stored run, whether it was created).
        With owner, a new run is created already claimed by that worker (epoch 1); without,
        and with run.wake_at, it is created waiting until then. Raises
        DuplicateRun if an unfinished run of the same queue has the same dedup key."""

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run with this id, or None."""

    async def list_runs(
        self,
        *,
        statuses: Sequence[RunStatus] = (),
        workflow: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        """Runs, newest first (by created_at, then id), filtered by status and workflow name;
        with `before` (created_at, id of the last run of the previous page) only older ones."""

    async def claim_runs(
        self,
        worker_id: str,
        workflows: Sequence[str],
        now: float,
        lease_until: float,
        limit: int,
        queues: Mapping[str, QueueLimits] | None = None,
    ) -> list[RunRecord]:
        """Take up to `limit` runnable runs of these workflows: pending ones due now, waiting
        ones whose wake_at has come, running ones whose lease expired. Each claim sets the
        owner, increments the epoch, sets status running (and started_at, the first time).
        Highest priority first, then oldest. Runs of a queue in `queues` are claimed within
        its limits: running runs (with a live lease) across workers and on this worker, and
        first claims in the last `period` seconds; claims of one queue are serialized."""

    async def next_wake_at(self, workflows: Sequence[str]) -> float | None:
        """The earliest future time at which a run of these workflows becomes claimable."""

    async def load_history(self, run_id: str) -> list[Checkpoint]:
        """The run's checkpoints, ordered by seq, each with its position and arguments."""

    async def write_checkpoint(self, lease: Lease, checkpoint: Checkpoint, now: float) -> None:
        """Insert or replace the checkpoint at (run, seq); the run row is left as it is (this
        is the hot path: one row). Raises LeaseLost if the lease is not held. Durable when this
        returns."""

    async def suspend_run(
        self, lease: Lease, wake_at: float | None, now: float, wake_on: Sequence[str] = ()
    ) -> None:
        """Release the run as waiting until wake_at, or until an event arrives for one of the
        `wake_on` keys; if such an event is already in the mailbox, or a cancel request is
        pending, the run is claimable at once. The run made progress: its failures become 0,
        their error None. Raises LeaseLost if the lease is not held."""

    async def finish_run(
        self,
        lease: Lease,
        status: RunStatus,
        result: str | None,
        error: str | None,
        now: float,
    ) -> None:
        """Record the run's final status and result or error; releases the lease. A child run
        also delivers the event `child_key(its id)` to its parent, in the same transaction.
        The event's payload is `child_outcome(...)`. The run's pending approvals are cancelled
        (approval_rows.cancel_on_run_end). Raises LeaseLost if the lease is not held."""

    async def fail_execution(
        self, lease: Lease, error: str, failures: int, retry_at: float | None, now: float
    ) -> None:
        """An execution of the run failed outside the workflow's code (the engine could not
        execute it): store `error` and `failures` (how many such failures in a row) on the run
        and release the lease. With `retry_at` the run waits until then (wake_on cleared), then
        is claimable again; without, it is dead: ended as finish_run ends a run (its pending
        approvals cancelled, its parent told, with status dead). Raises LeaseLost if the lease
        is not held."""

    async def hold_run(
        self, lease: Lease, error: str, failures: int, wake_at: float, now: float
    ) -> None:
        """Replay of the run diverged from its history: store `error` (what differed) and
        `failures` on the run, release the lease and leave it held until `wake_at`, then
        claimable again (wake_on cleared). Nothing else changes: its approvals stay pending,
        its parent is not told. Raises LeaseLost if the lease is not held."""

    async def wake_held(self, workflows: Sequence[str], now: float) -> int:
        """Make the held runs of these workflows claimable now (a worker with new code came):
        returns how many."""

    async def dead_letter_unserved(
        self, since: float, error: Callable[[str, str], str], now: float
    ) -> list[str]:
        """Runs claimable since before `since` (pending, waiting with wake_at, or running with
        an expired lease, since then; never held ones) whose workflow no worker that
        heartbeated since `since` serves end dead, each with `error(its id, its workflow)`, as
        finish_run ends a run. Does nothing while such a worker's workflows are unknown (None).
        Returns their ids."""

    async def cancel_run(self, run_id: str, error: str, now: float) -> RunRecord:
        """Cancel a run and, the same way, its unfinished children: one nobody holds ends
        cancelled at once (with this error, and its pending approvals cancelled as in
        finish_run); one that a worker holds is flagged and its worker ends it. Finished runs
        are left as they are. Raises RunNotFound."""

    async def resume_run(
        self, run_id: str, now: float, deadline_at: float | None, retry: str | None = None
    ) -> RunRecord:
        """Give a failed, dead or held run another go after a fix: it becomes pending (error
        cleared, failures 0, its deadline `deadline_at`), and the failed checkpoint at position
        `retry` (the failure that ended the run) becomes retrying, due now, so that step gets
        one more attempt under the current code while the rest replays as recorded (failures
        the workflow caught among them). A run in another status is returned unchanged.
        Raises RunNotFound, and DuplicateRun if an unfinished run of its queue now holds its
        dedup key."""

    async def deliver_event(self, run_id: str, key: str, payload: str, now: float) -> RunRecord:
        """Append an event to the run's mailbox, unless the run has finished (then nothing is
        written). A waiting run whose wake_on holds the key becomes claimable at once. Returns
        the run as it was before. Raises RunNotFound."""

    async def take_event(
        self, lease: Lease, keys: Sequence[str], checkpoint: Checkpoint, now: float
    ) -> str | None:
        """Consume the oldest unconsumed event among `keys` and write `checkpoint` with the
        result {"key": key, "value": payload} in the same transaction; returns that result.
        With no such event nothing is written and None is returned. Raises LeaseLost."""

    async def events_after(self, event_id: int, limit: int = 1000) -> list[EventRef]:
        """Events appended after `event_id`, oldest first: how a worker holding waits in
        memory learns of events that other processes delivered."""

    async def last_event_id(self) -> int:
        """The id of the newest event (0 when none)."""

    async def poll_changes(self) -> bool:
        """Whether another connection may have committed since the last call: a cheap look a
        worker takes every few milliseconds. Backends that push notifications may return
        False and wake workers themselves."""

    async def stats(self) -> StoreStats:
        """How many runs have each status, how many approvals are pending and when the oldest
        of them was created, in one consistent read (for monitoring; served by indexes)."""

    # -- approvals (see approval_rows) -------------------------------------------------------

    async def create_approval(
        self, lease: Lease, record: ApprovalRecord, now: float
    ) -> tuple[ApprovalRecord, bool]:
        """Insert the approval with its first audit entry ("created", actor None, detail
        {"title": title}), unless one with its id exists. Returns (the stored approval,
        whether it was created). Raises LeaseLost if the lease is not held."""

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        """The approval with this id, or None."""

    async def list_approvals(
        self, *, status: str | None = None, run_id: str | None = None, limit: int = 100
    ) -> list[ApprovalRecord]:
        """Approvals, oldest first, filtered by status and run."""

    async def change_approval(
        self, approval_id: str, change: ChangeFn, now: float
    ) -> tuple[ApprovalRecord, ApprovalChange]:
        """Atomically: lock the approval, call `change(record, status of its run or None,
        now)` (pure, no I/O), store apply_change's row and audit entries, and deliver
        `change.event` (if any) to the run's mailbox under approval_key(id), as deliver_event
        does. Returns (the approval as stored after, the change). Raises ApprovalNotFound."""

    async def approval_audit(self, approval_id: str) -> list[AuditEntry]:
        """The approval's audit entries ordered by seq (empty if none)."""

    # -- users of the server (see user_rows) --------------------------------------------------

    async def put_user(self, user: UserRecord) -> None:
        """Insert the user, or replace the one with its name (a new token, new groups)."""

    async def get_user(self, name: str) -> UserRecord | None:
        """The user with this name (revoked ones too), or None."""

    async def user_by_token(self, token_hash: str) -> UserRecord | None:
        """The user whose token has this hash (revoked ones too), or None."""

    async def list_users(self) -> list[UserRecord]:
        """Every user, by name."""

    async def revoke_user(self, name: str, now: float) -> UserRecord | None:
        """Mark the user revoked (keeping the first revocation time); None if unknown."""

    # -- streams (append-only, offset-addressed logs of a run's chunks; see docs/streams.md) --

    async def append_stream(
        self, lease: Lease, key: str, entries: Sequence[StreamAppend], now: float
    ) -> list[int]:
        """Append `entries`, in order, to the stream (lease.run_id, key) and return their
        offsets: contiguous from the stream's end (its first entry is offset 0), never handed
        out twice, even to concurrent appenders in other processes. An entry whose ref the
        stream already holds (from an earlier append, or earlier in this one) is not written:
        its offset is the one stored under that ref. Raises LeaseLost if the lease is not held
        (nothing is written)."""

    async def read_stream(
        self, run_id: str, key: str, offset: int, limit: int
    ) -> list[StreamEntry]:
        """Up to `limit` entries of the stream from `offset` on, by offset (empty for a stream
        or run that does not exist)."""

    async def stream_unretracted(self, run_id: str, key: str, writer: str) -> list[int]:
        """The offsets of the chunks that `writer` appended to the stream and that no reset
        names, in order (`unretracted` of the writer's entries)."""

    # -- transactions and the outbox (see outbox_rows) ----------------------------------------

    async def run_transaction(
        self, lease: Lease, body: TransactionBody, checkpoint: Checkpoint, now: float
    ) -> str:
        """In one transaction of this database: call `body(connection)` (a connection to this
        database inside the transaction, guarded so that the body cannot commit, roll back or
        end it), insert the messages it returns into the outbox (pending, due now; an id the
        outbox holds is skipped), and write `checkpoint` with result = the text it returns;
        commit, and return that text. The lease is checked before the body runs and held to
        the commit. A body that raises rolls everything back and its exception propagates as
        it is (an SQL error of the body is the body's, not StoreUnavailable). Raises LeaseLost
        (nothing written), StoreUnavailable when the database fails."""

    async def claim_outbox(
        self, worker_id: str, now: float, claim_until: float, limit: int
    ) -> list[OutboxMessage]:
        """Take up to `limit` messages to send, soonest due first: pending ones due by `now`,
        and sending ones whose claim expired or whose claimer's worker row is gone (their
        send's outcome is unknown: `uncertain` grows by one and `in_doubt` is set). Each
        becomes sending, claimed by `worker_id` until `claim_until` (next_at), with one more
        attempt and claim. Two claimers never get the same message at once."""

    async def settle_outbox(
        self, message_id: str, claim: int, settlement: OutboxSettlement, now: float
    ) -> bool:
        """Record how the send of a claimed message ended (delivered, pending again at
        settlement.next_at, or failed), if the message is still sending under this `claim`;
        returns whether it was. A claim that expired and was taken again is not recorded."""

    async def next_outbox_at(self) -> float | None:
        """When the next message becomes claimable (0 for one whose claimer's worker row is
        gone), or None when no message is pending or sending."""

    async def list_outbox(
        self,
        *,
        status: OutboxStatus | None = None,
        run_id: str | None = None,
        limit: int = 100,
    ) -> list[OutboxMessage]:
        """Messages, oldest first, filtered by status and run."""

    async def retry_outbox(self, message_id: str, now: float) -> OutboxMessage | None:
        """A failed message becomes pending, due now, with its attempts at 0 (after a fix
        on the receiver's side); one in another status is left as it is. Returns the message
        as stored after, None if there is no such message."""

    # -- schedules (see schedule_rows) ----------------------------------------------------------

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

    # -- values and forks (see value_rows) ------------------------------------------------------

    async def set_value(
        self, lease: Lease, key: str, value: str, checkpoint: Checkpoint, now: float
    ) -> int:
        """Publish `value` (JSON) as the next version of (lease.run_id, key) (1 for its first)
        and write `checkpoint` with the result {"key": key, "version": n} in the same
        transaction; returns n. Raises LeaseLost if the lease is not held (nothing written)."""

    async def get_value(self, run_id: str, key: str) -> ValueRecord | None:
        """The latest (highest) version of the run's value `key`, or None."""

    async def list_values(self, run_id: str) -> list[ValueRecord]:
        """The latest version of each of the run's values, by key."""

    async def fork_run(
        self,
        run: NewRun,
        link: ForkRecord,
        checkpoints: Sequence[Checkpoint],
        events: Sequence[tuple[str, str]],
        now: float,
    ) -> tuple[RunRecord, bool]:
        """Create run `run` as a fork of link.source_run_id, unless its id exists (then write
        nothing and return (that run, False)). In one transaction: the run, pending (as
        create_run without owner); `checkpoints` as its history; the source's value versions
        set at the positions of those checkpoints; the source's mailbox events whose key does
        not start with "tether:" and which none of those checkpoints consumed (in their
        order); `events` (key, payload) appended to its mailbox after them; and the link.
        Returns (the stored run, True)."""

    async def get_fork(self, run_id: str) -> ForkRecord | None:
        """The link of a run created by fork_run, or None for any other run."""

    async def list_forks(self, source_run_id: str) -> list[ForkRecord]:
        """The links of the runs forked from this one, oldest first."""

    # -- retention and sizes (see retention_rows) -----------------------------------------------

    async def purge_runs(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        """Delete, in one transaction, about `limit` rows of runs that ended (succeeded,
        failed, cancelled, dead) before `before`, oldest first from after the cursor: each
        run's checkpoints, events, stream entries, values, fork link (the one naming it as the
        fork) and delivered or failed outbox messages, then the run row once nothing of it is
        left. A run with more rows than `limit` takes several calls; its row goes last. Kept
        whole: a run whose parent is unfinished, one with an unfinished child, and one with an
        outbox message neither delivered nor failed. Approvals are not touched (purge_approvals).
        With dry_run nothing is deleted and the counts are those of whole runs. Returns the rows
        per table and the cursor of the next call (None: nothing more ended before `before`)."""

    async def purge_streams(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        """Delete, in one transaction, up to about `limit` stream entries of runs that ended
        before `before` (the runs themselves stay), oldest run first from after the cursor;
        returns them per table and the cursor of the next call, as purge_runs does."""

    async def purge_approvals(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        """Delete, in one transaction, up to about `limit` rows of approvals whose run is gone,
        that are not pending and whose last change is older than `before`: their audit
        entries, then the approval. Ordered by last change from after the cursor; returns the
        rows per table and the cursor of the next call, as purge_runs does."""

    async def compact(self, max_pages: int) -> int:
        """Give up to `max_pages` free pages of the database back to the file system in one
        short transaction (SQLite with auto_vacuum=incremental; the file shrinks at the next
        WAL checkpoint). Returns the bytes given back: 0 where there is nothing to do or the
        backend leaves it to the database (PostgreSQL's autovacuum, memory)."""

    async def vacuum(self) -> int | None:
        """Rebuild the database at its smallest (SQLite: VACUUM, which also turns on incremental
        auto_vacuum, then a WAL checkpoint; PostgreSQL: VACUUM ANALYZE of Tether's tables, which
        makes their free space reusable). Writers wait meanwhile. Returns the bytes the
        database file shrank by, None where unknown."""

    async def checkpoint_wal(self) -> WalState | None:
        """SQLite: copy the write-ahead log into the database without waiting for anyone
        (PASSIVE), then, if it is all copied and the -wal file is larger than the journal size
        limit, truncate it unless a reader or writer is at work. None for backends without such
        a log to look after (PostgreSQL, memory)."""

    async def storage_sizes(self) -> StorageSizes:
        """The database's size: files or whole database, and each Tether table's rows (exact
        counts) and bytes with its indexes (where the backend can tell)."""

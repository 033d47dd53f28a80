"""The core of the Store port: runs, the workers that lease them, their checkpoints and their
mailboxes; the records these operations take and give, and the operations themselves.

Each operation is one transaction; writes for a run are fenced by its Lease. Times are float
seconds since the epoch (UTC); values are JSON text made by tether.serde, opaque to the store.
It must not import tether.core or any backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tether.store.port import Store


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
    # The application version it is pinned to (docs/versions.md): only workers of that version
    # claim it. None until its first claim (or a run made before versions existed).
    version: str | None = None
    # JSON of the W3C trace context it was started under (traceparent, tracestate), or None.
    trace_context: str | None = None


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
    trace_context: str | None = None  # JSON of the W3C trace context of the caller's span


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
    version: str | None = None  # the application version it runs; None: an older worker


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
    # Runs a claim would take now (due, or their lease expired), by queue ("" outside queues);
    # only queues that have such runs.
    due: Mapping[str, int]
    # Outbox messages not delivered by status: "pending", "sending", "failed" (0 when none),
    # and how many of them are in doubt (claimed again after a send of unknown outcome).
    outbox: Mapping[str, int]
    outbox_in_doubt: int


class CorePort(Protocol):
    """The core operations: workers, runs, checkpoints, events."""

    url: str

    async def open(self) -> None:
        """Connect and bring the schema to the current version (idempotent)."""

    async def close(self) -> None:
        """Finish pending writes and release connections."""

    def another(self) -> Store | None:
        """Another handle on the same database with connections of its own, not yet open,
        for a thread with its own event loop (the worker's keepalive); None where the data
        lives in one object of one process (a MemoryStore: a private file)."""

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
        own (SQLite: the local clock is the one clock)."""

    async def create_run(
        self,
        run: NewRun,
        now: float,
        *,
        owner: str | None = None,
        lease_until: float | None = None,
        version: str | None = None,
    ) -> tuple[RunRecord, bool]:
        """Insert the run unless its id exists. Returns (the stored run, whether it was created).
        With owner, a new run is created already claimed by that worker (epoch 1) and pinned to
        `version`, the one the owner declares (as claim_runs pins a run it claims); without,
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
        queue: str | None = None,
        version: str | None = None,
        started_by: str | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
        id_prefix: str | None = None,
    ) -> list[RunRecord]:
        """Runs, newest first (by created_at, then id), filtered by status (any of them),
        workflow name, queue, version and starter (each equal), creation time
        (created_after <= created_at < created_before) and the start of their id (`id_prefix`,
        matched literally: `%` and `_` are plain characters); with `before` (created_at, id of
        the last run of the previous page) only older ones. Every filter is served by an index,
        so a page costs about the same on a million runs as on a hundred."""

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
        """Take up to `limit` runnable runs of these workflows: pending ones due now, waiting
        ones whose wake_at has come, running ones whose lease expired. Each claim sets the
        owner, increments the epoch, sets status running (and started_at, the first time).
        With `version` (the claiming worker's), only runs pinned to it, not pinned yet, or
        (with `live_since`) pinned to a version no worker of which heartbeated since then are
        taken, and each is pinned to it; None takes any and pins none.
        Highest priority first, then oldest. Runs of a queue in `queues` are claimed within
        its limits: running runs (with a live lease) across workers and on this worker, and
        first claims in the last `period` seconds; claims of one queue are serialized."""

    async def next_wake_at(
        self,
        workflows: Sequence[str],
        *,
        version: str | None = None,
        live_since: float | None = None,
    ) -> float | None:
        """The earliest future time at which a run of these workflows becomes claimable (by
        a worker of `version`, as claim_runs counts it with `live_since`)."""

    async def load_history(self, run_id: str) -> list[Checkpoint]:
        """The run's checkpoints, ordered by seq, each with its position and arguments."""

    async def load_histories(self, run_ids: Sequence[str]) -> dict[str, list[Checkpoint]]:
        """load_history of each of these runs in one read (a run without checkpoints, or
        unknown, is absent): what a worker that claimed them needs before executing them."""

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
        *,
        checkpoints: Sequence[Checkpoint] = (),
    ) -> None:
        """Record the run's final status and result or error; releases the lease. A child run
        also delivers the event `child_key(its id)` to its parent, in the same transaction.
        The event's payload is `child_outcome(...)`. The run's pending approvals are cancelled
        (audit.cancel_on_run_end). `checkpoints` (the last ones the execution completed) are
        written in the same transaction, as write_checkpoint writes them. Raises LeaseLost if
        the lease is not held."""

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
        cleared, failures 0, its deadline `deadline_at`, unpinned: the fix is new code, so its
        next claim pins it to its version), and the failed checkpoint at position
        `retry` (the failure that ended the run) becomes retrying, due now, so that step gets
        one more attempt under the current code while the rest replays as recorded (failures
        the workflow caught among them). A run in another status is returned unchanged.
        Raises RunNotFound, and DuplicateRun if an unfinished run of its queue now holds its
        dedup key."""

    async def move_version(self, run_id: str, version: str | None, now: float) -> RunRecord:
        """Pin an unfinished run to `version` (None: unpinned, its next claim pins it); a
        worker executing it now goes on, later claims are by that version (as claim_runs
        counts it). A finished
        run is returned unchanged. Raises RunNotFound."""

    async def version_counts(self) -> dict[str | None, int]:
        """How many unfinished runs are pinned to each version (None: not pinned yet)."""

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

    async def stats(self, now: float) -> StoreStats:
        """How many runs have each status, how many are due to be claimed at `now` by queue,
        the outbox's backlog, how many approvals are pending and when the oldest of them was
        created, in one consistent read (for monitoring; served by indexes)."""

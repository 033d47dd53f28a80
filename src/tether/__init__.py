"""Tether: durable execution for AI agents and long-running automations.

How the system works, in one page. A *workflow* is an `async def` registered with
`@app.workflow()`; it orchestrates *steps*, functions registered with `@app.step()` that do the
I/O. `app.start(workflow, ..., id=...)` creates a *run* row (the id is the idempotency key). A
*worker* (the in-process one of `async with app:`, or `tether worker module:app`) claims
runnable runs through the Store port: each claim takes a *lease* and bumps the run's epoch, so a
worker that lost its lease has its next write rejected. The runner executes the workflow; every
step call takes a position in the run's history (its task's path among the tasks workflow code
created, then its sequence in that task: never the order asyncio ran them in), and its outcome
(result, error, retry state) is written as a *checkpoint* before the workflow sees it. After a
crash, another worker claims the run and *replays* the workflow: recorded checkpoints return
their recorded values without running the body, and nothing new runs before the whole history
was asked for again. Replay that asks for another name or other arguments than the history holds
*holds* the run (a rollback heals it) instead of re-running effects. `tether.now()`, `uuid4()`
and `random()` are recorded too. Waits (sleep, events from the run's mailbox, child runs, the
first of several) are checkpoints as well: a run holds its worker for a short wait, then
suspends, holding nothing, until the store wakes it. Retries wait durably: the due time of the
next attempt is stored, and a long delay releases the run until then. Steps declared
`at_most_once` write a start marker naming their owner; an outcome in doubt (a crash, a lost
lease, a timeout) is reconciled by a hook once the attempt is over for certain, or fails with
StepOutcomeUnknown, never silently re-run. Leases follow the database's clock. Both databases
group-commit: the checkpoints of many runs share one transaction and one flush (SQLite: WAL,
synchronous=FULL; PostgreSQL: queued writes, pipelined). Values are JSON (never pickle),
rebuilt from type hints. A run writes chunks to *streams* (`tether.stream(key).write(...)`):
append-only logs, offset by offset, that `app.read_stream` follows live; a failed step
attempt's chunks are retracted by a reset marker.

Layering, imports pointing downwards only (tests/test_layout.py; docs/architecture.md maps
every module): cli -> server -> integrations -> app, sync, testing, views, users, actions -> agents,
models -> approvals, streams, telemetry, outbox, schedules, values, forks, retention -> core
(the engine) -> store (the Store port, its operations written once as named queries, run by
the SQLite or the PostgreSQL driver; the backend is chosen by URL at run time, never imported
by core) -> serde, clock, errors, faults, redact, webhooks, text.
"""

from __future__ import annotations

from datetime import datetime

from tether import models
from tether.agents import Agent, AgentResult, MaxTurnsExceeded, Tool
from tether.app import App, Rate
from tether.approvals import (
    APPROVE_REJECT,
    Approval,
    Decision,
    EmailNotifier,
    HistoryEntry,
    LogNotifier,
    Notifier,
    Option,
    Reviewer,
    SlackNotifier,
    Webhook,
    approval,
    operation_digest,
)
from tether.clock import to_datetime
from tether.core.context import idempotency_key
from tether.core.doubt import NOT_DONE
from tether.core.handle import ForkInfo, RunHandle, RunInfo
from tether.core.recorded import now_seconds, patched, random, uuid4
from tether.core.retry import NO_RETRY, Retry
from tether.core.start import ChildHandle, start_child
from tether.core.step import Step
from tether.core.waits import (
    Winner,
    event,
    sleep,
    sleep_until,
    timer,
    timer_until,
    wait_any,
    wait_for_event,
)
from tether.core.workflow import Named, Workflow
from tether.errors import (
    ApprovalNotFound,
    ApprovalRefused,
    ArgumentsRefused,
    ConfigurationError,
    DuplicateRun,
    EventRefused,
    IdempotencyConflict,
    LeaseLost,
    NonDeterminismError,
    NotInWorkflow,
    PayloadTooLarge,
    PermanentError,
    RunCancelled,
    RunDead,
    RunFailed,
    RunNotFound,
    SerializationError,
    StepFailed,
    StepInterrupted,
    StepOutcomeUnknown,
    StepTimeout,
    StoreUnavailable,
    TetherError,
    ValueNotFound,
    WaitTimeout,
    WorkflowTimeout,
)
from tether.outbox import HttpSender, OutboxMessage, Sender, outbox
from tether.retention import Retention
from tether.store.port import Checkpoint, CheckpointStatus, RunStatus
from tether.streams import StreamReset, stream
from tether.sync import SyncApp, SyncRunHandle
from tether.values import ValueInfo, set_value

__version__ = "0.1.0"


def now() -> datetime:
    """The current time (UTC), recorded: the same value when the run replays."""
    return to_datetime(now_seconds())


__all__ = [
    "ArgumentsRefused",
    "Named",
    "Retention",
    "Sender",
    "outbox",
    "OutboxMessage",
    "HttpSender",
    "set_value",
    "ValueInfo",
    "ValueNotFound",
    "ForkInfo",
    "models",
    "Tool",
    "MaxTurnsExceeded",
    "AgentResult",
    "Agent",
    "APPROVE_REJECT",
    "operation_digest",
    "approval",
    "Webhook",
    "Reviewer",
    "Option",
    "Notifier",
    "LogNotifier",
    "EmailNotifier",
    "SlackNotifier",
    "HistoryEntry",
    "Decision",
    "ApprovalRefused",
    "ApprovalNotFound",
    "Approval",
    "NOT_DONE",
    "NO_RETRY",
    "App",
    "Checkpoint",
    "CheckpointStatus",
    "ChildHandle",
    "ConfigurationError",
    "DuplicateRun",
    "EventRefused",
    "IdempotencyConflict",
    "LeaseLost",
    "NonDeterminismError",
    "NotInWorkflow",
    "PayloadTooLarge",
    "PermanentError",
    "Rate",
    "Retry",
    "RunCancelled",
    "RunDead",
    "RunFailed",
    "RunHandle",
    "RunInfo",
    "RunNotFound",
    "RunStatus",
    "SerializationError",
    "Step",
    "StepFailed",
    "StepInterrupted",
    "StepOutcomeUnknown",
    "StepTimeout",
    "StoreUnavailable",
    "StreamReset",
    "SyncApp",
    "SyncRunHandle",
    "TetherError",
    "WaitTimeout",
    "Workflow",
    "Winner",
    "WorkflowTimeout",
    "event",
    "idempotency_key",
    "now",
    "patched",
    "random",
    "sleep",
    "sleep_until",
    "start_child",
    "stream",
    "timer",
    "timer_until",
    "uuid4",
    "wait_any",
    "wait_for_event",
]

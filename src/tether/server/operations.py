"""What the operations pages show, read once for the pages (console.py), the JSON API (api.py)
and their live digest (live.py): workers, queues, schedules, the outbox and dead runs as typed
records, which are also the API's response models; and the one action, sending a failed outbox
message again. Reads compose App and Store operations. Nothing here renders HTML or decides what
the library decides (which message may be sent again is App.retry_outbox's rule), and no
destination or error leaves it unredacted.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.main import IncEx

from tether.actions import Actor, recorded
from tether.app import App
from tether.clock import to_datetime
from tether.errors import ConfigurationError
from tether.redact import redact_text
from tether.schedules import Cron, ScheduleInfo
from tether.server.counts import recent_counts
from tether.store.port import QueueLimits, RunRecord, RunStatus, WorkerInfo
from tether.store.port.outbox import OutboxMessage, OutboxStatus
from tether.text import visible
from tether.views import iso, run_json, stored_error

log = logging.getLogger("tether.server")

# Running runs are read (newest first, a page at a time) to count them by worker and queue; a
# database with more than this many running at once shows the counts as lower bounds.
SCAN_LIMIT = 5000
_SCAN_PAGE = 500
LIST_LIMIT = 200  # rows per outbox section and on the dead runs page
NEXT_SLOTS = 3  # upcoming slots shown per schedule
SCHEDULE_RUNS = 5  # latest runs shown per schedule
CHANNELS = {"page": "the operations page", "api": "the JSON API", "cli": "the CLI"}  # the via


def _at(seconds: float) -> str:
    """A store time (seconds since the epoch) as the API gives times: ISO 8601, UTC."""
    return to_datetime(seconds).isoformat()


class Record(BaseModel):
    """A record of what a page shows: frozen, and a response model of the JSON API."""

    model_config = ConfigDict(frozen=True)


# -- workers --------------------------------------------------------------------------------------


class WorkerOut(Record):
    """A worker the database knows."""

    id: str
    host: str
    pid: int
    version: str | None = Field(description="The application version it runs (null: unknown)")
    workflows: list[str] | None = Field(
        description="The workflows it claims, by name (null: unknown, an older worker)"
    )
    started_at: str
    heartbeat_at: str
    silent_seconds: float = Field(description="Seconds since its last heartbeat")
    stale: bool = Field(
        description="Silent for longer than the lease: it holds nothing another worker cannot take"
    )
    runs: int = Field(description="Running runs it holds now")


class WorkersOut(Record):
    """Every worker the database knows, the most recent heartbeat first."""

    workers: list[WorkerOut]
    lease_seconds: float
    partial: bool = Field(
        description=f"More than {SCAN_LIMIT} runs are running: the run counts are lower bounds"
    )


@dataclass(frozen=True, slots=True)
class Running:
    """The running runs as one scan read them: by owner and by queue ("" outside queues)."""

    by_owner: dict[str, int]
    by_queue: dict[str, int]
    partial: bool  # the scan stopped at SCAN_LIMIT: counts are lower bounds

    @classmethod
    def of(cls, runs: Sequence[RunRecord], partial: bool) -> Running:
        by_owner: dict[str, int] = {}
        by_queue: dict[str, int] = {}
        for run in runs:
            if run.owner is not None:
                by_owner[run.owner] = by_owner.get(run.owner, 0) + 1
            by_queue[run.queue or ""] = by_queue.get(run.queue or "", 0) + 1
        return cls(by_owner, by_queue, partial)


async def running(app: App) -> Running:
    """Count the running runs, a page of list_runs at a time, up to SCAN_LIMIT."""
    store, found = app.engine.store, list[RunRecord]()
    before: tuple[float, str] | None = None
    while len(found) < SCAN_LIMIT:
        page = await store.list_runs(statuses=[RunStatus.RUNNING], limit=_SCAN_PAGE, before=before)
        found += page
        if len(page) < _SCAN_PAGE:
            return Running.of(found, partial=False)
        before = (page[-1].created_at, page[-1].id)
    return Running.of(found[:SCAN_LIMIT], partial=True)


def worker_out(w: WorkerInfo, now: float, lease: float, counted: Running) -> WorkerOut:
    silent = now - w.heartbeat_at
    return WorkerOut(
        id=w.id, host=w.host, pid=w.pid, version=w.version,
        workflows=None if w.workflows is None else sorted(w.workflows),
        started_at=_at(w.started_at), heartbeat_at=_at(w.heartbeat_at), silent_seconds=silent,
        stale=silent > lease,  # its leases ran out
        runs=counted.by_owner.get(w.id, 0),
    )  # fmt: skip


async def workers(app: App) -> WorkersOut:
    await app.open()
    engine = app.engine
    now, counted = engine.clock.now(), await running(app)
    listed = sorted(await engine.store.list_workers(), key=lambda w: (-w.heartbeat_at, w.id))
    lease = engine.settings.lease_duration
    return WorkersOut(workers=[worker_out(w, now, lease, counted) for w in listed],
                      lease_seconds=lease, partial=counted.partial)  # fmt: skip


# -- queues ---------------------------------------------------------------------------------------


class QueueLimitsOut(Record):
    """A queue's limits (app.queue); null is unlimited."""

    concurrency: int | None = Field(description="Running at once, across all workers")
    worker_concurrency: int | None = Field(description="Running at once on one worker")
    rate: int | None = Field(description="Starts per period_seconds")
    period_seconds: float


class QueueOut(Record):
    name: str = Field(description='The queue ("": runs outside any queue)')
    limits: QueueLimitsOut | None = Field(
        description="Null: this App sets no limits for the queue, which has work"
    )
    due: int = Field(description="Runs due to be claimed now")
    running: int
    workflows: list[str] = Field(description="The workflows this App registers on the queue")


class QueuesOut(Record):
    """The queues this App sets limits for, by name; then the others with work, by name."""

    queues: list[QueueOut]
    partial: bool = Field(
        description=f"More than {SCAN_LIMIT} runs are running: the running counts are lower bounds"
    )


def limits_out(limits: QueueLimits) -> QueueLimitsOut:
    return QueueLimitsOut(concurrency=limits.concurrency,
                          worker_concurrency=limits.worker_concurrency, rate=limits.rate,
                          period_seconds=limits.period)  # fmt: skip


async def queues(app: App) -> QueuesOut:
    await app.open()
    engine = app.engine
    stats = await recent_counts(app).get()
    counted = await running(app)
    served: dict[str, list[str]] = {}
    for wf in engine.workflows.values():
        served.setdefault(wf.queue or "", []).append(wf.name)
    # Queues with work that this App sets no limits for ("" is runs outside any queue).
    others = sorted((set(stats.due) | set(counted.by_queue)) - set(engine.queues))
    limited = [(name, limits_out(limits)) for name, limits in sorted(engine.queues.items())]
    rows = [
        QueueOut(name=name, limits=limits, due=stats.due.get(name, 0),
                 running=counted.by_queue.get(name, 0), workflows=sorted(served.get(name, [])))
        for name, limits in [*limited, *((name, None) for name in others)]
    ]  # fmt: skip
    return QueuesOut(queues=rows, partial=counted.partial)


# -- schedules ------------------------------------------------------------------------------------


class ScheduleRunOut(Record):
    """A run of a schedule's slot (GET /api/runs/{id} has the rest)."""

    id: str
    status: RunStatus
    created_at: str | None
    finished_at: str | None


class ScheduleOut(Record):
    name: str
    workflow: str
    cron: str
    tz: str
    catch_up: str
    defined: bool = Field(description="This App's code defines it (else only the database does)")
    registered: bool = Field(description="A worker has registered it in the database")
    last_slot: str | None = Field(description="Every slot up to this one was handled")
    next_slots: list[str] = Field(description=f"The next {NEXT_SLOTS} slots, in UTC")
    runs: list[ScheduleRunOut] = Field(description=f"Its latest {SCHEDULE_RUNS} runs, newest first")


class SchedulesOut(Record):
    """The schedules this App defines and those the database holds, by name."""

    schedules: list[ScheduleOut]


def next_slots(info: ScheduleInfo, count: int) -> list[str]:
    """The schedule's next `count` slots from its next one (none if its cron does not parse
    here: a schedule only the database knows, stored by other code)."""
    if info.next_slot is None:
        return []
    moment = info.next_slot.timestamp()
    slots = [moment]
    try:
        cron = Cron(info.cron, info.tz)
    except ConfigurationError:
        return [_at(moment)]
    while len(slots) < count and (following := cron.next_after(moment)) is not None:
        slots.append(following)
        moment = following
    return [_at(s) for s in slots]


async def schedules(app: App) -> SchedulesOut:
    rows = []
    for info in await app.list_schedules():
        # A slot's run id is `schedule:<name>:<slot>`: the prefix finds the schedule's runs
        # among the workflow's others.
        recent = await app.list_runs(workflow=info.workflow, id_prefix=f"schedule:{info.name}:",
                                     limit=SCHEDULE_RUNS)  # fmt: skip
        runs = [ScheduleRunOut(id=r.id, status=r.status, created_at=iso(r.created_at),
                               finished_at=iso(r.finished_at)) for r in recent]  # fmt: skip
        rows.append(ScheduleOut(
            name=info.name, workflow=info.workflow, cron=info.cron, tz=info.tz,
            catch_up=info.catch_up, defined=info.defined, registered=info.registered,
            last_slot=iso(info.last_slot), next_slots=next_slots(info, NEXT_SLOTS), runs=runs,
        ))  # fmt: skip
    return SchedulesOut(schedules=rows)


# -- the outbox -----------------------------------------------------------------------------------


class OutboxMessageOut(Record):
    """An outbox message: its destination and error redacted (a URL may hold a password or a
    token in its query; an error may quote the receiver's answer)."""

    id: str
    run_id: str
    checkpoint: str = Field(description="The checkpoint it was committed with")
    destination: str
    status: OutboxStatus
    attempts: int = Field(description="Sends started")
    uncertain: int = Field(description="Sends whose outcome was never recorded")
    in_doubt: bool = Field(
        description="Claimed again after a send of unknown outcome: reconciled, or sent again "
        "with its idempotency key"
    )
    next_at: str = Field(description="Pending: when it is due; sending: when its claim expires")
    created_at: str
    updated_at: str
    delivered_at: str | None
    error_type: str | None = Field(description="The last failed send's error")
    error_message: str | None


class OutboxSection(Record):
    key: str
    label: str
    messages: list[OutboxMessageOut]


class OutboxPage(Record):
    """The outbox page: the messages not delivered, in four sections."""

    sections: list[OutboxSection]
    limit: int


def message_out(message: OutboxMessage) -> OutboxMessageOut:
    error = stored_error(message.error) or {}
    return OutboxMessageOut(
        id=message.id, run_id=message.run_id, checkpoint=message.checkpoint,
        destination=redact_text(message.destination), status=message.status,
        attempts=message.attempts, uncertain=message.uncertain, in_doubt=message.in_doubt,
        next_at=_at(message.next_at), created_at=_at(message.created_at),
        updated_at=_at(message.updated_at),
        delivered_at=None if message.delivered_at is None else _at(message.delivered_at),
        error_type=error.get("type"), error_message=error.get("message"),
    )  # fmt: skip


async def outbox(
    app: App, *, status: OutboxStatus | None = None, run_id: str | None = None, limit: int = 100
) -> list[OutboxMessageOut]:
    """Messages, oldest first, of this status and run (None: any)."""
    return [message_out(m) for m in await app.list_outbox(status=status, run_id=run_id,
                                                          limit=limit)]  # fmt: skip


async def outbox_page(app: App) -> OutboxPage:
    shown = (OutboxStatus.FAILED, OutboxStatus.SENDING, OutboxStatus.PENDING)
    found = {s: await outbox(app, status=s, limit=LIST_LIMIT) for s in shown}
    sending, pending = found[OutboxStatus.SENDING], found[OutboxStatus.PENDING]
    # In doubt: claimed again after a send whose outcome was never recorded (sending, or
    # pending again after that claim's send failed).
    sections = [
        OutboxSection(key="failed", label="Failed", messages=found[OutboxStatus.FAILED]),
        OutboxSection(key="in-doubt", label="In doubt",
                      messages=[m for m in sending + pending if m.in_doubt]),
        OutboxSection(key="sending", label="Sending",
                      messages=[m for m in sending if not m.in_doubt]),
        OutboxSection(key="pending", label="Pending",
                      messages=[m for m in pending if not m.in_doubt]),
    ]  # fmt: skip
    return OutboxPage(sections=sections, limit=LIST_LIMIT)


async def retry_message(app: App, message_id: str, actor: Actor) -> OutboxMessageOut:
    """The action: send a failed message again (App.retry_outbox: pending, due now, the same
    idempotency key), asked by `actor`; logged and kept in the trail of actions (refused too).
    Raises ConfigurationError for an unknown message or one that has not failed."""
    async with recorded(app, actor, "retry", message_id):
        sent = await app.retry_outbox(message_id)
    log.info(
        "outbox message %s is sent again, asked by %s from %s (%s)",
        visible(message_id, newlines=False), visible(actor.name, newlines=False),
        visible(actor.client, newlines=False), CHANNELS[actor.via],
    )  # fmt: skip
    return message_out(sent)


# -- dead runs ------------------------------------------------------------------------------------


class DeadPage(Record):
    """Dead runs, newest first, as GET /api/runs?status=dead gives them (errors redacted)."""

    runs: list[dict[str, Any]]
    limit: int


async def dead_runs(app: App) -> DeadPage:
    found = await app.list_runs(status=RunStatus.DEAD, limit=LIST_LIMIT)
    return DeadPage(runs=[run_json(r) for r in found], limit=LIST_LIMIT)


# -- the pages ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page:
    """An operations page: its tab's label, what it shows, and what of that its live digest
    leaves out (a pydantic `exclude`)."""

    label: str
    read: Callable[[App], Awaitable[Record]]
    unwatched: IncEx | None = None

    def watched(self, data: Record) -> dict[str, Any]:
        """The part of the page's data that a change of makes open pages refresh."""
        return data.model_dump(mode="json", exclude=self.unwatched)


PAGES: dict[str, Page] = {
    # A worker's heartbeat time (and so its silence) changes at every beat, for every worker:
    # watched, it would refresh the page about every second for nothing anyone acts on. What
    # matters of it is watched: `stale` (the silence passed the lease), and the worker coming
    # or going; the time and its "ago" are brought up to date with any refresh.
    "workers": Page("Workers", workers,
                    unwatched={"workers": {"__all__": {"heartbeat_at", "silent_seconds"}}}),
    "queues": Page("Queues", queues),
    # Watched whole: the next slots and the slot handled move once per slot (a page of an
    # every-minute schedule refreshes once a minute), and each slot brings a run to show.
    "schedules": Page("Schedules", schedules),
    "outbox": Page("Outbox", outbox_page),
    "dead": Page("Dead runs", dead_runs),
}  # fmt: skip

"""The operations pages for group admin (the console, DESIGN §5): workers, queues, schedules,
the outbox and dead runs, server-rendered like the inbox, with one action: send a failed outbox
message again. Routes under /ops; sessions, CSRF tokens, templates and problem pages are the
inbox's. Reads compose existing App and Store operations: nothing here decides what the library
decides (which message may be sent again is App.retry_outbox's rule), and no destination or
error reaches a page unredacted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from tether.app import App
from tether.clock import to_datetime
from tether.errors import ConfigurationError
from tether.redact import redact_text
from tether.schedules import Cron, ScheduleInfo
from tether.server.auth import client_of
from tether.server.counts import recent_counts
from tether.server.inbox import Inbox, Visitor
from tether.store.port import QueueLimits, RunRecord, RunStatus, WorkerInfo
from tether.store.port.outbox import OutboxMessage, OutboxStatus
from tether.text import visible
from tether.views import run_json, stored_error

log = logging.getLogger("tether.server")

# Running runs are read (newest first, a page at a time) to count them by worker and queue; a
# database with more than this many running at once shows the counts as lower bounds.
SCAN_LIMIT = 5000
_SCAN_PAGE = 500
LIST_LIMIT = 200  # rows per outbox section and on the dead runs page
NEXT_SLOTS = 3  # upcoming slots shown per schedule
SCHEDULE_RUNS = 5  # latest runs shown per schedule
# Runs read per scheduled workflow to find its schedule's latest runs (ids start with
# `schedule:<name>:`; other runs of the workflow share the listing).
_SCHEDULE_SCAN = 100
PAGES = (("workers", "Workers"), ("queues", "Queues"), ("schedules", "Schedules"),
         ("outbox", "Outbox"), ("dead", "Dead runs"))  # fmt: skip


def ago(seconds: float) -> str:
    """How long ago, for people: "4 s ago", "3 min ago", "2 h ago", "5 d ago"."""
    if seconds < 0:
        return "in the future (clock skew)"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def limits_text(limits: QueueLimits) -> dict[str, str]:
    def limit(value: int | None, unit: str = "") -> str:
        return "unlimited" if value is None else f"{value}{unit}"

    return {
        "concurrency": limit(limits.concurrency),
        "worker_concurrency": limit(limits.worker_concurrency),
        "rate": limit(limits.rate, f" per {limits.period:g} s"),
    }


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


def message_view(message: OutboxMessage) -> dict[str, Any]:
    """An outbox message as the page shows it: destination and error redacted (a URL may hold
    a password or a token in its query; an error may quote the receiver's answer)."""
    error = stored_error(message.error) or {}
    return {
        "id": message.id,
        "run_id": message.run_id,
        "checkpoint": message.checkpoint,
        "destination": redact_text(message.destination),
        "status": message.status.value,
        "attempts": message.attempts,
        "uncertain": message.uncertain,
        "in_doubt": message.in_doubt,
        "next_at": to_datetime(message.next_at) if message.next_at else None,
        "error_type": error.get("type"),
        "error_message": error.get("message"),
    }


def next_slots(info: ScheduleInfo, count: int) -> list[datetime]:
    """The schedule's next `count` slots from its next one (none if its cron does not parse
    here: a schedule only the database knows, stored by other code)."""
    if info.next_slot is None:
        return []
    try:
        cron = Cron(info.cron, info.tz)
    except ConfigurationError:
        return [info.next_slot]
    slots, moment = [info.next_slot], info.next_slot.timestamp()
    while len(slots) < count and (following := cron.next_after(moment)) is not None:
        slots.append(to_datetime(following))
        moment = following
    return slots


class Console:
    """The pages, and what they read from the App."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.inbox = Inbox(app)

    def now(self) -> float:
        return self.app.engine.clock.now()

    async def admin(self, request: Request) -> Visitor | Response:
        """The signed-in admin; else the sign-in redirect, or 403 for someone else."""
        visitor = await self.inbox.visitor(request)
        if visitor is None:
            return self.inbox.to_sign_in(request)
        if not visitor.user.is_admin:
            return self.not_admin(visitor)
        return visitor

    def not_admin(self, visitor: Visitor) -> Response:
        return self.inbox.problem(
            visitor,
            403,
            "Admins only",
            "The operations pages are for group admin. Ask an admin to add you to the group "
            "(tether users add NAME --group admin) if you need them.",
        )

    def page(self, name: str, visitor: Visitor, **context: Any) -> Response:
        return self.inbox.page(f"ops_{name}.html", visitor, section="ops", tab=name,
                               tabs=PAGES, **context)  # fmt: skip

    async def running(self) -> Running:
        """Count the running runs, a page of list_runs at a time, up to SCAN_LIMIT."""
        store, found = self.app.engine.store, list[RunRecord]()
        before: tuple[float, str] | None = None
        while len(found) < SCAN_LIMIT:
            page = await store.list_runs(
                statuses=[RunStatus.RUNNING], limit=_SCAN_PAGE, before=before
            )
            found += page
            if len(page) < _SCAN_PAGE:
                return Running.of(found, partial=False)
            before = (page[-1].created_at, page[-1].id)
        return Running.of(found[:SCAN_LIMIT], partial=True)

    # -- the pages ------------------------------------------------------------------------------

    async def workers(self, visitor: Visitor) -> Response:
        now = self.now()
        running = await self.running()
        listed = sorted(await self.app.engine.store.list_workers(),
                        key=lambda w: (-w.heartbeat_at, w.id))  # fmt: skip
        lease = self.app.engine.settings.lease_duration
        rows = [self.worker_view(w, now, lease, running) for w in listed]
        return self.page("workers", visitor, workers=rows, partial=running.partial,
                         lease=lease)  # fmt: skip

    @staticmethod
    def worker_view(w: WorkerInfo, now: float, lease: float, running: Running) -> dict[str, Any]:
        silent = now - w.heartbeat_at
        return {
            "id": w.id, "host": w.host, "pid": w.pid, "version": w.version,
            "workflows": None if w.workflows is None else sorted(w.workflows),
            "started_at": to_datetime(w.started_at), "heartbeat_at": to_datetime(w.heartbeat_at),
            "ago": ago(silent),
            # Its leases ran out: a worker this silent holds nothing another cannot take.
            "stale": silent > lease,
            "runs": running.by_owner.get(w.id, 0),
        }  # fmt: skip

    async def queues(self, visitor: Visitor) -> Response:
        engine = self.app.engine
        stats = await recent_counts(self.app).get()
        running = await self.running()
        served: dict[str, list[str]] = {}
        for wf in engine.workflows.values():
            served.setdefault(wf.queue or "", []).append(wf.name)
        defined = [
            {"name": name, "limits": limits_text(limits), "due": stats.due.get(name, 0),
             "running": running.by_queue.get(name, 0), "workflows": sorted(served.get(name, []))}
            for name, limits in sorted(engine.queues.items())
        ]  # fmt: skip
        # Queues with work that this App sets no limits for ("" is runs outside any queue).
        others = sorted((set(stats.due) | set(running.by_queue)) - set(engine.queues))
        undefined = [
            {"name": name, "due": stats.due.get(name, 0), "running": running.by_queue.get(name, 0),
             "workflows": sorted(served.get(name, []))}
            for name in others
        ]  # fmt: skip
        return self.page("queues", visitor, queues=defined, others=undefined,
                         partial=running.partial)  # fmt: skip

    async def schedules(self, visitor: Visitor) -> Response:
        rows = []
        for info in await self.app.list_schedules():
            prefix = f"schedule:{info.name}:"
            recent = await self.app.list_runs(workflow=info.workflow, limit=_SCHEDULE_SCAN)
            runs = [run_json(r) for r in recent if r.id.startswith(prefix)][:SCHEDULE_RUNS]
            rows.append({"info": info, "next": next_slots(info, NEXT_SLOTS), "runs": runs})
        return self.page("schedules", visitor, schedules=rows)

    async def outbox(self, visitor: Visitor) -> Response:
        found: dict[OutboxStatus, list[dict[str, Any]]] = {}
        for status in (OutboxStatus.FAILED, OutboxStatus.SENDING, OutboxStatus.PENDING):
            listed = await self.app.list_outbox(status=status, limit=LIST_LIMIT)
            found[status] = [message_view(m) for m in listed]
        # In doubt: claimed again after a send whose outcome was never recorded (sending, or
        # pending again after that claim's send failed).
        moving = found[OutboxStatus.SENDING] + found[OutboxStatus.PENDING]
        sections = [
            ("failed", "Failed", found[OutboxStatus.FAILED]),
            ("in-doubt", "In doubt", [m for m in moving if m["in_doubt"]]),
            ("sending", "Sending", [m for m in found[OutboxStatus.SENDING] if not m["in_doubt"]]),
            ("pending", "Pending", [m for m in found[OutboxStatus.PENDING] if not m["in_doubt"]]),
        ]
        return self.page("outbox", visitor, sections=sections, limit=LIST_LIMIT)

    async def dead(self, visitor: Visitor) -> Response:
        runs = [run_json(r) for r in await self.app.list_runs(status="dead", limit=LIST_LIMIT)]
        return self.page("dead", visitor, runs=runs, limit=LIST_LIMIT)

    # -- the action -----------------------------------------------------------------------------

    async def retry(self, request: Request, message_id: str) -> Response:
        """Send a failed message again (App.retry_outbox), for an admin's form with its CSRF
        token from one of this server's origins; logged with who asked and from where."""
        inbox = self.inbox
        posted = await inbox.posted(request, "retry the message")
        if isinstance(posted, Response):
            return posted
        visitor, _ = posted
        if not visitor.user.is_admin:
            return self.not_admin(visitor)
        try:
            await self.app.retry_outbox(message_id)
        except ConfigurationError as exc:  # unknown, or not failed (sent again already)
            return inbox.problem(visitor, 409, "Not sent again", redact_text(str(exc)))
        log.info(
            "outbox message %s is sent again, asked by %s from %s (the operations page)",
            visible(message_id, newlines=False), visible(visitor.user.name, newlines=False),
            visible(client_of(request), newlines=False),
        )  # fmt: skip
        return RedirectResponse("/ops/outbox", 303)


def build_console(app: App) -> APIRouter:
    """The operations pages' routes (none of them in the OpenAPI document)."""
    router = APIRouter(include_in_schema=False)
    console = Console(app)

    @router.get("/ops")
    async def home() -> Response:
        return RedirectResponse("/ops/workers", 303)

    @router.get("/ops/workers")
    async def workers(request: Request) -> Response:
        found = await console.admin(request)
        return found if isinstance(found, Response) else await console.workers(found)

    @router.get("/ops/queues")
    async def queues(request: Request) -> Response:
        found = await console.admin(request)
        return found if isinstance(found, Response) else await console.queues(found)

    @router.get("/ops/schedules")
    async def schedules(request: Request) -> Response:
        found = await console.admin(request)
        return found if isinstance(found, Response) else await console.schedules(found)

    @router.get("/ops/outbox")
    async def outbox(request: Request) -> Response:
        found = await console.admin(request)
        return found if isinstance(found, Response) else await console.outbox(found)

    @router.get("/ops/dead")
    async def dead(request: Request) -> Response:
        found = await console.admin(request)
        return found if isinstance(found, Response) else await console.dead(found)

    # Message ids hold the run id, which may hold "/" (sent percent-encoded, decoded here).
    @router.post("/ops/outbox/{message_id:path}/retry")
    async def retry(request: Request, message_id: str) -> Response:
        return await console.retry(request, message_id)

    return router

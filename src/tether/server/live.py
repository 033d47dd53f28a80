"""Live updates for the inbox and the operations pages: what each page shows a user, summed up
as a short state digest, and `GET /live`, a server-sent event stream that sends the digest
whenever it changes.

A page carries the digest it was rendered from (`data-state` on <body>); the stream sends the
current digest when it opens and again after every change (it polls the store every
POLL_SECONDS; the operations pages' data, which costs more to read, every OPS_POLLS polls), so a
change between rendering and connecting is never missed. The page's script compares, re-fetches
the page and swaps its live regions. A comment line every HEARTBEAT_SECONDS keeps proxies from
closing an idle stream. The stream ends when the client goes
away, when the session ends (event `signed-out`) or when the watched object is no longer
visible (event `gone`); EventSource reconnects by itself after anything else.

The queries here decide what a user sees on each page; inbox.py renders from the same ones. The
runs explorer's watch carries its view (its query string as the id): explorer.py reads it again
and lists what that page shows, filters, cursor and counts included. The operations pages' are
operations.py's, for group admin alone (anyone else: 403, `gone`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse

from tether.app import App
from tether.approvals.model import Approval
from tether.errors import StoreUnavailable
from tether.server.api import Access
from tether.server.auth import Auth
from tether.server.operations import PAGES
from tether.users import User
from tether.views import iso

POLL_SECONDS = 0.5
# The operations pages' reads scan up to operations.SCAN_LIMIT running runs: every 4th poll
# (2 s), not every poll; the session is still checked every poll.
OPS_POLLS = 4
HEARTBEAT_SECONDS = 15.0
RETRY_MILLISECONDS = 2000  # how long EventSource waits before reconnecting
MAX_ID = 512  # of a run or an approval (a runs view's query string is explorer.py's to judge)


# -- what a user sees ---------------------------------------------------------------------------


async def pending_for(app: App, user: User) -> list[Approval]:
    """The inbox: pending approvals the user may decide (group admin: all of them)."""
    return await app.list_approvals(
        "pending", reviewer=None if user.is_admin else user.reviewer, limit=1000
    )


async def approvals_of_run(app: App, user: User, run_id: str) -> list[Approval]:
    """The run's approvals this user may see (all of them for group admin)."""
    found = await app.list_approvals(None, run_id=run_id, limit=1000)
    if user.is_admin:
        return found
    return [a for a in found if user.reviewer.may_decide(a.reviewers)]


# -- what a page watches --------------------------------------------------------------------------


class Scope(StrEnum):
    INBOX = "inbox"
    RUNS = "runs"
    RUN = "run"
    APPROVAL = "approval"
    OPS = "ops"  # an operations page, by name (operations.PAGES)


TAKES_ID = frozenset({Scope.RUN, Scope.APPROVAL, Scope.OPS})


@dataclass(frozen=True, slots=True)
class Watch:
    """What one page shows: the inbox, one view of the runs explorer (`id`: its query string),
    or one run, approval or operations page (by `id`)."""

    scope: Scope
    id: str = ""

    @property
    def url(self) -> str:
        query = {"scope": self.scope.value, **({"id": self.id} if self.id else {})}
        return "/live?" + urlencode(query)


def digest(parts: object) -> str:
    """The state digest of what a page shows (JSON data)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


async def state(app: App, user: User, watch: Watch) -> str:
    """A digest of what `watch` shows `user`: it changes exactly when the page would. Raises
    HTTPException(404) for a run or approval the user may not see or an unknown operations
    page, (403) for an operations page and a user outside group admin, (400) for a runs view
    that cannot be read."""
    access = Access(app)
    parts: object
    if watch.scope is Scope.INBOX:
        parts = [[a.id, a.status, a.approvers] for a in await pending_for(app, user)]
    elif watch.scope is Scope.RUNS:
        from tether.server.explorer import watched  # not at the top: it imports this module

        parts = await watched(app, user, watch.id)
    elif watch.scope is Scope.RUN:
        await access.run(watch.id, user)
        handle = await app.get(watch.id)
        info = await handle.info()
        parts = [
            [info.status, iso(info.updated_at), info.attempt],
            [[c.seq, c.status, c.attempts] for c in await handle.checkpoints()],
            [[a.id, a.status, a.approvers] for a in await approvals_of_run(app, user, watch.id)],
        ]
    elif watch.scope is Scope.OPS:
        if not user.is_admin:
            raise HTTPException(403, "the operations pages are for group admin")
        page = PAGES.get(watch.id)
        if page is None:
            raise HTTPException(404, f"no operations page {watch.id!r}; one of {list(PAGES)}")
        parts = page.watched(await page.read(app))
    else:
        found = await access.approval(watch.id, user)
        # Views are left out: showing the page records one, and must not look like a change.
        trail = [e.seq for e in await app.approval_history(watch.id) if e.event != "viewed"]
        parts = [found.status, found.approvers, len(found.outcomes), trail[-1:]]
    return digest(parts)


# -- the stream -----------------------------------------------------------------------------------


def _event(name: str, data: str) -> str:
    return f"event: {name}\ndata: {data}\n\n"


async def _events(request: Request, app: App, watch: Watch, first: str) -> AsyncIterator[str]:
    auth: Auth = request.app.state.auth
    loop = asyncio.get_running_loop()
    yield f"retry: {RETRY_MILLISECONDS}\n" + _event("state", first)
    last, beat = first, loop.time() + HEARTBEAT_SECONDS
    every, polls = OPS_POLLS if watch.scope is Scope.OPS else 1, 0
    while True:
        await asyncio.sleep(POLL_SECONDS)
        if await request.is_disconnected():
            return
        try:
            signed = await auth.session(request, touch=False)  # an open page is not activity
            if signed is None:
                yield _event("signed-out", "the session ended")
                return
            polls += 1
            if polls % every:
                now = last  # not read this time
            else:
                now = await state(app, signed.user, watch)
        except HTTPException:
            yield _event("gone", "this page is no longer visible to you")
            return
        except StoreUnavailable:
            now = last  # the database is away for a moment: keep the stream, try again
        if now != last:
            last, beat = now, loop.time() + HEARTBEAT_SECONDS
            yield _event("state", now)
        elif loop.time() >= beat:
            beat = loop.time() + HEARTBEAT_SECONDS
            yield ": heartbeat\n\n"


def build_live(app: App) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/live")
    async def live(
        request: Request,
        scope: Annotated[str, Query(max_length=16)] = "inbox",
        # A runs view's query string may be longer than an id: explorer.watched bounds each
        # of its fields, as the page does.
        id: Annotated[str, Query(max_length=65_536)] = "",
    ) -> Response:
        auth: Auth = request.app.state.auth
        # Not activity: EventSource reconnects by itself, which must not keep an idle session.
        signed = await auth.session(request, touch=False)
        if signed is None:
            return PlainTextResponse("sign in first: this stream follows an inbox session", 401)
        try:
            watch = Watch(Scope(scope), id)
        except ValueError:
            return PlainTextResponse(f"scope is one of {[s.value for s in Scope]}", 400)
        # Runs, approvals and operations pages by id; the inbox has none; a runs view is its
        # query string (empty: the first page of all runs), read as its page reads it
        # (explorer.watched).
        if watch.scope is not Scope.RUNS:
            if (watch.scope in TAKES_ID) != bool(id):
                return PlainTextResponse("scopes run, approval and ops take an id; inbox none",
                                         400)  # fmt: skip
            if len(id) > MAX_ID:
                return PlainTextResponse(f"an id is at most {MAX_ID} characters long", 422)
        try:
            first = await state(app, signed.user, watch)
        except HTTPException as exc:
            return PlainTextResponse(str(exc.detail), exc.status_code)
        return StreamingResponse(
            _events(request, app, watch, first),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    return router

"""The runs explorer (`GET /runs`): a page of runs newest first, its whole view (filters, page
size, cursor) the query string of a GET form, so a link shows the same runs; pages are GET
/api/runs's keyset pages, with the counts by status for group admin. Its live updates (live.py,
scope `runs`) follow this very view: the watch's id is the view's query string, read again here.
It decides no access of its own (the JSON API's rule, api.admin_page and reviewer_page) and
changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.datastructures import QueryParams

from tether.app import App
from tether.core.handle import RunInfo
from tether.errors import ConfigurationError
from tether.server.api import RunFilters, admin_page, reviewer_page
from tether.server.counts import recent_counts
from tether.server.inbox import Inbox, Visitor
from tether.server.live import Scope, Watch, digest
from tether.store.port import RunStatus
from tether.users import User
from tether.views import iso, run_json

PER_PAGE = 50  # runs on a page of the explorer, unless ?limit= says otherwise
MAX_PER_PAGE = 200
# The explorer's filters given as text, each with its longest value: GET /api/runs's limits,
# so that a view means the same on both (the times are read as datetimes, 64 characters at most).
TEXT_FILTERS = {"workflow": 200, "queue": 128, "version": 200, "started_by": 200, "q": 512,
                "since": 64, "until": 64}  # fmt: skip
BAD_CURSOR = (
    "The cursor in this address is not one this page made: follow the page's Next link, or "
    "start again from the first page."
)


@dataclass(frozen=True, slots=True)
class RunsView:
    """One view of the runs explorer, read from its query string: the filters, the values as
    sent (to fill the form and build links), the statuses ticked, the page size and cursor."""

    filters: RunFilters
    entered: Mapping[str, str]  # every non-empty filter parameter but status, as sent
    statuses: tuple[str, ...]
    limit: int = PER_PAGE
    cursor: str | None = None

    def url(self, *, cursor: str | None = None, status: str | None = None) -> str:
        """This view's address on the page after `cursor` (None: the first page); `status`
        shows that status alone."""
        query = self._query(cursor, status)
        return "/runs" + (f"?{query}" if query else "")

    @property
    def query(self) -> str:
        """This view's query string, as its page's address holds it: the id of its watch."""
        return self._query(self.cursor, None)

    def _query(self, cursor: str | None, status: str | None) -> str:
        pairs = [("status", s) for s in ((status,) if status else self.statuses)]
        pairs += [*self.entered.items(), *([("limit", str(self.limit))] * (self.limit != PER_PAGE))]
        pairs += [("cursor", cursor)] if cursor else []
        return urlencode(pairs)


def read_view(query: QueryParams) -> tuple[RunsView, list[str]]:
    """The explorer's view of a query string, and what is wrong with it (nothing: []). Empty
    fields mean "any" (a GET form sends them all); unknown parameters are ignored, as links
    from elsewhere may carry some."""
    known = [s.value for s in RunStatus]
    sent = query.getlist("status")
    errors = [f"Status {s!r} is not one of {', '.join(known)}." for s in sent if s not in known]
    statuses = tuple(s for s in known if s in sent)
    entered: dict[str, str] = {}
    for name, longest in TEXT_FILTERS.items():
        values = [v for v in query.getlist(name) if v]
        if len(values) > 1:
            errors.append(f"Give {name} once (it was given {len(values)} times).")
        elif values and len(values[0]) > longest:
            errors.append(f"{name} is {len(values[0])} characters long; at most {longest} are.")
        elif values:
            entered[name] = values[0]
    moments: dict[str, datetime] = {}
    for name in ("since", "until"):
        if value := entered.get(name):
            try:  # datetime-local sends no zone: the page says its times are UTC
                at = datetime.fromisoformat(value)
                moments[name] = at if at.utcoffset() is not None else at.replace(tzinfo=UTC)
            except ValueError:
                errors.append(f"{name} {value!r} is not a date and time: use YYYY-MM-DDTHH:MM "
                              f"(UTC), as the form's picker gives.")  # fmt: skip
    if len(moments) == 2 and moments["since"] >= moments["until"]:
        errors.append("The time range is empty: since must be earlier than until.")
    limit, given = PER_PAGE, query.get("limit", "")
    if given.isdigit() and 1 <= int(given) <= MAX_PER_PAGE:
        limit = int(given)
    elif given:
        errors.append(f"limit {given[:20]!r} is not a whole number from 1 to {MAX_PER_PAGE}.")
    cursor = query.get("cursor") or None
    if cursor is not None and len(cursor) > 2048:
        errors.append("The cursor is too long to be one: follow the page's Next link.")
    text = {name: entered.get(name) for name in ("workflow", "queue", "version", "started_by")}
    filters = RunFilters(status=[RunStatus(s) for s in statuses] or None, **text,
                         since=moments.get("since"), until=moments.get("until"),
                         id_prefix=entered.get("q"))  # fmt: skip
    return RunsView(filters, entered, statuses, limit, cursor), errors


# -- what a view shows -----------------------------------------------------------------------------


async def runs_of(app: App, user: User, view: RunsView) -> tuple[list[RunInfo], str | None]:
    """The view's page of runs (group admin: of all runs; others: of those with approvals they
    may decide, the JSON API's rule) and the next page's cursor. Raises ConfigurationError for
    a cursor that is not one (read_cursor says why)."""
    if user.is_admin:
        return await admin_page(app, view.filters, view.limit, view.cursor)
    return await reviewer_page(app, user, view.filters, view.limit, view.cursor)


async def counts_for(app: App, user: User) -> dict[str, int]:
    """The counts by status of every run, so for group admin alone (a reviewer's scope is their
    own runs): as recent as server/counts.py keeps them."""
    if not user.is_admin:
        return {}
    stats = await recent_counts(app).get()
    return {str(s): n for s, n in stats.runs.items()}


def shown(runs: list[RunInfo], after: str | None, counts: Mapping[str, int]) -> object:
    """What the page shows that can change, for its live digest: each run's id, status and last
    change, the next page's cursor, the counts."""
    rows = [[r.id, r.status, iso(r.updated_at)] for r in runs]
    return [rows, after, sorted(counts.items())]


async def watched(app: App, user: User, watch_id: str) -> object:
    """What the view whose query string is `watch_id` shows `user` (live.state's scope
    `runs`). Raises HTTPException(400) unless the id is a view the page would watch: readable,
    with a cursor the page made, and written as the page writes it (view.query)."""
    view, errors = read_view(QueryParams(watch_id))
    if errors or view.query != watch_id:
        raise HTTPException(400, "id is the query string of a runs explorer view that it reads")
    try:
        runs, after = await runs_of(app, user, view)
    except ConfigurationError:
        raise HTTPException(400, BAD_CURSOR) from None
    return shown(runs, after, await counts_for(app, user))


# -- the page --------------------------------------------------------------------------------------


class Explorer:
    """The explorer's page, over the inbox's pages and sessions."""

    def __init__(self, app: App, inbox: Inbox) -> None:
        self.app = app
        self.inbox = inbox

    async def runs(self, request: Request, visitor: Visitor) -> Response:
        """A page of the view's runs, the counts by status (group admin), the next page's
        link; a view that cannot be read: the page, its errors, 400."""
        started = time.perf_counter()
        view, errors = read_view(request.query_params)
        runs: list[RunInfo] = []
        after: str | None = None
        if not errors:
            try:
                runs, after = await runs_of(self.app, visitor.user, view)
            except ConfigurationError:
                errors.append(BAD_CURSOR)
        counts = await counts_for(self.app, visitor.user)
        queried = time.perf_counter()  # the listing and the counts done
        # Live updates follow this very view (filters and cursor); a view with errors has
        # nothing to follow.
        watch = None if errors else Watch(Scope.RUNS, view.query)
        page = self.inbox.page(
            "runs.html",
            visitor,
            400 if errors else 200,
            watch=watch,
            digest="" if watch is None else digest(shown(runs, after, counts)),
            here=view.url(cursor=view.cursor),
            view=view,
            errors=errors,
            statuses=[s.value for s in RunStatus],
            counts=counts,
            runs=[(r, run_json(r)) for r in runs],  # the JSON view: its error redacted
            next_url=None if after is None else view.url(cursor=after),
            first_url=view.url() if view.cursor else None,
            per_page=PER_PAGE,
        )
        # What the page cost on the server, all of it and its queries (devtools show them).
        spent = [(time.perf_counter() - started) * 1000, (queried - started) * 1000]
        page.headers["Server-Timing"] = "runs;dur={:.2f}, query;dur={:.2f}".format(*spent)
        return page


def build_explorer(app: App, inbox: Inbox | None = None) -> APIRouter:
    """The explorer's route (not in the OpenAPI document)."""
    router = APIRouter(include_in_schema=False)
    explorer = Explorer(app, inbox or Inbox(app))

    @router.get("/runs")
    async def runs(request: Request) -> Response:
        visitor = await explorer.inbox.visitor(request)
        if visitor is None:
            return explorer.inbox.to_sign_in(request)
        return await explorer.runs(request, visitor)

    return router

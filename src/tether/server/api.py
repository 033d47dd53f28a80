"""The JSON API under /api (DESIGN §5): runs, their steps, events, values and forks, approvals
and decisions; and, for group admin, what the operations pages show (workers, queues,
schedules, the outbox) with their action, sending a failed outbox message again.

Every route needs a bearer token; the token's owner is the actor. Object-level authorization:
a user sees an approval they may decide and the runs those approvals belong to (404 for the
rest, so ids of others' objects leak nothing); group `admin` sees everything and alone may
cancel runs, send events, fork runs and use the operations routes (403 for anyone else);
groups `admin` and `starter` may start runs (by workflow name: the server needs no code of
it). Routes validate and translate; the library does the work.
"""

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import (
    APIRouter,
    Body,
    Depends,
    Header,
    HTTPException,
    Path,
    Query,
    Request,
    Response,
)
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from tether.actions import about_event, about_fork, recorded
from tether.app import App
from tether.approvals.model import Approval
from tether.core.handle import RunInfo
from tether.core.observe import given_trace, valid_trace
from tether.core.values import check_value_key
from tether.core.workflow import Named
from tether.errors import (
    ApprovalNotFound,
    ApprovalRefused,
    ConfigurationError,
    DuplicateRun,
    EventRefused,
    IdempotencyConflict,
    RunNotFound,
    SerializationError,
    ValueNotFound,
)
from tether.redact import redact_text
from tether.server import operations
from tether.server.auth import Auth, actor_of, client_of
from tether.server.http import StrictRoute
from tether.server.operations import OutboxMessageOut, QueuesOut, SchedulesOut, WorkersOut
from tether.server.sse import END, event_stream, start_offset
from tether.store.port import RunStatus
from tether.store.port.outbox import OutboxStatus
from tether.streams import check_stream_key
from tether.users import User
from tether.values import ValueInfo
from tether.views import approval_json, checkpoint_json, decision_json, run_json, value_json

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "The body is not strict JSON (invalid, or a key repeated)"},
    401: {"description": "No bearer token, or an unknown or revoked one"},
    403: {"description": "Authenticated, but not allowed to do this"},
    404: {"description": "No such object, or not one this user may see"},
    409: {"description": "The object's state refuses the request (already decided, finished)"},
    413: {"description": "The body is over the size limit"},
    422: {"description": "The request's fields are invalid (unknown fields included)"},
}

# Refusal reasons, by what they say about the request.
_REFUSED_STATUS = {"wrong_reviewer": 403, "separate_duties": 403, "unknown_option": 422,
                   "invalid_response": 422}  # fmt: skip

STARTERS = frozenset({"admin", "starter"})  # the groups that may start runs
# Keywords App.start takes as its own options: as a workflow's keyword arguments from a body
# they would set the options instead (started_by: someone else as the starter).
START_OPTIONS = frozenset({"id", "priority", "dedup_key", "started_by"})
# Declares the bearer token in the document (securitySchemes); Auth checks it (current_user).
BEARER = HTTPBearer(auto_error=False, scheme_name="bearer",
                    description="A token from `tether users add` (tt_...)")  # fmt: skip

RunId = Annotated[str, Path(min_length=1, max_length=512)]
ApprovalId = Annotated[str, Path(min_length=1, max_length=100)]


class Problem(BaseModel):
    detail: str
    reason: str | None = None


class ForkIn(BaseModel):
    """Where a fork starts: the step (as `steps` of the run name them), and its new id."""

    model_config = ConfigDict(extra="forbid")

    from_step: str = Field(min_length=1, max_length=512)
    id: str | None = Field(default=None, min_length=1, max_length=512)


class StartIn(BaseModel):
    """A run to start: the workflow by name, its arguments as JSON, and its id (the
    idempotency key: the same id with the same workflow and arguments is the same run)."""

    model_config = ConfigDict(extra="forbid")

    workflow: str = Field(min_length=1, max_length=200)
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    id: str | None = Field(default=None, min_length=1, max_length=512)
    queue: str | None = Field(default=None, min_length=1, max_length=128,
                              description="The workflow's queue, when this server does not "
                                          "register the workflow")  # fmt: skip


class RunOut(BaseModel):
    """A run as the API shows it (errors redacted)."""

    id: str
    workflow: str
    status: RunStatus
    attempt: int
    failures: int
    owner: str | None
    created_at: str | None
    updated_at: str | None
    finished_at: str | None
    error_type: str | None
    error_message: str | None
    forked_from: dict[str, Any] | None
    diverged_at: Any = None


class DecisionIn(BaseModel):
    """A decision as the reviewer saw the approval: the option, and the digest shown with it."""

    model_config = ConfigDict(extra="forbid")

    option: str = Field(min_length=1, max_length=64)
    operation_digest: str = Field(min_length=1, max_length=128)
    comment: str | None = Field(default=None, max_length=10_000)
    response: Any = None


def refused(request: Request, exc: Exception) -> JSONResponse:
    """ApprovalRefused as a response: 403 for who is asking, 422 for what, 409 for when."""
    reason = exc.reason if isinstance(exc, ApprovalRefused) else None
    status = _REFUSED_STATUS.get(reason or "", 409)
    return JSONResponse({"detail": str(exc), "reason": reason}, status_code=status)


class Access:
    """What a user may see and do, object by object (see the module docstring)."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def approval(self, approval_id: str, user: User) -> Approval:
        try:
            found = await self.app.get_approval(approval_id)
        except ApprovalNotFound:
            found = None
        if found is None or not (user.is_admin or user.reviewer.may_decide(found.reviewers)):
            raise HTTPException(404, f"no approval {approval_id!r} that you may see")
        return found

    async def run(self, run_id: str, user: User) -> None:
        try:
            await self.app.get(run_id)
        except RunNotFound:
            raise HTTPException(404, f"no run {run_id!r} that you may see") from None
        if user.is_admin:
            return
        if not await self.app.list_approvals(None, run_id=run_id, reviewer=user.reviewer):
            raise HTTPException(404, f"no run {run_id!r} that you may see")

    @staticmethod
    def admin(user: User, what: str) -> None:
        if not user.is_admin:
            raise HTTPException(403, f"only group admin may {what}")


async def current_user(request: Request) -> User:
    """The bearer token's owner (401 otherwise)."""
    auth: Auth = request.app.state.auth
    return await auth.bearer(request)


CurrentUser = Annotated[User, Depends(current_user)]


PAGE_HEADERS = {
    "Link": {"description": 'The next page: `</api/runs?...&cursor=...>; rel="next"`',
             "schema": {"type": "string"}},
    "X-Next-Cursor": {"description": "The `cursor` of the next page", "schema": {"type": "string"}},
}  # fmt: skip
SCAN_PAGES = 10  # pages a reviewer's listing reads at most for one answer (runs not theirs)


@dataclass(frozen=True, slots=True)
class RunFilters:
    """What GET /api/runs filters by: App.list_runs's keywords."""

    status: list[RunStatus] | None = None
    workflow: str | None = None
    queue: str | None = None
    version: str | None = None
    started_by: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    id_prefix: str | None = None


def utc(moment: datetime | None) -> datetime | None:
    """A query's datetime, one without a zone read as UTC."""
    if moment is None or moment.utcoffset() is not None:
        return moment
    return moment.replace(tzinfo=UTC)


async def admin_page(
    app: App, filters: RunFilters, limit: int, cursor: str | None
) -> tuple[list[RunInfo], str | None]:
    """A page of runs and the cursor of the next (None: this is the last); one run more is
    read to know."""
    runs = await app.list_runs(**asdict(filters), limit=limit + 1, cursor=cursor)
    return runs[:limit], runs[limit - 1].cursor if len(runs) > limit else None


async def reviewer_page(
    app: App, user: User, filters: RunFilters, limit: int, cursor: str | None
) -> tuple[list[RunInfo], str | None]:
    """A page of the runs this user has approvals on: pages of all runs are read and filtered,
    up to SCAN_PAGES of them; the cursor goes on after the last run read, so a page may hold
    fewer than `limit` runs (even none) with more after it."""
    mine = {a.run_id for a in await app.list_approvals(None, reviewer=user.reviewer,
                                                      limit=10_000)}  # fmt: skip
    shown: list[RunInfo] = []
    batch = max(limit, 200)
    for _ in range(SCAN_PAGES):
        runs = await app.list_runs(**asdict(filters), limit=batch, cursor=cursor)
        for run in runs:
            cursor = run.cursor
            if run.id in mine:
                shown.append(run)
                if len(shown) == limit:
                    return shown, cursor
        if len(runs) < batch:
            return shown, None  # no run after these
    return shown, cursor


def build_router(app: App) -> APIRouter:
    router = APIRouter(prefix="/api", route_class=StrictRoute, responses=ERRORS)
    access = Access(app)
    _run_routes(router, app, access)
    _stream_route(router, app, access)
    _value_routes(router, app, access)
    _approval_routes(router, app, access)
    _ops_routes(router, app)
    return router


def _run_routes(router: APIRouter, app: App, access: Access) -> None:
    _start_route(router, app)

    @router.get(
        "/runs",
        summary="List runs, newest first (filters; a page, and the cursor of the next)",
        response_model=list[RunOut],
        responses={200: {"description": "A page of runs; with more after it, the headers name "
                                        "the next page", "headers": PAGE_HEADERS}},
    )  # fmt: skip
    async def list_runs(
        user: CurrentUser,
        request: Request,
        response: Response,
        status: Annotated[list[RunStatus] | None, Query(
            description="Runs of any of these statuses (repeat the parameter)")] = None,
        workflow: Annotated[str | None, Query(max_length=200)] = None,
        queue: Annotated[str | None, Query(max_length=128)] = None,
        version: Annotated[str | None, Query(max_length=200)] = None,
        started_by: Annotated[str | None, Query(max_length=200)] = None,
        since: Annotated[datetime | None, Query(
            description="Created at or after (ISO 8601; without a zone: UTC)")] = None,
        until: Annotated[datetime | None, Query(
            description="Created before (ISO 8601; without a zone: UTC)")] = None,
        q: Annotated[str | None, Query(max_length=512,
                                       description="The start of the run's id")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        cursor: Annotated[str | None, Query(max_length=2048, description="X-Next-Cursor of "
                                            "the previous page")] = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        filters = RunFilters(status=status, workflow=workflow, queue=queue, version=version,
                             started_by=started_by, since=utc(since), until=utc(until),
                             id_prefix=q)  # fmt: skip
        try:
            if user.is_admin:
                runs, after = await admin_page(app, filters, limit, cursor)
            else:
                runs, after = await reviewer_page(app, user, filters, limit, cursor)
        except ConfigurationError as exc:  # a cursor that is not one
            raise HTTPException(422, str(exc)) from None
        if after is not None:
            following = request.url.include_query_params(cursor=after)
            response.headers["Link"] = f'<{following.path}?{following.query}>; rel="next"'
            response.headers["X-Next-Cursor"] = after
        return [run_json(r) for r in runs]

    @router.get("/runs/{run_id}", summary="A run with its steps and approvals")
    async def get_run(run_id: RunId, user: CurrentUser) -> dict[str, Any]:
        await access.run(run_id, user)
        handle = await app.get(run_id)
        approvals = await app.list_approvals(None, run_id=run_id)
        if not user.is_admin:
            approvals = [a for a in approvals if user.reviewer.may_decide(a.reviewers)]
        return {**run_json(await handle.info()),
                "steps": [checkpoint_json(c) for c in await handle.checkpoints()],
                "approvals": [approval_json(a) for a in approvals]}  # fmt: skip

    @router.post("/runs/{run_id}/cancel", summary="Cancel a run (group admin)")
    async def cancel_run(run_id: RunId, user: CurrentUser, request: Request) -> dict[str, Any]:
        await access.run(run_id, user)
        access.admin(user, "cancel runs")
        handle = await app.get(run_id)
        async with recorded(app, actor_of(user, request, "api"), "cancel", run_id):
            await handle.cancel()
        return run_json(await handle.info())

    @router.post("/runs/{run_id}/events/{key}", summary="Send an event to a run (group admin)",
                 status_code=202)  # fmt: skip
    async def send_event(
        run_id: RunId,
        key: Annotated[str, Path(min_length=1, max_length=256)],
        user: CurrentUser,
        request: Request,
        payload: Annotated[Any, Body()] = None,
    ) -> dict[str, str]:
        await access.run(run_id, user)
        access.admin(user, "send events")
        try:
            async with recorded(app, actor_of(user, request, "api"), "send", run_id,
                                detail=about_event(key)):  # fmt: skip
                await app.send(run_id, key, payload)
        except (ConfigurationError, SerializationError) as exc:
            raise HTTPException(422, str(exc)) from None
        except EventRefused as exc:
            raise HTTPException(409, str(exc)) from None
        return {"run_id": run_id, "key": key, "status": "delivered"}


def _start_route(router: APIRouter, app: App) -> None:
    @router.post(
        "/runs",
        summary="Start a run of a workflow by name (groups admin and starter)",
        status_code=201,
        response_model=RunOut,
        dependencies=[Depends(BEARER)],
        responses={200: {"model": RunOut, "description": "The run with this id, started before "
                                                         "with the same workflow and arguments"},
                   201: {"description": "The new run"},
                   409: {"model": Problem, "description": "The id is taken by a run of another "
                                                          "workflow or with other arguments"}},
    )  # fmt: skip
    async def start_run(
        body: StartIn, user: CurrentUser,
        traceparent: Annotated[str | None, Header(
            max_length=512, description="W3C Trace Context of the caller's span: the run's "
            "spans become its children (a malformed one is ignored)")] = None,
        tracestate: Annotated[str | None, Header(max_length=512)] = None,
    ) -> JSONResponse:  # fmt: skip
        if not STARTERS & user.groups:
            raise HTTPException(403, "only groups admin and starter may start runs")
        options = sorted(START_OPTIONS & body.kwargs.keys())
        if options:
            raise HTTPException(422, f"kwargs {options} are names of start options, which the "
                                     f"body does not set through kwargs; rename the workflow's "
                                     f"parameters")  # fmt: skip
        target = Named(body.workflow, queue=body.queue) if body.queue else body.workflow
        existed = False
        if body.id is not None:
            try:
                await app.get(body.id)
                existed = True
            except RunNotFound:
                pass
        given = valid_trace({"traceparent": traceparent or "", "tracestate": tracestate or ""})
        traced = given_trace.set(given)  # for this request's start alone
        try:
            handle = await app.start(target, *body.args, id=body.id, started_by=user.name,
                                     **body.kwargs)  # fmt: skip
        except IdempotencyConflict:
            # Not the library's message: it shows the other run's arguments, which need not
            # be this user's to see.
            raise HTTPException(409, f"run {body.id!r} exists with another workflow or other "
                                     f"arguments; start with a new id") from None  # fmt: skip
        except DuplicateRun as exc:
            raise HTTPException(409, str(exc)) from None
        except (ConfigurationError, SerializationError) as exc:
            raise HTTPException(422, str(exc)) from None
        finally:
            given_trace.reset(traced)
        # Two requests with one new id may both answer 201: it is the same run either way.
        status = 200 if existed else 201
        return JSONResponse(run_json(await handle.info()), status_code=status)


def _value_routes(router: APIRouter, app: App, access: Access) -> None:
    def plain(value: ValueInfo) -> Any:  # the value's JSON form, as stored
        return json.loads(app.engine.serde.dumps(value.value, what=f"value {value.key!r}"))

    ValueKey = Annotated[str, Path(min_length=1, max_length=200, pattern="^[^#]+$")]

    @router.get("/runs/{run_id}/values", summary="The latest value of each key a run set")
    async def list_values(run_id: RunId, user: CurrentUser) -> list[dict[str, Any]]:
        await access.run(run_id, user)
        return [value_json(v, plain(v)) for v in await app.list_values(run_id)]

    @router.get(
        "/runs/{run_id}/values/{key}",
        summary="A value the run set (?wait= seconds for one newer than ?after_version=)",
    )
    async def get_value(
        run_id: RunId,
        key: ValueKey,
        user: CurrentUser,
        wait: Annotated[float, Query(ge=0, le=60)] = 0,
        after_version: Annotated[int, Query(ge=0)] = 0,
    ) -> dict[str, Any]:
        await access.run(run_id, user)
        try:
            check_value_key(key)
        except ConfigurationError as exc:
            raise HTTPException(422, str(exc)) from None
        try:
            await app.get_value(run_id, key, wait=wait, after_version=after_version)
        except ValueNotFound as exc:
            raise HTTPException(404, str(exc)) from None
        # The version with it: what a caller passes as after_version to wait for the next.
        latest = {v.key: v for v in await app.list_values(run_id)}[key]
        return value_json(latest, plain(latest))

    @router.post("/runs/{run_id}/fork", summary="Fork a run from one of its steps (group admin)",
                 status_code=201)  # fmt: skip
    async def fork(
        run_id: RunId, body: ForkIn, user: CurrentUser, request: Request
    ) -> dict[str, Any]:
        await access.run(run_id, user)
        access.admin(user, "fork runs")
        try:
            async with recorded(app, actor_of(user, request, "api"), "fork", run_id,
                                detail=about_fork(body.from_step)) as said:  # fmt: skip
                handle = await app.fork(run_id, body.from_step, id=body.id,
                                        started_by=user.name)  # fmt: skip
                said.detail = about_fork(body.from_step, handle.id)
        except (ConfigurationError, IdempotencyConflict) as exc:
            # The run's history has no such step or cannot be reused, or the id is taken.
            raise HTTPException(409, str(exc)) from None
        return run_json(await handle.info())


def _stream_route(router: APIRouter, app: App, access: Access) -> None:
    @router.get(
        "/runs/{run_id}/streams/{key}",
        summary="A run's stream as Server-Sent Events (Last-Event-ID or ?offset= resumes)",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}},
                         "description": "events `chunk` and `reset` (id: offset), then `end`"},
                   400: {"description": "Last-Event-ID or ?offset= is not an offset"}},
        # ?offset= is read by start_offset, so that a bad one is a 400 like a bad Last-Event-ID.
        openapi_extra={"parameters": [{"name": "offset", "in": "query", "required": False,
                                       "schema": {"type": "integer", "minimum": 0,
                                                  "maximum": END - 1}}]},
    )  # fmt: skip
    async def run_stream(
        run_id: RunId,
        key: Annotated[str, Path(min_length=1, max_length=256)],
        request: Request,
        user: CurrentUser,
        follow: Annotated[bool, Query()] = True,
    ) -> StreamingResponse:
        await access.run(run_id, user)
        try:
            check_stream_key(key)
        except ConfigurationError as exc:
            raise HTTPException(422, str(exc)) from None
        start = start_offset(request, request.query_params.get("offset"))
        auth: Auth = request.app.state.auth
        return event_stream(
            app, run_id, key, start, follow, lambda: auth.still_valid(request, "bearer")
        )


def _approval_routes(router: APIRouter, app: App, access: Access) -> None:

    @router.get("/approvals", summary="Approvals this user may decide")
    async def list_approvals(
        user: CurrentUser,
        status: Annotated[str | None, Query(max_length=64)] = "pending",
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> list[dict[str, Any]]:
        wanted = None if status == "all" else status
        reviewer = None if user.is_admin else user.reviewer
        found = await app.list_approvals(wanted, limit=limit, reviewer=reviewer)
        return [approval_json(a) for a in found]

    @router.get("/approvals/{approval_id}", summary="One approval (the look is audited)")
    async def get_approval(
        approval_id: ApprovalId, user: CurrentUser, request: Request
    ) -> dict[str, Any]:
        await access.approval(approval_id, user)
        shown = await app.get_approval(approval_id, viewer=user.reviewer, channel="api",
                                       client=client_of(request))  # fmt: skip
        return {**approval_json(shown), "may_decide": shown.may_decide(user.reviewer)}

    @router.post("/approvals/{approval_id}/decision", summary="Decide an approval")
    async def decide(
        approval_id: ApprovalId, body: DecisionIn, user: CurrentUser, request: Request
    ) -> dict[str, Any]:
        await access.approval(approval_id, user)
        try:  # a refusal reaches refused() below, with its reason
            decision = await app.decide(approval_id, body.option, reviewer=user.reviewer,
                                        operation_digest=body.operation_digest,
                                        comment=body.comment, response=body.response,
                                        channel="api", client=client_of(request))  # fmt: skip
        except SerializationError as exc:
            raise HTTPException(422, str(exc)) from None
        return decision_json(decision)


def _ops_routes(router: APIRouter, app: App) -> None:
    """What the operations pages show, read by the same functions (operations.py)."""
    bearer = [Depends(BEARER)]
    MessageId = Annotated[str, Path(min_length=1, max_length=2048)]

    @router.get("/workers", summary="Workers the database knows, with the runs each holds "
                "(group admin)", dependencies=bearer)  # fmt: skip
    async def list_workers(user: CurrentUser) -> WorkersOut:
        Access.admin(user, "see the workers")
        return await operations.workers(app)

    @router.get("/queues", summary="Queues: limits, runs due and running (group admin)",
                dependencies=bearer)  # fmt: skip
    async def list_queues(user: CurrentUser) -> QueuesOut:
        Access.admin(user, "see the queues")
        return await operations.queues(app)

    @router.get("/schedules", summary="Schedules: next slots and latest runs (group admin)",
                dependencies=bearer)  # fmt: skip
    async def list_schedules(user: CurrentUser) -> SchedulesOut:
        Access.admin(user, "see the schedules")
        return await operations.schedules(app)

    @router.get("/outbox", summary="Outbox messages, oldest first (group admin; destinations "
                "and errors redacted)", dependencies=bearer)  # fmt: skip
    async def list_outbox(
        user: CurrentUser,
        status: Annotated[OutboxStatus | None, Query(description="Messages of this status "
                                                     "(any when not given)")] = None,
        run_id: Annotated[str | None, Query(min_length=1, max_length=512,
                                            description="Messages of this run")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> list[OutboxMessageOut]:  # fmt: skip
        Access.admin(user, "see the outbox")
        return await operations.outbox(app, status=status, run_id=run_id, limit=limit)

    # As the page's route: the id is taken whole, "/" included (sent percent-encoded).
    @router.post(
        "/outbox/{message_id:path}/retry",
        summary="Send a failed outbox message again, with the same idempotency key (group admin)",
        dependencies=bearer,
        responses={409: {"model": Problem, "description": "No such message, or one that has "
                                                          "not failed (sent again already)"}},
    )  # fmt: skip
    async def retry_outbox(
        message_id: MessageId, user: CurrentUser, request: Request
    ) -> OutboxMessageOut:
        Access.admin(user, "send outbox messages again")
        try:
            return await operations.retry_message(app, message_id, actor_of(user, request, "api"))
        except ConfigurationError as exc:
            raise HTTPException(409, redact_text(str(exc))) from None

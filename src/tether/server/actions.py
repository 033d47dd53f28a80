"""The trail of actions in the JSON API, for group admin: `GET /api/actions` (by subject, by
actor, a page below a cursor) and `GET /api/runs/{id}/actions`, newest first, with response
models. It reads tether.actions and writes nothing; the pages show the same entries.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict

from tether.actions import ActionInfo, list_actions
from tether.app import App
from tether.server.api import BEARER, ERRORS, Access, CurrentUser, RunId
from tether.server.http import StrictRoute
from tether.store.port.actions import NEWEST
from tether.views import iso

NEXT = {
    "Link": {"description": 'The next page: `</api/actions?...&before=...>; rel="next"`',
             "schema": {"type": "string"}},
    "X-Next-Cursor": {"description": "The `before` of the next page", "schema": {"type": "string"}},
}  # fmt: skip


class ActionOut(BaseModel):
    """One action taken: who (a user, or cli:<login>), through what (page, api, cli), from
    where, on what (a run id, an outbox message id, a user name), done or refused, and what it
    said (redacted)."""

    model_config = ConfigDict(frozen=True)

    id: int
    at: str
    actor: str
    via: str
    client: str
    action: str
    subject: str
    outcome: str
    detail: str

    @classmethod
    def of(cls, entry: ActionInfo) -> ActionOut:
        return cls(**{**asdict(entry), "at": iso(entry.at) or ""})


Limit = Annotated[int, Query(ge=1, le=1000)]
Before = Annotated[int, Query(ge=1, le=NEWEST, description="Actions older than the one with "
                              "this id (a page's `X-Next-Cursor`)")]  # fmt: skip


def build_actions(app: App) -> APIRouter:
    router = APIRouter(prefix="/api", route_class=StrictRoute, responses=ERRORS)
    access = Access(app)
    page: dict[int | str, dict[str, Any]] = {
        200: {"description": "A page of actions, newest first; with more after it, the headers "
                             "name the next page", "headers": NEXT}}  # fmt: skip

    async def answer(
        request: Request, response: Response, subject: str | None, actor: str | None,
        before: int, limit: int,
    ) -> list[ActionOut]:  # fmt: skip
        # One more is read to know whether a next page exists.
        found = await list_actions(app, subject=subject, actor=actor, before=before,
                                   limit=limit + 1)  # fmt: skip
        if len(found) > limit:
            after = found[limit - 1].id
            following = request.url.include_query_params(before=after)
            response.headers["Link"] = f'<{following.path}?{following.query}>; rel="next"'
            response.headers["X-Next-Cursor"] = str(after)
        return [ActionOut.of(a) for a in found[:limit]]

    @router.get("/actions", summary="Actions people took on runs and messages, newest first "
                "(group admin)", response_model=list[ActionOut], responses=page,
                dependencies=[Depends(BEARER)])  # fmt: skip
    async def actions(
        user: CurrentUser,
        request: Request,
        response: Response,
        subject: Annotated[str | None, Query(min_length=1, max_length=2048, description=(
            "Actions on this run id, outbox message id or user name"))] = None,
        actor: Annotated[str | None, Query(min_length=1, max_length=512, description=(
            "Actions by this user (the CLI's: cli:<login>)"))] = None,
        before: Before = NEWEST,
        limit: Limit = 100,
    ) -> list[ActionOut]:  # fmt: skip
        Access.admin(user, "see the actions taken")
        return await answer(request, response, subject, actor, before, limit)

    @router.get("/runs/{run_id}/actions", summary="Actions people took on a run, newest first "
                "(group admin)", response_model=list[ActionOut], responses=page,
                dependencies=[Depends(BEARER)])  # fmt: skip
    async def run_actions(
        run_id: RunId,
        user: CurrentUser,
        request: Request,
        response: Response,
        before: Before = NEWEST,
        limit: Limit = 100,
    ) -> list[ActionOut]:
        await access.run(run_id, user)
        Access.admin(user, "see the actions taken")
        return await answer(request, response, run_id, None, before, limit)

    return router

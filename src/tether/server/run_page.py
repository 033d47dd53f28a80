"""The run page (`GET /runs/{id}`): a run's state in words, its timeline, its event history with
inputs and outputs, its values, parent and children, an agent run's conversation, and for group
admin the actions cancel (asked first: `?confirm=cancel`), resume, send an event and fork; plus
`GET /api/runs/{id}/transcript`.

It decides no access of its own (api.Access, the inbox's sessions and CSRF tokens) and holds no
engine logic: actions call the App. Everything shown is redacted (tether.views) and escaped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import RedirectResponse
from markupsafe import Markup
from pydantic import BaseModel

from tether.actions import about_event, about_fork, list_actions, recorded
from tether.agents.transcript import Price, Transcript, transcript_json, transcript_of
from tether.app import App
from tether.approvals.model import Approval
from tether.clock import to_datetime
from tether.core.handle import RunInfo
from tether.errors import ConfigurationError, TetherError
from tether.redact import redact_text
from tether.server.api import ERRORS, CurrentUser, RunId
from tether.server.auth import actor_of
from tether.server.http import StrictRoute
from tether.server.inbox import Inbox, Visitor
from tether.server.live import Scope, Watch, approvals_of_run, state
from tether.server.timeline import child_ids, render_timeline
from tether.store.port import Checkpoint, RunRecord, RunStatus
from tether.text import visible
from tether.views import (
    checkpoint_json,
    held_reason,
    run_json,
    stored,
    value_json,
)

log = logging.getLogger("tether.server")

FOLD_CHARS = 300  # of a value shown before the rest is folded away in a <details>
ACTIONS = ("cancel", "resume", "send", "fork")
# What a redirect after an action says; the query string names one of these, never the text
# itself, so a crafted link cannot put words on the page.
DONE = {
    "cancel": "Cancel requested: a waiting or pending run ends now, a running one at its next "
    "await.",
    "resume": "Resumed: a worker takes the run on again.",
    "send": "Event delivered.",
    "fork": "Forked: this is the new run.",
}
TRAIL_SHOWN = 50  # the newest actions on the run; GET /api/runs/{id}/actions pages the rest
_RESUMABLE = frozenset({RunStatus.FAILED, RunStatus.DEAD, RunStatus.HELD})
# What cancelling does to a run in its status, as the confirmation page says before it is done
# (handle.cancel: a waiting or pending run ends now, a running one at its next await).
CANCELS = {
    RunStatus.PENDING: "No worker has claimed it yet: it ends cancelled now.",
    RunStatus.WAITING: "It is waiting: it ends cancelled now, and nothing it waits for wakes it.",
    RunStatus.HELD: "It is held: it ends cancelled now, instead of waiting for code that "
    "replays it.",
    RunStatus.RUNNING: "It is running on worker {owner}: it ends cancelled at its next await "
    "(the workflow and the step it awaits see the cancellation), at once if this server runs "
    "that worker, else at the worker's next heartbeat; a worker that adopts it from a lost "
    "owner ends it before it goes on.",
}


@dataclass(frozen=True, slots=True)
class Shown:
    """A value as the page prints it: its JSON text, and its start when it is folded."""

    text: str
    short: str
    folded: bool


def shown_value(value: object) -> Shown:
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    if len(text) <= FOLD_CHARS:
        return Shown(text, text, False)
    return Shown(text, text[:FOLD_CHARS], True)


class TranscriptOut(BaseModel):
    """An agent run's conversation (tether.agents.transcript.transcript_json): entries, each
    with its `kind` (message, model_call, approval, tool_call), and totals. Redacted."""

    run_id: str
    workflow: str
    status: str
    entries: list[dict[str, Any]]
    totals: dict[str, Any]


class RunPage:
    """What the run page reads and does, over the inbox's pages and sessions."""

    def __init__(self, app: App, inbox: Inbox, prices: Mapping[str, Price] | None) -> None:
        self.app = app
        self.inbox = inbox
        self.prices = dict(prices or {})

    async def show(
        self,
        visitor: Visitor,
        run_id: str,
        *,
        status: int = 200,
        done: str = "",
        error: str = "",
        entered: dict[str, str] | None = None,
    ) -> Response:
        watch = Watch(Scope.RUN, run_id)
        try:
            digest = await state(self.app, visitor.user, watch)  # 404 unless they may see it
        except HTTPException:
            return self.inbox.not_found(visitor, "run", run_id)
        handle = await self.app.get(run_id)
        info = await handle.info()
        record = await self.app.engine.store.get_run(run_id)
        checkpoints = await handle.checkpoints()
        approvals = await approvals_of_run(self.app, visitor.user, run_id)
        now = self.app.engine.clock.now()
        children = await self._visible(visitor, child_ids(checkpoints))
        parent = None
        if record is not None and record.parent_id:
            found = await self._visible(visitor, [record.parent_id])
            parent = found[0] if found else None
        transcript = transcript_of(info, checkpoints, approvals, prices=self.prices)
        serde = self.app.engine.serde
        values = [
            value_json(v, json.loads(serde.dumps(v.value, what=f"value {v.key!r}")))
            for v in await self.app.list_values(run_id)
        ]
        # render_timeline escapes every text it writes (tether.server.timeline): marking its
        # SVG safe puts no unescaped value on the page.
        drawn = render_timeline(info, checkpoints, children=children, approvals=approvals, now=now)
        svg = Markup(drawn)  # noqa: S704 (escaped by render_timeline, as said above)
        return self.inbox.page(
            "run.html",
            visitor,
            status,
            watch=watch,
            digest=digest,
            run=run_json(info),
            facts=facts(info, record, approvals, now),
            timeline=svg,
            steps=[step_view(c, approvals) for c in checkpoints],
            step_names=[c.name for c in checkpoints],
            approvals=approvals,
            values=[{**v, "shown": shown_value(v["value"])} for v in values],
            parent=parent,
            children=children,
            conversation=conversation(transcript),
            may_act=visitor.user.is_admin,
            trail=await list_actions(self.app, subject=run_id, limit=TRAIL_SHOWN)
            if visitor.user.is_admin
            else [],
            resumable=info.status in _RESUMABLE,
            finished=info.status.terminal,
            done=DONE.get(done, ""),
            error=error,
            entered=entered or {},
        )

    async def _visible(self, visitor: Visitor, run_ids: list[str]) -> list[RunInfo]:
        """The runs of these ids that the visitor may see (the others are not linked)."""
        found = []
        for run_id in run_ids:
            try:
                await self.inbox.access.run(run_id, visitor.user)
            except HTTPException:
                continue
            found.append(await (await self.app.get(run_id)).info())
        return found

    async def act(self, request: Request, run_id: str, action: str) -> Response:
        """One admin action from the page's forms: checked like an inbox decision (session,
        same origin, CSRF token), logged with who and from where, then back to the page."""
        inbox = self.inbox
        posted = await inbox.posted(request, "repeat it")
        if isinstance(posted, Response):
            return posted
        visitor, form = posted
        try:
            await inbox.access.run(run_id, visitor.user)
        except HTTPException:
            return inbox.not_found(visitor, "run", run_id)
        if action not in ACTIONS:
            return inbox.problem(visitor, 404, "No such action", f"Runs have no {action!r}.")
        if not visitor.user.is_admin:
            return inbox.problem(visitor, 403, "Refused", "Only group admin may act on runs.")
        entered = {k: form.get(k, "") for k in ("key", "payload", "from_step")}
        target = run_id
        actor = actor_of(visitor.user, request, "page")
        try:
            async with recorded(self.app, actor, action, run_id,
                                detail=about(action, entered)) as said:  # fmt: skip
                target = await self._do(action, run_id, entered, visitor)
                if target != run_id:
                    said.detail = about_fork(entered["from_step"], target)
        except TetherError as exc:
            # Refused by the library (a finished run, a step it did not record, a payload
            # that is not JSON): said on the page, with what was typed kept.
            log.warning("run page: %s of run %s by %s refused: %s", action, visible(run_id),
                        visible(visitor.user.name), visible(str(exc)))  # fmt: skip
            return await self.show(
                visitor, run_id, status=409, error=redact_text(str(exc)), entered=entered
            )
        log.info("run page: %s of run %s by %s from %s%s", action, visible(run_id),
                 visible(visitor.user.name), visible(actor.client),
                 f" (new run {visible(target)})" if target != run_id else "")  # fmt: skip
        return RedirectResponse(f"/runs/{quote(target, safe='')}?{urlencode({'done': action})}",
                                303)  # fmt: skip

    async def _do(self, action: str, run_id: str, entered: dict[str, str], who: Visitor) -> str:
        """Do the action; the run to show afterwards (a fork's new run)."""
        do = {"cancel": self._cancel, "resume": self._resume, "send": self._send,
              "fork": self._fork}  # fmt: skip
        return await do[action](run_id, entered, who)

    async def _cancel(self, run_id: str, entered: dict[str, str], who: Visitor) -> str:
        await (await self.app.get(run_id)).cancel()
        return run_id

    async def _resume(self, run_id: str, entered: dict[str, str], who: Visitor) -> str:
        await self.app.resume(run_id)
        return run_id

    async def _send(self, run_id: str, entered: dict[str, str], who: Visitor) -> str:
        key = entered["key"].strip()
        text = entered["payload"].strip()
        try:
            payload = json.loads(text) if text else None
        except ValueError as exc:
            raise ConfigurationError(
                f"the payload is not JSON ({exc}); fix it and send again"
            ) from None
        await self.app.send(run_id, key, payload)
        return run_id

    async def _fork(self, run_id: str, entered: dict[str, str], who: Visitor) -> str:
        fork = await self.app.fork(run_id, entered["from_step"], started_by=who.user.name)
        return fork.id

    async def confirm_cancel(self, visitor: Visitor, run_id: str) -> Response:
        """The page that asks before a cancel (`GET /runs/{id}?confirm=cancel`): what cancelling
        does to this run in its state, and the form that does it (the action's POST). Group
        admin only (403); a run the visitor may not see: 404; a finished one: 409, no form."""
        inbox = self.inbox
        try:
            await inbox.access.run(run_id, visitor.user)
        except HTTPException:
            return inbox.not_found(visitor, "run", run_id)
        if not visitor.user.is_admin:
            return inbox.problem(visitor, 403, "Refused", "Only group admin may act on runs.")
        handle = await self.app.get(run_id)
        info = await handle.info()
        record = await self.app.engine.store.get_run(run_id)
        approvals = await approvals_of_run(self.app, visitor.user, run_id)
        children = await self._visible(visitor, child_ids(await handle.checkpoints()))
        effects = cancel_effects(info, record, approvals, children)
        return inbox.page("run_cancel.html", visitor, 409 if info.status.terminal else 200,
                          run=run_json(info), effects=effects,
                          finished=info.status.terminal)  # fmt: skip


# -- what the page shows -------------------------------------------------------------------------


def facts(
    info: RunInfo, record: RunRecord | None, approvals: list[Approval], now: float
) -> list[str]:
    """The run's state in sentences: who runs it, what it waits for and until when, why it is
    held or dead, how it finished."""
    out: list[str] = []
    status = info.status
    if status is RunStatus.RUNNING and record is not None:
        expires = record.lease_expires_at
        adopted = f" (adopted: claimed {record.epoch} times)" if record.epoch > 1 else ""
        if expires is not None and expires < now:
            out.append(f"Running, but its owner {record.owner or '?'} is lost: the lease expired "
                       f"at {_when(expires)}; another worker takes it over{adopted}.")  # fmt: skip
        else:
            out.append(f"Running on worker {record.owner or '?'}, lease until "
                       f"{_when(expires)}{adopted}.")  # fmt: skip
        if record.cancel_requested:
            out.append("Cancel requested: it ends at its next await.")
    elif status is RunStatus.WAITING and record is not None:
        parts = []
        if record.wake_on:
            parts.append("events " + ", ".join(record.wake_on))
        if record.wake_at is not None:
            parts.append(f"until {_when(record.wake_at)}")
        out.append("Waiting" + (" for " + " ".join(parts) if parts else "") + ".")
    elif status is RunStatus.PENDING:
        out.append("Pending: no worker has claimed it yet.")
    elif status is RunStatus.HELD:
        out.append("Held: " + held_reason(info.id) + ".")
    elif status is RunStatus.DEAD:
        why = (f"after {info.failures} executions in a row failed outside the workflow's code"
               if info.failures else "since no live worker serves its workflow")  # fmt: skip
        out.append(f"Dead-lettered {why}; fix the cause, then resume it.")
    elif status.terminal:
        out.append(f"Finished: {status}" + (f" at {_when(info.finished_at.timestamp())}."
                                           if info.finished_at else "."))  # fmt: skip
    pending = [a for a in approvals if a.status == "pending"]
    for a in pending:
        out.append(f"Approval pending: {a.title!s} (expires {_when(a.expires_at.timestamp())}).")
    return out


def about(action: str, entered: Mapping[str, str]) -> str:
    """What the trail of actions says of a page's action besides its name and run."""
    if action == "send":
        return about_event(entered["key"].strip())
    if action == "fork":
        return about_fork(entered["from_step"])
    return ""


def cancel_effects(
    info: RunInfo, record: RunRecord | None, approvals: list[Approval], children: list[RunInfo]
) -> list[str]:
    """What cancelling does to this run, in sentences (CANCELS, then what goes with it)."""
    said = CANCELS.get(info.status)
    if said is None:
        return [f"It has finished ({info.status}): there is nothing to cancel."]
    out = [said.format(owner=(record.owner if record else None) or "?")]
    if record is not None and record.cancel_requested:
        out.append("Cancel has been requested already: asking again changes nothing.")
    if pending := sum(a.status == "pending" for a in approvals):
        out.append(f"Its pending approvals ({pending}) end cancelled: a cancelled approval "
                   f"approves nothing.")  # fmt: skip
    if unfinished := sum(not c.status.terminal for c in children):
        out.append(f"Its unfinished child runs ({unfinished}) are cancelled the same way.")
    out.append("A cancelled run has finished for good: it cannot be resumed (a fork can start a "
               "new run from its recorded steps).")  # fmt: skip
    return out


def step_view(cp: Checkpoint, approvals: list[Approval]) -> dict[str, Any]:
    """A checkpoint as the history lists it: its JSON form, its values shown folded, and the
    approval an approval checkpoint asked (completed means asked, not decided)."""
    row = checkpoint_json(cp)
    asked = None
    if cp.kind in ("approval", "approval-wait"):
        step = cp.name if cp.kind == "approval" else cp.name.removesuffix(":wait")
        asked = next((a for a in approvals if a.step == step), None)
    return {
        **row,
        "args_shown": None if cp.args is None else shown_value(stored(cp.args)),
        "result_shown": None if cp.result is None else shown_value(stored(cp.result)),
        "approval": asked,
    }


def conversation(t: Transcript) -> dict[str, Any] | None:
    """The transcript's JSON with its values folded for the page; None for a run that made no
    agent model call."""
    if not t.entries:
        return None
    doc = transcript_json(t)
    for entry in doc["entries"]:
        for name in ("arguments", "result", "error"):
            if entry.get(name) is not None:
                entry[f"{name}_shown"] = shown_value(entry[name])
    return doc


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return to_datetime(seconds).strftime("%Y-%m-%d %H:%M:%S UTC")


# -- the routes -----------------------------------------------------------------------------------


def build_run_page(
    app: App, inbox: Inbox | None = None, *, prices: Mapping[str, Price] | None = None
) -> APIRouter:
    """The run page and its actions (not in the OpenAPI document), and the transcript route
    under /api (in it). `prices` (by model name) gives model calls a cost; none by default."""
    router = APIRouter()
    pages = RunPage(app, inbox or Inbox(app), prices)

    @router.get("/runs/{run_id:path}", include_in_schema=False)
    async def run(request: Request, run_id: str, done: str = "", confirm: str = "") -> Response:
        visitor = await pages.inbox.visitor(request)
        if visitor is None:
            return pages.inbox.to_sign_in(request)
        # A query, not a path segment: a run id may end with "/cancel" (it may hold "/").
        if confirm == "cancel":
            return await pages.confirm_cancel(visitor, run_id)
        return await pages.show(visitor, run_id, done=done)

    # The run id may hold "/" (a child's id): the action is the last segment of the path.
    @router.post("/runs/{run_id:path}/{action}", include_in_schema=False)
    async def act(request: Request, run_id: str, action: str) -> Response:
        return await pages.act(request, run_id, action)

    api = APIRouter(prefix="/api", route_class=StrictRoute, responses=ERRORS)
    access = pages.inbox.access

    @api.get(
        "/runs/{run_id}/transcript",
        response_model=TranscriptOut,
        summary="An agent run's conversation: messages, model and tool calls, approvals",
    )
    async def transcript(run_id: RunId, user: CurrentUser) -> dict[str, Any]:
        await access.run(run_id, user)
        handle = await app.get(run_id)
        approvals = await app.list_approvals(None, run_id=run_id)
        if not user.is_admin:
            approvals = [a for a in approvals if user.reviewer.may_decide(a.reviewers)]
        found = transcript_of(await handle.info(), await handle.checkpoints(), approvals,
                              prices=pages.prices)  # fmt: skip
        return transcript_json(found)

    router.include_router(api)
    return router

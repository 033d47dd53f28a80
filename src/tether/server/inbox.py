"""The reviewers' inbox (DESIGN §5): server-rendered pages for people. Sign in with a token (or
OpenID Connect, oidc.py; or a login proxy's header, trusted.py), see the approvals waiting for
you, open one, decide it with a click; follow runs step by step.

Routes: `GET /` (sign-in, or the inbox), `POST /login`, `POST /logout`, `GET /approvals/{id}`,
`POST /approvals/{id}/decision`, `/static/` (inbox.css, inbox.js, timeline.css), and `GET /live`
(live.py); the runs explorer is explorer.py, the run page run_page.py, both on these pages and
sessions. Who may see what is the JSON API's rule (api.Access); what a refusal means is its
table too. Every form carries a CSRF token tied to the session, and every POST must come from
one of this server's origins (http.Site). Templates autoescape everything; values reach the
page only as text or attributes, never inside a script (the CSP forbids inline ones anyway), and
every control, bidi or zero-width character in them is spelled out as `<U+XXXX>` (tether.text),
styled apart where the `shown` filter renders it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup, escape

from tether.app import App
from tether.approvals.model import Approval
from tether.errors import ApprovalRefused, ConfigurationError, SerializationError
from tether.server.api import _REFUSED_STATUS, Access
from tether.server.auth import SESSION_COOKIE, Auth, SignInRefused, client_of
from tether.server.http import Site, origin
from tether.server.live import (
    Scope,
    Watch,
    build_live,
    pending_for,
    state,
)
from tether.server.sse import event_stream, start_offset
from tether.streams import check_stream_key
from tether.text import pieces, visible
from tether.users import User
from tether.views import history_json, takes_response

HERE = Path(__file__).parent
ASSETS = {"inbox.css": "text/css; charset=utf-8", "inbox.js": "text/javascript; charset=utf-8",
          "timeline.css": "text/css; charset=utf-8"}  # fmt: skip
# Pages may send the Referer (and so the Origin of a form POST) to this server only; the
# default no-referrer policy would make browsers send `Origin: null` with every form.
PAGE_HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "same-origin"}
ICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect width="32" height="32" '
    'rx="7" fill="#2f5fb3"/><path d="M9 10h14M16 10v13" stroke="#fff" stroke-width="3.5" '
    'stroke-linecap="round"/></svg>'
)
_FIELD_LIMIT = 64
_LOCAL_PATH = re.compile(r"/(?![/\\])[^\s\\]{0,1999}")


@dataclass(frozen=True, slots=True)
class Visitor:
    """A signed-in person: the user, their session cookie and the CSRF token of their forms."""

    user: User
    session: str
    csrf: str
    via: str = "session"  # "header": a login proxy signs them in, and out


class BadForm(ValueError):
    """A form body that is not a plain urlencoded form of distinct fields."""


# -- helpers of the templates --------------------------------------------------------------------


def when(moment: datetime | str | None) -> str:
    """A moment for people, in UTC (ISO text, as the JSON views hold it, is accepted)."""
    if not moment:
        return ""
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def pretty(value: object) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def duration(ms: float | None) -> str:
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms:.0f} ms" if ms >= 1 else f"{ms:.2f} ms"
    seconds = ms / 1000
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def first_line(error: object) -> str:
    """The first line of an error message (or of a stored error's `message`)."""
    message = error.get("message") if isinstance(error, dict) else error
    text = str(message or "").strip()
    return text.splitlines()[0] if text else ""


def spelled(value: object) -> object:
    """Every value a template prints (Jinja's finalize): text with its control, bidi and
    zero-width characters spelled out as `<U+XXXX>`, safe in any place (attributes too)."""
    return visible(value) if isinstance(value, str) and not isinstance(value, Markup) else value


def shown(value: object) -> Markup:
    """Text for the page's body, escaped, its spelled-out characters in a `<span class=hidden>`
    so that a reviewer sees at a glance that the text holds something invisible."""
    out = []
    for piece, special in pieces(str(value)):
        text = escape(piece)
        out.append(Markup('<span class="hidden-char">{}</span>').format(text) if special else text)
    return Markup("").join(out)


def exact(value: object) -> Markup:
    """Text kept exactly as it is, escaped: ids that scripts and forms send back (a run id in
    `data-run-id`, an option's `value`, a draft in a textarea), where spelling out a character
    would change what is sent."""
    return escape(value)


def templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=spelled,
    )
    env.filters.update(
        when=when, pretty=pretty, compact=compact, duration=duration, first_line=first_line,
        shown=shown, exact=exact,
    )  # fmt: skip
    env.globals["quote"] = lambda text: quote(str(text), safe="")
    return env


# -- requests ------------------------------------------------------------------------------------


def same_origin(request: Request) -> bool:
    """Whether a POST came from a page of this server: the Origin header (else the Referer)
    is one of the server's origins (configured, or the address the request reached; never
    whatever the Host header claims)."""
    source = request.headers.get("origin") or request.headers.get("referer") or ""
    site: Site = request.app.state.site
    found = origin(source)
    return found is not None and found in site.origins(request.scope)


async def read_form(request: Request) -> dict[str, str]:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise BadForm("send the form as application/x-www-form-urlencoded")
    try:
        pairs = parse_qsl(
            (await request.body()).decode(),
            keep_blank_values=True,
            strict_parsing=False,
            max_num_fields=_FIELD_LIMIT,
        )
    except (UnicodeDecodeError, ValueError):
        raise BadForm("the form is not UTF-8 urlencoded, or has too many fields") from None
    form = dict(pairs)
    if len(form) != len(pairs):
        raise BadForm("the form repeats a field; send each field once")
    return form


def local_path(path: str | None) -> str:
    """`path` if it is a path on this server (where to go after signing in), else "/"."""
    return path if path and _LOCAL_PATH.fullmatch(path) else "/"


# -- the pages ------------------------------------------------------------------------------------


class Inbox:
    """The pages, and what they need from the App."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.access = Access(app)
        self.env = templates()

    async def visitor(self, request: Request, *, touch: bool = True) -> Visitor | None:
        """The signed-in person, or None; `touch=False` for requests a page makes by itself
        (its live streams reconnecting), which are not activity and keep no session alive."""
        auth: Auth = request.app.state.auth
        signed = await auth.session(request, touch=touch)
        if signed is None:
            return None
        return Visitor(signed.user, signed.id, auth.csrf_token(signed.id), signed.via)

    def page(
        self,
        name: str,
        visitor: Visitor | None,
        status: int = 200,
        *,
        watch: Watch | None = None,
        digest: str = "",
        **context: Any,
    ) -> HTMLResponse:
        html = self.env.get_template(name).render(
            visitor=visitor, watch=watch, digest=digest, **context
        )
        return HTMLResponse(html, status, headers=PAGE_HEADERS)

    def problem(self, visitor: Visitor | None, status: int, title: str, message: str) -> Response:
        return self.page("problem.html", visitor, status, title=title, message=message)

    def sign_in(
        self, request: Request, *, status: int = 200, error: str = "", target: str | None = None
    ) -> HTMLResponse:
        goal = local_path(target if target is not None else request.query_params.get("next"))
        oidc = getattr(request.app.state, "oidc_name", None)  # "Sign in with <oidc>"
        return self.page("signin.html", None, status, error=error, next=goal, oidc=oidc)

    async def refused(self, request: Request, exc: Exception) -> Response:
        """The page of a SignInRefused (an exception handler of the server)."""
        assert isinstance(exc, SignInRefused)
        return self.problem(None, exc.status_code, exc.title, str(exc.detail))

    @staticmethod
    def to_sign_in(request: Request) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse("/?" + urlencode({"next": target}), 303)

    # -- pages with data -----------------------------------------------------------------------

    async def inbox(self, visitor: Visitor) -> Response:
        watch = Watch(Scope.INBOX)
        digest = await state(self.app, visitor.user, watch)
        approvals = await pending_for(self.app, visitor.user)
        return self.page("inbox.html", visitor, watch=watch, digest=digest, approvals=approvals)

    async def approval(
        self,
        request: Request,
        visitor: Visitor,
        approval_id: str,
        *,
        status: int = 200,
        refusal: dict[str, str] | None = None,
        entered: dict[str, str] | None = None,
    ) -> Response:
        watch = Watch(Scope.APPROVAL, approval_id)
        try:
            digest = await state(self.app, visitor.user, watch)  # 404 unless they may see it
        except HTTPException:
            return self.not_found(visitor, "approval", approval_id)
        shown = await self.app.get_approval(
            approval_id, viewer=visitor.user.reviewer, channel="inbox", client=client_of(request)
        )
        history = [history_json(e) for e in await self.app.approval_history(approval_id)]
        return self.page(
            "approval.html",
            visitor,
            status,
            watch=watch,
            digest=digest,
            approval=shown,
            may_decide=shown.may_decide(visitor.user.reviewer),
            responds={o.id for o in shown.options if takes_response(o, shown)},
            history=history,
            refusal=refusal,
            entered=entered or {},
        )

    def not_found(self, visitor: Visitor, what: str, ident: str) -> Response:
        return self.problem(
            visitor,
            404,
            f"No such {what}",
            f"There is no {what} {ident!r} that you may see. It may never have "
            f"existed, or it is meant for other reviewers.",
        )

    # -- signing in -----------------------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        """Open a session for the form's token; a client with too many failures gets 429."""
        if not same_origin(request):
            return self.forged(None)
        try:
            form = await read_form(request)
        except BadForm as exc:
            return self.problem(None, 400, "Unreadable form", str(exc))
        auth: Auth = request.app.state.auth
        target = local_path(form.get("next"))
        opened = await auth.open_session(form.get("token", "").strip(), request)
        if opened is None:
            try:  # only failures are slowed: a valid token signs in (see Auth.bearer)
                auth.check_throttle(request)
            except HTTPException as exc:
                page = self.sign_in(request, status=429, target=target, error=str(exc.detail))
                page.headers.update(exc.headers or {})
                return page
            auth.failure(request, "an inbox sign-in was refused (unknown or revoked token)")
            return self.sign_in(
                request,
                status=401,
                target=target,
                error="That token is unknown or has been revoked.",
            )
        response = RedirectResponse(target, 303)
        response.set_cookie(SESSION_COOKIE, opened[1], max_age=int(auth.lifetime), path="/",
                            secure=auth.secure, httponly=True, samesite="strict")  # fmt: skip
        return response

    # -- the decision ---------------------------------------------------------------------------

    async def posted(
        self, request: Request, again: str
    ) -> tuple[Visitor, dict[str, str]] | Response:
        """The signed-in visitor and the form of a POST from one of this server's pages (its
        session, a readable form, the same origin, the session's CSRF token), or the page
        that refuses it; `again` ends the signed-out message ("repeat the decision")."""
        visitor = await self.visitor(request)
        if visitor is None:
            return self.problem(
                None, 403, "Signed out", f"Your session has ended; sign in again and {again}."
            )
        try:
            form = await read_form(request)
        except BadForm as exc:
            return self.problem(visitor, 400, "Unreadable form", str(exc))
        auth: Auth = request.app.state.auth
        if not same_origin(request) or not auth.check_csrf(visitor.session, form.get("csrf", "")):
            return self.forged(visitor)
        return visitor, form

    async def decide(self, request: Request, approval_id: str) -> Response:
        posted = await self.posted(request, "repeat the decision")
        if isinstance(posted, Response):
            return posted
        visitor, form = posted
        try:
            found = await self.access.approval(approval_id, visitor.user)
        except HTTPException:
            return self.not_found(visitor, "approval", approval_id)
        entered = {k: form.get(k, "") for k in ("comment", "response")}
        option = form.get("option", "")
        try:
            response = _response(found, option, entered["response"])
            await self.app.decide(
                approval_id,
                option,
                reviewer=visitor.user.reviewer,
                operation_digest=form.get("operation_digest", ""),
                comment=entered["comment"].strip() or None,
                response=response,
                channel="inbox",
                client=client_of(request),
            )
        except ApprovalRefused as exc:
            refusal = {"reason": exc.reason or "refused", "message": str(exc)}
            return await self.approval(
                request,
                visitor,
                approval_id,
                refusal=refusal,
                entered=entered,
                status=_REFUSED_STATUS.get(exc.reason or "", 409),
            )
        except (ConfigurationError, SerializationError) as exc:
            refusal = {"reason": "invalid_request", "message": str(exc)}
            return await self.approval(
                request, visitor, approval_id, refusal=refusal, entered=entered, status=422
            )
        return RedirectResponse(f"/approvals/{quote(approval_id, safe='')}", 303)

    def forged(self, visitor: Visitor | None) -> Response:
        return self.problem(
            visitor,
            403,
            "Refused",
            "This form did not come from this inbox, or it is out of date. "
            "Nothing was changed: reload the page and try again.",
        )


def _response(approval: Approval, option: str, text: str) -> object:
    """The typed response of a decision: the JSON in the response box, for an option that
    takes one (ignored for the others, so a stray draft never spoils an approval)."""
    chosen = next((o for o in approval.options if o.id == option), None)
    if chosen is None or not takes_response(chosen, approval) or not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(
            f"the response is not JSON ({exc}); fix it and decide again"
        ) from None


# -- the routes -----------------------------------------------------------------------------------


def build_inbox(app: App, inbox: Inbox | None = None) -> APIRouter:
    """The inbox's routes, live updates and assets (none of them in the OpenAPI document)."""
    router = APIRouter(include_in_schema=False)
    inbox = inbox or Inbox(app)

    @router.get("/")
    async def home(request: Request) -> Response:
        visitor = await inbox.visitor(request)
        return inbox.sign_in(request) if visitor is None else await inbox.inbox(visitor)

    @router.post("/login")
    async def login(request: Request) -> Response:
        return await inbox.login(request)

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        visitor = await inbox.visitor(request)
        auth: Auth = request.app.state.auth
        if visitor is not None:
            try:
                form = await read_form(request)
            except BadForm as exc:
                return inbox.problem(visitor, 400, "Unreadable form", str(exc))
            if not same_origin(request) or not auth.check_csrf(
                visitor.session, form.get("csrf", "")
            ):
                return inbox.forged(visitor)
            # The cookie and its CSRF token open nothing now.
            await auth.end_session(request, visitor.user)
        response = RedirectResponse("/", 303)
        response.delete_cookie(
            SESSION_COOKIE, path="/", secure=auth.secure, httponly=True, samesite="strict"
        )
        return response

    @router.get("/approvals/{approval_id}")
    async def approval(request: Request, approval_id: str) -> Response:
        visitor = await inbox.visitor(request)
        if visitor is None:
            return inbox.to_sign_in(request)
        return await inbox.approval(request, visitor, approval_id)

    @router.post("/approvals/{approval_id}/decision")
    async def decision(request: Request, approval_id: str) -> Response:
        return await inbox.decide(request, approval_id)

    @router.get("/live/streams")
    async def run_stream(request: Request, run: str, key: str = "tokens") -> Response:
        """The run page's live output: the run's stream as SSE, for a signed-in person who
        may see the run (EventSource resumes by Last-Event-ID after a reconnect)."""
        visitor = await inbox.visitor(request, touch=False)
        if visitor is None:
            raise HTTPException(401, "sign in first")
        await inbox.access.run(run, visitor.user)
        try:
            check_stream_key(key)
        except ConfigurationError as exc:
            raise HTTPException(422, str(exc)) from None
        auth: Auth = request.app.state.auth
        start = start_offset(request, None)
        return event_stream(
            app, run, key, start, True, lambda: auth.still_valid(request, "session")
        )

    @router.get("/static/{name}")
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            raise HTTPException(404, f"no asset {name!r}")
        return FileResponse(
            HERE / "static" / name, media_type=ASSETS[name], headers={"Cache-Control": "no-cache"}
        )

    @router.get("/favicon.ico")
    async def icon() -> Response:
        return Response(ICON, media_type="image/svg+xml",
                        headers={"Cache-Control": "max-age=86400"})  # fmt: skip

    router.include_router(build_live(app))
    return router

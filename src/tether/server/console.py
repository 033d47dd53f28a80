"""The operations pages for group admin (the console, DESIGN §5): workers, queues, schedules,
the outbox and dead runs, server-rendered like the inbox and updated live over its /live stream,
with one action: send a failed outbox message again. Routes under /ops; sessions, CSRF tokens,
templates and problem pages are the inbox's. This module renders: what each page shows is read
by operations.py (the JSON API's reads too), and nothing here reads the store or decides.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from tether.app import App
from tether.errors import ConfigurationError
from tether.redact import redact_text
from tether.server.auth import actor_of
from tether.server.inbox import Inbox, Visitor
from tether.server.live import Scope, Watch, digest
from tether.server.operations import PAGES, retry_message

TABS = tuple((name, page.label) for name, page in PAGES.items())


def ago(seconds: float) -> str:
    """How long ago, for people: "4 s ago", "3 min ago", "2 h ago", "5 d ago"."""
    if seconds < 0:
        return "in the future (clock skew)"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


class Console:
    """The pages, each rendered from its operations.Page."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.inbox = Inbox(app)
        self.inbox.env.filters["ago"] = ago

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

    async def show(self, name: str, visitor: Visitor) -> Response:
        """Page `name`, with the digest of the very data it shows (what /live compares)."""
        page = PAGES[name]
        data = await page.read(self.app)
        return self.inbox.page(f"ops_{name}.html", visitor, watch=Watch(Scope.OPS, name),
                               digest=digest(page.watched(data)), data=data, section="ops",
                               tab=name, tabs=TABS)  # fmt: skip

    async def retry(self, request: Request, message_id: str) -> Response:
        """Send a failed message again, for an admin's form with its CSRF token from one of
        this server's origins."""
        inbox = self.inbox
        posted = await inbox.posted(request, "retry the message")
        if isinstance(posted, Response):
            return posted
        visitor, _ = posted
        if not visitor.user.is_admin:
            return self.not_admin(visitor)
        try:
            await retry_message(self.app, message_id, actor_of(visitor.user, request, "page"))
        except ConfigurationError as exc:  # unknown, or not failed (sent again already)
            return inbox.problem(visitor, 409, "Not sent again", redact_text(str(exc)))
        return RedirectResponse("/ops/outbox", 303)


def build_console(app: App) -> APIRouter:
    """The operations pages' routes (none of them in the OpenAPI document)."""
    router = APIRouter(include_in_schema=False)
    console = Console(app)

    @router.get("/ops")
    async def home() -> Response:
        return RedirectResponse("/ops/workers", 303)

    def route(name: str) -> None:
        async def show(request: Request) -> Response:
            found = await console.admin(request)
            return found if isinstance(found, Response) else await console.show(name, found)

        router.add_api_route(f"/ops/{name}", show, methods=["GET"], name=f"ops_{name}")

    for name in PAGES:
        route(name)

    # Message ids hold the run id, which may hold "/" (sent percent-encoded, decoded here).
    @router.post("/ops/outbox/{message_id:path}/retry")
    async def retry(request: Request, message_id: str) -> Response:
        return await console.retry(request, message_id)

    return router

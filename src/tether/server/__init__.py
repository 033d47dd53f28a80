"""The HTTP server of an App (`tether serve module:app`): the JSON API under /api with its
OpenAPI document, the reviewers' inbox, live updates over SSE, /metrics, and the probes
/healthz and /readyz.

create_server() assembles the parts; each part lives in its own module and none holds engine
logic. Binds 127.0.0.1 unless told otherwise, and denies every /api route without a token;
OpenID Connect and a login proxy's header sign people in to the inbox only when configured.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

from fastapi import FastAPI

from tether.app import App
from tether.errors import ApprovalRefused
from tether.server.actions import build_actions
from tether.server.api import build_router, refused
from tether.server.auth import IDLE_SECONDS, SESSION_SECONDS, Auth, SignInRefused
from tether.server.console import build_console
from tether.server.counts import recent_counts
from tether.server.explorer import build_explorer
from tether.server.health import Probes
from tether.server.http import MAX_BODY, Hygiene, Site
from tether.server.inbox import Inbox, build_inbox
from tether.server.metrics import build_metrics
from tether.server.oidc import OidcConfig, build_oidc
from tether.server.run_page import build_run_page
from tether.server.trusted import DirectPeer, TrustedHeader

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def create_server(
    app: App, *, secret: bytes | None = None, secure_cookies: bool = False,
    max_body: int = MAX_BODY, origins: Sequence[str] = (),
    session_idle: timedelta = timedelta(seconds=IDLE_SECONDS),
    session_lifetime: timedelta = timedelta(seconds=SESSION_SECONDS),
    oidc: OidcConfig | None = None, trusted_header: TrustedHeader | None = None,
) -> FastAPI:  # fmt: skip
    """An ASGI application serving `app`. `secret` (at least 32 bytes) signs session cookies
    (random per process when not given: a restart signs everyone out); `secure_cookies` marks
    cookies Secure (set it behind https, as `tether serve --secure-cookies` does). `origins`
    are the public origins (`https://tether.example.com`) this server answers for; without
    them, the address each request reached. Sessions end after `session_idle` without a
    request, and after `session_lifetime` in any case. `oidc` adds sign-in by OpenID Connect
    (/login/oidc); `trusted_header` signs in whom a login proxy at a configured address names
    (docs/server.md says what each trusts)."""
    auth = Auth.make(app, secret, secure_cookies, idle=session_idle.total_seconds(),
                     lifetime=session_lifetime.total_seconds())  # fmt: skip
    auth.trusted = trusted_header
    site = Site(origins)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await app.open()  # the App's owner (`tether serve`, or the caller) closes it
        recent_counts(app).warm()  # on a large database the first read takes a while
        yield

    server = FastAPI(
        lifespan=lifespan, title="Tether", version="1", docs_url=None, redoc_url=None,
        description="Runs, events and approvals of a Tether application. Every /api route "
        "takes `Authorization: Bearer <token>` (`tether users add NAME` prints one).",
    )  # fmt: skip
    server.state.tether = app
    server.state.auth = auth
    server.state.site = site
    inbox = Inbox(app)
    server.state.inbox = inbox
    server.state.oidc_name = None if oidc is None else oidc.shown_name
    server.add_exception_handler(ApprovalRefused, refused)
    server.add_exception_handler(SignInRefused, inbox.refused)
    server.include_router(build_router(app))
    server.include_router(build_actions(app))  # /api/actions: the trail, for group admin
    if oidc is not None:
        server.include_router(build_oidc(app, oidc))
    server.include_router(build_inbox(app, inbox))  # the inbox for people, its assets and /live
    server.include_router(build_explorer(app, inbox))  # /runs, the runs explorer
    server.include_router(build_run_page(app, inbox))  # /runs/{id}, its actions; its transcript
    server.include_router(build_console(app))  # /ops: operations pages for group admin
    server.include_router(build_metrics(app))  # /metrics, for group admin or metrics
    server.add_middleware(Hygiene, max_body=max_body, hsts=secure_cookies, site=site)
    # Outermost: a probe comes by address (the kubelet's Host is the pod's IP), with no token.
    server.add_middleware(Probes, app=app)

    return server


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "DirectPeer", "OidcConfig", "TrustedHeader",
           "create_server"]  # fmt: skip

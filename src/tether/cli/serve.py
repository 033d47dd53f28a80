"""`tether serve`: the HTTP API, the reviewers' inbox and /metrics of an App, with uvicorn; by
default also the App's worker, so one process is a whole deployment.

It binds 127.0.0.1 unless told otherwise; OpenID Connect and a login proxy's header sign in
only when their options are given. Parsing and starting only: the server is tether.server's,
the worker the App's. The OIDC client secret comes from the environment, never an argument.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

import click

from tether.app import App
from tether.cli.common import load_app, log_format_option
from tether.errors import ConfigurationError
from tether.telemetry.logs import LogFormat, install_logging

if TYPE_CHECKING:  # uvicorn is the [server] extra's, imported when serving
    import uvicorn
    from starlette.types import ASGIApp

    from tether.server.oidc import OidcConfig
    from tether.server.trusted import TrustedHeader

OIDC_SECRET_ENV = "TETHER_OIDC_CLIENT_SECRET"  # noqa: S105 - the variable's name


@dataclass(frozen=True)
class SignIn:
    """How people may sign in besides tokens, as the options gave it (None: off)."""

    oidc: OidcConfig | None = None
    trusted: TrustedHeader | None = None


def sign_in_settings(
    *, issuer: str | None, client_id: str | None, username_claim: str,
    groups_claim: str | None, user_header: str | None, groups_header: str | None,
    proxies: Sequence[str],
) -> SignIn:  # fmt: skip
    """OIDC and trusted-header settings, checked before anything starts: a half-given setting
    is refused, never served without what it needs."""
    oidc = trusted = None
    if issuer is None and (client_id or groups_claim):
        raise ConfigurationError("--oidc-client-id and --oidc-groups-claim need --oidc-issuer")
    if issuer is not None:
        from tether.server.oidc import OidcConfig, check_installed

        check_installed()
        if not client_id:
            raise ConfigurationError("--oidc-issuer needs --oidc-client-id")
        secret = os.environ.get(OIDC_SECRET_ENV, "")
        if not secret:
            raise ConfigurationError(
                f"--oidc-issuer needs the client secret in ${OIDC_SECRET_ENV} (never an "
                f"argument: process lists show those)"
            )
        oidc = OidcConfig(issuer, client_id, secret, username_claim=username_claim,
                          groups_claim=groups_claim)  # fmt: skip
    if user_header is None and (proxies or groups_header):
        raise ConfigurationError(
            "--trusted-proxy and --trusted-groups-header need --trusted-user-header"
        )
    if user_header is not None:
        from tether.server.trusted import TrustedHeader

        if not proxies:
            raise ConfigurationError(
                "--trusted-user-header needs --trusted-proxy ADDR/NET (repeatable): the "
                "addresses of the login proxies it is believed from"
            )
        trusted = TrustedHeader(proxies=list(proxies), user_header=user_header,
                                groups_header=groups_header)  # fmt: skip
    return SignIn(oidc, trusted)


def server_settings(secure: bool, origins: Sequence[str]) -> bytes | None:
    """The session secret from TETHER_SESSION_SECRET (None: a random one per start), after the
    checks that make a misconfigured server refuse to start rather than run weakly."""
    from tether.server.auth import session_secret
    from tether.server.http import Site

    Site(origins)  # each must be an origin
    text = os.environ.get("TETHER_SESSION_SECRET")
    if secure and not origins:
        raise ConfigurationError(
            "--secure-cookies serves behind a proxy whose public origin this server cannot "
            "see: name it with --origin https://tether.example.com"
        )
    return None if not text else session_secret(text)


def server_config(
    server: ASGIApp, host: str, port: int, *, secure: bool,
    forwarded_allow_ips: str | None = None, direct_peer: bool = False,
) -> uvicorn.Config:  # fmt: skip
    """uvicorn's settings for `tether serve`. X-Forwarded-* headers are trusted behind a proxy
    (--secure-cookies, or --forwarded-allow-ips given), and only from the proxies named:
    loopback unless --forwarded-allow-ips (or uvicorn's $FORWARDED_ALLOW_IPS) says others.
    `direct_peer` (a trusted login proxy's header): the TCP peer is recorded before uvicorn's
    proxy handling replaces the client, since the header is believed by who sent it."""
    import uvicorn

    proxied = secure or forwarded_allow_ips is not None
    if direct_peer:
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

        from tether.server.trusted import DirectPeer

        if proxied:
            allowed = forwarded_allow_ips or os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
            # uvicorn types its middleware with its own ASGI types; the app is the same.
            server = cast("ASGIApp", ProxyHeadersMiddleware(cast(Any, server),
                                                             trusted_hosts=allowed))  # fmt: skip
        server, proxied = DirectPeer(server), False  # uvicorn must not wrap it again

    # Open SSE streams would hold a graceful stop forever; browsers reconnect by themselves.
    # log_config=None: uvicorn's own handlers would write its records (tracebacks of ASGI
    # errors included) past Tether's formatter, which neutralises control characters and
    # redacts secrets; its loggers propagate to the one install_logging sets up instead.
    return uvicorn.Config(server, host=host, port=port, log_level="info", access_log=False,
                          proxy_headers=proxied,
                          forwarded_allow_ips=forwarded_allow_ips, server_header=False,
                          log_config=None, timeout_graceful_shutdown=5)  # fmt: skip


def checked_public_url(url: str) -> str:
    """--public-url without its trailing slash; UsageError unless it is an http(s) address of
    a host, without a query or a fragment."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise click.BadParameter(
            f"{url!r} is not an http(s) address of a host, like https://tether.example.com",
            param_hint="--public-url",
        )
    return url.strip().rstrip("/")


async def run_server(
    app: App, host: str, port: int, *, worker: bool, secure: bool,
    origins: Sequence[str] = (), idle: timedelta | None = None,
    forwarded_allow_ips: str | None = None, log_format: LogFormat = "text",
    sign_in: SignIn | None = None,
) -> None:  # fmt: skip
    import uvicorn

    from tether.server import create_server

    secret = server_settings(secure, origins)
    sign_in = sign_in or SignIn()
    server = create_server(app, secret=secret, secure_cookies=secure, origins=origins,
                           session_idle=idle or timedelta(minutes=30), oidc=sign_in.oidc,
                           trusted_header=sign_in.trusted)  # fmt: skip
    config = server_config(server, host, port, secure=secure,
                           forwarded_allow_ips=forwarded_allow_ips,
                           direct_peer=sign_in.trusted is not None)  # fmt: skip
    install_logging(format=log_format)  # Tether's records say which run and step
    if worker:
        async with app:
            await uvicorn.Server(config).serve()
    else:
        try:
            await app.open()
            await uvicorn.Server(config).serve()
        finally:
            await app.close()


@click.command()
@click.argument("app_ref", metavar="MODULE:APP")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; 0.0.0.0 exposes the server to the network.")  # fmt: skip
@click.option("--port", "-p", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on.")  # fmt: skip
@click.option("--worker/--no-worker", default=True, show_default=True,
              help="Also run the App's worker in this process.")  # fmt: skip
@click.option(
    "--secure-cookies",
    is_flag=True,
    help="Behind an https proxy: mark cookies Secure and trust X-Forwarded-* headers.",
)
@click.option("--origin", "origins", multiple=True, metavar="URL",
              help="A public origin (https://tether.example.com), repeatable; a request "
              "whose Host is not one is refused. Default: the bound address.")  # fmt: skip
@click.option("--forwarded-allow-ips", metavar="IPS",
              help="Proxies whose X-Forwarded-For/-Proto are believed: comma-separated "
              "addresses or networks (10.0.0.0/8), or * for any. Default: loopback only "
              "($FORWARDED_ALLOW_IPS). Needed behind an ingress on another address.")  # fmt: skip
@click.option("--session-idle", type=click.IntRange(1, 12 * 60), default=30, show_default=True,
              help="Minutes without a request after which an inbox session ends.")  # fmt: skip
@click.option("--oidc-issuer", metavar="URL",
              help="Sign in to the inbox by OpenID Connect with this issuer (https); the "
              f"client secret is read from ${OIDC_SECRET_ENV}. Needs tether[oidc].")  # fmt: skip
@click.option("--oidc-client-id", metavar="ID", help="The client id registered at the issuer.")
@click.option("--oidc-username-claim", default="email", show_default=True, metavar="CLAIM",
              help="The id token claim naming the Tether user (who must exist).")  # fmt: skip
@click.option("--oidc-groups-claim", metavar="CLAIM",
              help="Take the session's groups from this claim instead of the user's own "
              "(trusts the issuer's group admins, admin included).")  # fmt: skip
@click.option("--trusted-user-header", metavar="NAME",
              help="Sign in the existing user a login proxy names in this header "
              "(X-Forwarded-User), from --trusted-proxy addresses only.")  # fmt: skip
@click.option("--trusted-groups-header", metavar="NAME",
              help="A comma-separated groups header of the login proxy, replacing the "
              "user's own groups.")  # fmt: skip
@click.option("--trusted-proxy", "trusted_proxies", multiple=True, metavar="ADDR/NET",
              help="An address or network of the login proxy (repeatable; required with "
              "--trusted-user-header): the TCP peer, never X-Forwarded-For.")  # fmt: skip
@click.option("--public-url", metavar="URL",
              help="The address people reach this server by (https://tether.example.com): "
              "the links notifiers send ($TETHER_PUBLIC_URL for the App) and, without --origin, "
              "the origin requests must name.")  # fmt: skip
@log_format_option
def serve(
    app_ref: str, host: str, port: int, worker: bool, secure_cookies: bool,
    origins: tuple[str, ...], forwarded_allow_ips: str | None, session_idle: int,
    oidc_issuer: str | None, oidc_client_id: str | None, oidc_username_claim: str,
    oidc_groups_claim: str | None, trusted_user_header: str | None,
    trusted_groups_header: str | None, trusted_proxies: tuple[str, ...],
    public_url: str | None, log_format: LogFormat,
) -> None:  # fmt: skip
    """Serve the JSON API (/api, OpenAPI at /openapi.json), the inbox (/) and /metrics of the
    App at MODULE:APP. Users and their tokens: `tether users add NAME`. Set
    TETHER_SESSION_SECRET (32 bytes or more: `python -c "import secrets;
    print(secrets.token_urlsafe(32))"`) so that a restart keeps inbox sessions' cookies."""
    if public_url is not None:
        public_url = checked_public_url(public_url)
        os.environ["TETHER_PUBLIC_URL"] = public_url  # before the App (and its notifiers) load
        origins = origins or (public_url,)
    server_settings(secure_cookies, origins)  # refuse a bad setting before loading the App
    sign_in = sign_in_settings(
        issuer=oidc_issuer, client_id=oidc_client_id, username_claim=oidc_username_claim,
        groups_claim=oidc_groups_claim, user_header=trusted_user_header,
        groups_header=trusted_groups_header, proxies=trusted_proxies,
    )  # fmt: skip
    app = load_app(app_ref)
    click.echo(f"tether serve: http://{host}:{port}/ on {app.url}", err=True)
    asyncio.run(run_server(app, host, port, worker=worker, secure=secure_cookies,
                           origins=origins, idle=timedelta(minutes=session_idle),
                           forwarded_allow_ips=forwarded_allow_ips,
                           log_format=log_format, sign_in=sign_in))  # fmt: skip

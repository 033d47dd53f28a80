"""`tether serve`: the HTTP API, the reviewers' inbox and /metrics of an App, with uvicorn; by
default also the App's worker, so one process is a whole deployment.

It binds 127.0.0.1 unless told otherwise. Parsing and starting only: the server is
tether.server's, the worker the App's.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import click

from tether.app import App
from tether.cli.common import load_app, log_format_option
from tether.errors import ConfigurationError
from tether.telemetry.logs import LogFormat, install_logging

if TYPE_CHECKING:  # uvicorn is the [server] extra's, imported when serving
    import uvicorn
    from starlette.types import ASGIApp


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
    forwarded_allow_ips: str | None = None,
) -> uvicorn.Config:  # fmt: skip
    """uvicorn's settings for `tether serve`. X-Forwarded-* headers are trusted behind a proxy
    (--secure-cookies, or --forwarded-allow-ips given), and only from the proxies named:
    loopback unless --forwarded-allow-ips (or uvicorn's $FORWARDED_ALLOW_IPS) says others."""
    import uvicorn

    # Open SSE streams would hold a graceful stop forever; browsers reconnect by themselves.
    # log_config=None: uvicorn's own handlers would write its records (tracebacks of ASGI
    # errors included) past Tether's formatter, which neutralises control characters and
    # redacts secrets; its loggers propagate to the one install_logging sets up instead.
    return uvicorn.Config(server, host=host, port=port, log_level="info", access_log=False,
                          proxy_headers=secure or forwarded_allow_ips is not None,
                          forwarded_allow_ips=forwarded_allow_ips, server_header=False,
                          log_config=None, timeout_graceful_shutdown=5)  # fmt: skip


async def run_server(
    app: App, host: str, port: int, *, worker: bool, secure: bool,
    origins: Sequence[str] = (), idle: timedelta | None = None,
    forwarded_allow_ips: str | None = None, log_format: LogFormat = "text",
) -> None:  # fmt: skip
    import uvicorn

    from tether.server import create_server

    secret = server_settings(secure, origins)
    server = create_server(app, secret=secret, secure_cookies=secure, origins=origins,
                           session_idle=idle or timedelta(minutes=30))  # fmt: skip
    config = server_config(server, host, port, secure=secure,
                           forwarded_allow_ips=forwarded_allow_ips)  # fmt: skip
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
@log_format_option
def serve(
    app_ref: str, host: str, port: int, worker: bool, secure_cookies: bool,
    origins: tuple[str, ...], forwarded_allow_ips: str | None, session_idle: int,
    log_format: LogFormat,
) -> None:  # fmt: skip
    """Serve the JSON API (/api, OpenAPI at /openapi.json), the inbox (/) and /metrics of the
    App at MODULE:APP. Users and their tokens: `tether users add NAME`. Set
    TETHER_SESSION_SECRET (32 bytes or more: `python -c "import secrets;
    print(secrets.token_urlsafe(32))"`) so that a restart keeps inbox sessions' cookies."""
    server_settings(secure_cookies, origins)  # refuse a bad setting before loading the App
    app = load_app(app_ref)
    click.echo(f"tether serve: http://{host}:{port}/ on {app.url}", err=True)
    asyncio.run(run_server(app, host, port, worker=worker, secure=secure_cookies,
                           origins=origins, idle=timedelta(minutes=session_idle),
                           forwarded_allow_ips=forwarded_allow_ips,
                           log_format=log_format))  # fmt: skip

"""`tether serve`: the HTTP API, the reviewers' inbox and /metrics of an App, with uvicorn; by
default also the App's worker, so one process is a whole deployment.

It binds 127.0.0.1 unless told otherwise. Parsing and starting only: the server is
tether.server's, the worker the App's.
"""

from __future__ import annotations

import asyncio
import os

import click

from tether.app import App
from tether.cli.common import load_app
from tether.errors import ConfigurationError
from tether.telemetry.logs import install_logging


async def run_server(app: App, host: str, port: int, *, worker: bool, secure: bool) -> None:
    import uvicorn

    from tether.server import create_server

    secret_hex = os.environ.get("TETHER_SESSION_SECRET")
    try:
        secret = bytes.fromhex(secret_hex) if secret_hex else None
    except ValueError:
        raise ConfigurationError("TETHER_SESSION_SECRET must be hex (e.g. 64 hex digits)") from None
    server = create_server(app, secret=secret, secure_cookies=secure)
    # Open SSE streams would hold a graceful stop forever; browsers reconnect by themselves.
    config = uvicorn.Config(server, host=host, port=port, log_level="info", access_log=False,
                            proxy_headers=secure, server_header=False,
                            timeout_graceful_shutdown=5)  # fmt: skip
    install_logging()  # after uvicorn's logging setup: Tether's records say [run=... step=...]
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
def serve(app_ref: str, host: str, port: int, worker: bool, secure_cookies: bool) -> None:
    """Serve the JSON API (/api, OpenAPI at /openapi.json), the inbox (/) and /metrics of the
    App at MODULE:APP. Users and their tokens: `tether users add NAME`. Set
    TETHER_SESSION_SECRET (hex) to keep inbox sessions across restarts."""
    app = load_app(app_ref)
    click.echo(f"tether serve: http://{host}:{port}/ on {app.url}", err=True)
    asyncio.run(run_server(app, host, port, worker=worker, secure=secure_cookies))

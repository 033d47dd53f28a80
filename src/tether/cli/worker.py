"""`tether worker`: run the worker of an App until SIGINT or SIGTERM, then drain (steps in
flight finish, up to --drain-timeout; a second signal stops at once) and release the runs
left for the next worker to resume.

Starts and stops the App's own worker; it must not claim or execute runs itself, nor print a
database password.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal

import click

from tether.app import App
from tether.cli.common import load_app
from tether.core.worker import Worker
from tether.redact import redact_text  # a PostgreSQL URL may hold its password
from tether.telemetry.logs import install_logging
from tether.text import visible

log = logging.getLogger("tether.worker")


async def serve(
    app: App, concurrency: int | None, queues: tuple[str, ...] = (),
    health: tuple[str, int] | None = None,
) -> None:  # fmt: skip
    if concurrency is not None:
        app.engine.settings = dataclasses.replace(app.engine.settings, concurrency=concurrency)
    if queues:
        app.engine.settings = dataclasses.replace(app.engine.settings, queues=queues)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    draining: list[Worker] = []

    def signalled() -> None:
        # The first signal drains (settings.drain_timeout: in-flight steps finish, runs are
        # given back); a second one ends the drain and stops at once.
        if not stop.is_set():
            if app.engine.worker is not None:
                draining.append(app.engine.worker)
            stop.set()
            return
        log.warning("a second signal: stopping now, without waiting for steps in flight")
        for running in draining:
            running.hurry()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signalled)
    worker_id = "?"
    try:
        # The probes outlive the App's worker: /healthz still answers while it drains.
        async with contextlib.AsyncExitStack() as probes, app:
            worker_id = str(app.worker_id)
            served = app.engine.worker.served() if app.engine.worker else []
            names = ", ".join(sorted(served)) or "(none)"
            where = f", queues {', '.join(queues)}" if queues else ""
            line = (
                f"tether worker {worker_id} started on {redact_text(app.url)} "
                f"(concurrency {app.engine.settings.concurrency}{where}); workflows: {names}"
            )
            click.echo(visible(line, newlines=False))
            if health is not None:
                from tether.server.health import probe_server

                await probes.enter_async_context(probe_server(app, *health))
                click.echo(f"tether worker {worker_id}: /healthz and /readyz on "
                           f"http://{health[0]}:{health[1]}/")  # fmt: skip
            await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    click.echo(f"tether worker {worker_id} stopped")


@click.command()
@click.argument("app_ref", metavar="MODULE:APP")
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(min=1),
    help="Runs executed at once (overrides the App's setting).",
)
@click.option(
    "--queue",
    "-q",
    "queues",
    multiple=True,
    help="Serve only the workflows of this queue (repeat for several); default: all.",
)
@click.option(
    "--health-port",
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="Serve GET /healthz and /readyz on this port (probes of an orchestrator).",
)
@click.option(
    "--health-host",
    default="127.0.0.1",
    show_default=True,
    help="Address the health port binds; 0.0.0.0 for probes from outside the host.",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="On SIGTERM/SIGINT: claim nothing more and let the steps in flight finish for up to "
    "this long, giving each run back as it gets there; then stop the rest. A second signal "
    "stops at once; 0 stops at once.",
)
def worker(
    app_ref: str, concurrency: int | None, queues: tuple[str, ...], health_port: int | None,
    health_host: str, drain_timeout: float,
) -> None:  # fmt: skip
    """Run the worker of the App at MODULE:APP until SIGINT or SIGTERM.

    The current directory is put on sys.path first, so `tether worker myapp:app` finds
    ./myapp.py. In-flight runs are released on stop, for the next worker to resume.
    """
    app = load_app(app_ref)
    install_logging()  # records of runs and steps say which: [run=... step=...]
    health = None
    if health_port is not None:
        try:
            import uvicorn  # noqa: F401  (the probes are served by the [server] extra)
        except ImportError:
            raise click.UsageError(
                "--health-port needs the server extra: pip install 'tether[server]'"
            ) from None
        health = (health_host, health_port)
    app.engine.settings = dataclasses.replace(app.engine.settings, drain_timeout=drain_timeout)
    asyncio.run(serve(app, concurrency, queues, health))

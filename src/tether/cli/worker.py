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
from tether.cli.common import load_app, log_format_option
from tether.core.worker import Worker
from tether.redact import redact_text  # a PostgreSQL URL may hold its password
from tether.telemetry.logs import LogFormat, install_logging
from tether.text import visible

log = logging.getLogger("tether.worker")


Address = tuple[str, int]  # (host, port)


async def serve(
    app: App, concurrency: int | None, queues: tuple[str, ...] = (),
    health: Address | None = None, metrics: Address | None = None,
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
    if metrics is not None:
        from tether.telemetry.metrics import metrics_of

        metrics_of(app.engine)  # counting starts before the first claim
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
            shared = health is not None and health == metrics  # one port serves both
            if health is not None and not shared:
                from tether.server.health import probe_server

                await probes.enter_async_context(probe_server(app, *health))
                click.echo(f"tether worker {worker_id}: /healthz and /readyz on "
                           f"http://{health[0]}:{health[1]}/")  # fmt: skip
            if metrics is not None:
                from tether.server.metrics import metrics_server

                await probes.enter_async_context(metrics_server(app, *metrics, probes=shared))
                routes = "/metrics, /healthz and /readyz" if shared else "/metrics"
                click.echo(f"tether worker {worker_id}: {routes} on "
                           f"http://{metrics[0]}:{metrics[1]}/")  # fmt: skip
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
    "--metrics-port",
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="Serve GET /metrics (Prometheus) on this port, for a token of group admin or metrics; "
    "it may be the health port.",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address the metrics port binds; 0.0.0.0 for a scraper outside the host.",
)
@log_format_option
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
    health_host: str, metrics_port: int | None, metrics_host: str, log_format: LogFormat,
    drain_timeout: float,
) -> None:  # fmt: skip
    """Run the worker of the App at MODULE:APP until SIGINT or SIGTERM.

    The current directory is put on sys.path first, so `tether worker myapp:app` finds
    ./myapp.py. In-flight runs are released on stop, for the next worker to resume.
    """
    app = load_app(app_ref)
    install_logging(format=log_format)  # records of runs and steps say which run and step
    health = None if health_port is None else (health_host, health_port)
    metrics = None if metrics_port is None else (metrics_host, metrics_port)
    for given, option in ((health, "--health-port"), (metrics, "--metrics-port")):
        if given is not None:
            try:  # served by the [server] extra's uvicorn and FastAPI
                import fastapi  # noqa: F401
                import prometheus_client  # noqa: F401
                import uvicorn  # noqa: F401
            except ImportError:
                raise click.UsageError(
                    f"{option} needs the server extra: pip install 'tether[server]'"
                ) from None
    app.engine.settings = dataclasses.replace(app.engine.settings, drain_timeout=drain_timeout)
    asyncio.run(serve(app, concurrency, queues, health, metrics))

"""`tether worker`: run the worker of an App until SIGINT or SIGTERM, releasing in-flight runs
on stop for the next worker to resume.

Starts and stops the App's own worker; it must not claim or execute runs itself, nor print a
database password.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal

import click

from tether.app import App
from tether.cli.common import load_app
from tether.redact import redact_text  # a PostgreSQL URL may hold its password
from tether.telemetry.logs import install_logging
from tether.text import visible


async def serve(app: App, concurrency: int | None, queues: tuple[str, ...] = ()) -> None:
    if concurrency is not None:
        app.engine.settings = dataclasses.replace(app.engine.settings, concurrency=concurrency)
    if queues:
        app.engine.settings = dataclasses.replace(app.engine.settings, queues=queues)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    worker_id = "?"
    try:
        async with app:
            worker_id = str(app.worker_id)
            served = app.engine.worker.served() if app.engine.worker else []
            names = ", ".join(sorted(served)) or "(none)"
            where = f", queues {', '.join(queues)}" if queues else ""
            line = (
                f"tether worker {worker_id} started on {redact_text(app.url)} "
                f"(concurrency {app.engine.settings.concurrency}{where}); workflows: {names}"
            )
            click.echo(visible(line, newlines=False))
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
def worker(app_ref: str, concurrency: int | None, queues: tuple[str, ...]) -> None:
    """Run the worker of the App at MODULE:APP until SIGINT or SIGTERM.

    The current directory is put on sys.path first, so `tether worker myapp:app` finds
    ./myapp.py. In-flight runs are released on stop, for the next worker to resume.
    """
    app = load_app(app_ref)
    install_logging()  # records of runs and steps say which: [run=... step=...]
    asyncio.run(serve(app, concurrency, queues))

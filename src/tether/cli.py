"""The `tether` command line: inspect and cancel runs, send events, check that stored histories
still replay, and run a worker for an App.

A thin shell over the library: it parses arguments, calls App and RunHandle, and renders what
they return with rich (or as JSON). It must not hold engine logic, talk SQL or import a backend;
anything it needs beyond parsing and printing belongs in the library.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.pretty import Pretty
from rich.table import Table
from rich.text import Text

from tether.app import App
from tether.core.handle import RunInfo
from tether.core.replay import ReplayOutcome
from tether.errors import ConfigurationError, TetherError
from tether.store import database_exists, default_url
from tether.store.base import Checkpoint, RunStatus

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
APP_FORM = "module:attribute, e.g. `myproject.main:app`"
STATUS_STYLE = {  # runs' and checkpoints' statuses
    "pending": "yellow", "running": "blue", "waiting": "cyan", "succeeded": "green",
    "failed": "red", "cancelled": "magenta", "started": "yellow", "retrying": "cyan",
    "completed": "green",
}  # fmt: skip


class CliError(click.ClickException):
    """A TetherError shown as one red `error: ...` line on stderr (exit code 1)."""

    def show(self, file: Any = None) -> None:
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"error: {self.message}", style="red", markup=False
        )


class TetherGroup(click.Group):
    """The root group: turns library errors into CliError, so users see no traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TetherError as exc:
            raise CliError(str(exc)) from exc


def load_app(ref: str) -> App:
    """The App named by `module:attribute`, imported with the current directory on sys.path."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise ConfigurationError(f"cannot load {ref!r}: expected {APP_FORM}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name + ".").startswith(exc.name + "."):
            raise  # the module exists but one of its own imports failed: show that
        raise ConfigurationError(
            f"cannot load {ref!r}: no module named {exc.name!r} (looked in {os.getcwd()} and "
            f"sys.path); expected {APP_FORM}"
        ) from None
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigurationError(
                f"cannot load {ref!r}: module {module_name!r} has no attribute {attr!r}; "
                f"expected {APP_FORM}"
            )
        obj = getattr(obj, part)
    if not isinstance(obj, App):
        raise ConfigurationError(
            f"cannot load {ref!r}: it is {type(obj).__name__}, not a tether.App; "
            f"expected {APP_FORM}"
        )
    return obj


def require_database(url: str, hint: str) -> None:
    """Refuse a database that does not exist yet: opening it would create an empty one."""
    if not database_exists(url):
        raise ConfigurationError(f"no database at {url!r}; {hint}")


def run_with_app(ctx: click.Context, work: Callable[[App], Awaitable[T]]) -> T:
    """Open the App chosen on the `runs` or `events` group, run `work` with it, and close it."""
    app_ref: str | None = ctx.obj["app"]
    if not app_ref:
        require_database(
            ctx.obj["database"],
            "pass --database URL (or set TETHER_DATABASE_URL), or --app module:app",
        )
    return run_app(load_app(app_ref) if app_ref else App(ctx.obj["database"]), work)


def run_app(app: App, work: Callable[[App], Awaitable[T]]) -> T:
    """Run `work` with `app` on a new event loop, and close the App afterwards."""

    async def main() -> T:
        try:
            return await work(app)
        finally:
            await app.close()

    return asyncio.run(main())


# -- rendering ------------------------------------------------------------------------------


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def short_time(moment: datetime | None) -> str:
    return "" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def new_table(*columns: str, title: str | None = None) -> Table:
    """A borderless table; numbers align right, ids and statuses never wrap (times may)."""
    table = Table(box=None, header_style="bold", title=title, title_justify="left")
    for name in columns:
        number = name in ("#", "attempt", "attempts", "ms", "position")
        keep = name in ("id", "run id", "name", "status")
        table.add_column(name, justify="right" if number else "left", overflow="fold",
                         min_width=len(name), no_wrap=keep)  # fmt: skip
    return table


def first_line(error: dict[str, Any] | None) -> str:
    if not error:
        return ""
    message = str(error.get("message", "")).strip().splitlines()
    return f"{error.get('type', 'Error')}: {message[0] if message else ''}"


def run_json(info: RunInfo) -> dict[str, Any]:
    error = info.error or {}
    return {
        "id": info.id, "workflow": info.workflow, "status": str(info.status),
        "attempt": info.attempt, "owner": info.owner, "created_at": iso(info.created_at),
        "updated_at": iso(info.updated_at), "finished_at": iso(info.finished_at),
        "error_type": error.get("type"), "error_message": error.get("message"),
    }  # fmt: skip


def divergence_json(outcome: ReplayOutcome) -> dict[str, Any]:
    position, recorded, requested = outcome.first_difference or (None, None, None)
    return {
        "run_id": outcome.run_id, "workflow": outcome.workflow, "position": position,
        "recorded": recorded, "requested": requested, "message": str(outcome.error),
    }  # fmt: skip


def checkpoint_json(cp: Checkpoint) -> dict[str, Any]:
    duration = None
    if cp.started_at is not None and cp.finished_at is not None:
        duration = round((cp.finished_at - cp.started_at) * 1000, 3)
    return {
        "seq": cp.seq, "name": cp.name, "kind": cp.kind, "status": str(cp.status),
        "attempts": cp.attempts, "duration_ms": duration,
        "result": None if cp.result is None else json.loads(cp.result),
        "error": None if cp.error is None else json.loads(cp.error),
    }  # fmt: skip


# -- commands -------------------------------------------------------------------------------


@click.group(cls=TetherGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tether", message="tether %(version)s")
def cli() -> None:
    """Tether: durable execution of workflows. Inspect, cancel and signal runs, check that
    stored histories replay under the current code, and run workers."""


def database_options(group: F) -> F:
    """The options choosing the database of a group's commands: --database URL or --app."""
    group = click.option(
        "--app",
        "app_ref",
        metavar="MODULE:APP",
        help="Use this App's database and workflows (values decode with their type "
        "hints); overrides --database.",
    )(group)
    return click.option(
        "--database",
        "-d",
        metavar="URL",
        envvar="TETHER_DATABASE_URL",
        default=default_url,
        show_default="$TETHER_DATABASE_URL or sqlite:///tether.db",
        help="Database URL of the runs, e.g. sqlite:///path/to/tether.db.",
    )(group)


@cli.group()
@database_options
@click.pass_context
def runs(ctx: click.Context, database: str, app_ref: str | None) -> None:
    """List, inspect and cancel runs."""
    ctx.obj = {"database": database, "app": app_ref}


@runs.command("list")
@click.option(
    "--status",
    "-s",
    type=click.Choice([s.value for s in RunStatus]),
    help="Only runs in this status.",
)
@click.option("--workflow", "-w", metavar="NAME", help="Only runs of this workflow.")
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="At most this many runs, newest first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")
@click.pass_context
def runs_list(
    ctx: click.Context, status: str | None, workflow: str | None, limit: int, as_json: bool
) -> None:
    """List runs, newest first (times in UTC)."""
    infos = run_with_app(
        ctx, lambda app: app.list_runs(status=status, workflow=workflow, limit=limit)
    )
    if as_json:
        click.echo(json.dumps([run_json(i) for i in infos], indent=2))
        return
    if not infos:
        Console().print("no runs", style="dim")
        return
    table = new_table("id", "workflow", "status", "attempt", "created", "updated", "error")
    for i in infos:
        times = short_time(i.created_at), short_time(i.finished_at or i.updated_at)
        error_type = (i.error or {}).get("type", "")
        table.add_row(i.id, i.workflow, status_text(i.status), str(i.attempt), *times, error_type)
    Console().print(table)


@runs.command("show")
@click.argument("run_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of tables.")
@click.pass_context
def runs_show(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Show one run: its fields, its steps, and its result or error."""

    async def work(app: App) -> tuple[RunInfo, list[Checkpoint], object, object]:
        handle = await app.get(run_id)
        info = await handle.info()
        result = await handle.result() if info.status is RunStatus.SUCCEEDED else None
        # For --json: the decoded result in its stored JSON form.
        encoded = json.loads(app.engine.serde.dumps(result, what="result"))
        return info, await handle.checkpoints(), result, encoded

    info, checkpoints, result, encoded = run_with_app(ctx, work)
    if as_json:
        steps_json = [checkpoint_json(c) for c in checkpoints]
        doc = {**run_json(info), "result": encoded, "error": info.error, "checkpoints": steps_json}
        click.echo(json.dumps(doc, indent=2))
        return
    console = Console(highlight=False)
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold")
    fields.add_column(overflow="fold")
    rows: list[tuple[str, str | Text]] = [
        ("id", info.id), ("workflow", info.workflow), ("status", status_text(info.status)),
        ("attempt", str(info.attempt)), ("owner", info.owner or ""),
        ("created", short_time(info.created_at)), ("updated", short_time(info.updated_at)),
        ("finished", short_time(info.finished_at)),
    ]  # fmt: skip
    for name, value in rows:
        fields.add_row(name, value)
    console.print(fields)
    steps = new_table("#", "name", "kind", "status", "attempts", "ms", "error", title="steps")
    for cp in checkpoints:
        row = checkpoint_json(cp)
        ms = "" if row["duration_ms"] is None else f"{row['duration_ms']:.1f}"
        steps.add_row(str(cp.seq), cp.name, cp.kind, status_text(cp.status), str(cp.attempts),
                      ms, first_line(row["error"]))  # fmt: skip
    console.print(steps if checkpoints else Text("no steps recorded", style="dim"))
    if info.status is RunStatus.SUCCEEDED:
        console.print(Text("result", style="bold"), Pretty(result))
    elif info.error:
        console.print(Text("error ", style="bold red") + Text(first_line(info.error)))
        if info.error.get("traceback"):
            console.print(Text(str(info.error["traceback"]).rstrip(), style="dim"))


@runs.command("cancel")
@click.argument("run_id", metavar="ID")
@click.pass_context
def runs_cancel(ctx: click.Context, run_id: str) -> None:
    """Cancel a run and print its status afterwards.

    A pending or waiting run ends at once (`cancelled`); a run that a worker holds ends at its
    next await (`running (cancel requested)`). Cancelling a finished run changes nothing.
    """

    async def work(app: App) -> tuple[RunStatus, RunStatus]:
        handle = await app.get(run_id)
        before = await handle.status()
        await handle.cancel()
        return before, await handle.status()

    before, after = run_with_app(ctx, work)
    line = Text(f"run {run_id!r}: ") + status_text(after)
    if before.terminal:
        line += Text(" (it had already finished; nothing changed)", style="dim")
    elif not after.terminal:
        line += Text(" (cancel requested)")
    Console(highlight=False).print(line)


@cli.group()
@database_options
@click.pass_context
def events(ctx: click.Context, database: str, app_ref: str | None) -> None:
    """Send events to runs (taken by `tether.wait_for_event`)."""
    ctx.obj = {"database": database, "app": app_ref}


@events.command("send")
@click.argument("run_id")
@click.argument("key")
@click.argument("payload", default="null")
@click.pass_context
def events_send(ctx: click.Context, run_id: str, key: str, payload: str) -> None:
    """Send the event KEY to the run RUN_ID, with PAYLOAD as JSON text (default: null).

    Quote the payload for your shell, e.g. `tether events send r1 approved '{"by": "ada"}'`.
    An event sent before the run waits for it is kept for it.
    """
    try:
        value = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise CliError(
            f"PAYLOAD must be JSON text ({exc.msg} at character {exc.pos} of {payload!r}); "
            f"quote it whole for the shell, e.g. '{{\"x\": 1}}', '\"some text\"', 42 or null"
        ) from None
    run_with_app(ctx, lambda app: app.send(run_id, key, value))
    click.echo(f"sent event {key!r} to run {run_id!r}")


@cli.command("replay-check")
@click.argument("app_ref", metavar="MODULE:APP")
@click.option("--workflow", "-w", metavar="NAME", help="Only runs of this workflow.")
@click.option(
    "--status",
    "-s",
    type=click.Choice([s.value for s in RunStatus]),
    help="Only runs in this status.",
)
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="At most this many runs, newest first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of a table.")
@click.pass_context
def replay_check(
    ctx: click.Context,
    app_ref: str,
    workflow: str | None,
    status: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Check that stored runs still replay under the current code.

    Replays the histories in the database of the App at MODULE:APP against the workflows it
    registers now; nothing is executed or written. Lists the runs whose history the code no
    longer replays, with where they first differ; exits 1 if any do (gate deploys on it).
    """
    app = load_app(app_ref)
    require_database(app.url, f"{app_ref} has no stored runs to check")
    outcomes = run_app(app, lambda a: a.replay_check(workflow=workflow, status=status, limit=limit))
    diverging = [o for o in outcomes if not o.ok]
    if as_json:
        doc = {"checked": len(outcomes), "diverging": [divergence_json(o) for o in diverging]}
        click.echo(json.dumps(doc, indent=2))
    else:
        console = Console(highlight=False)
        if diverging:
            table = new_table("run id", "workflow", "position", "recorded", "requested")
            notes = []
            for o in diverging:
                row = divergence_json(o)
                if row["recorded"] is None and row["requested"] is None:
                    notes.append(row["message"])  # no step to name: say why instead
                names = [Text(row[k] or "-", style="" if row[k] else "dim")
                         for k in ("recorded", "requested")]  # fmt: skip
                table.add_row(o.run_id, o.workflow, str(row["position"]), *names)
            console.print(table)
            for note in notes:
                console.print(Text(note, style="dim"))
        summary = f"{len(outcomes)} runs checked, {len(diverging)} diverge"
        console.print(summary, style="red" if diverging else "green")
    if diverging:
        ctx.exit(1)


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
            click.echo(
                f"tether worker {worker_id} started on {app.url} "
                f"(concurrency {app.engine.settings.concurrency}{where}); workflows: {names}"
            )
            await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    click.echo(f"tether worker {worker_id} stopped")


@cli.command()
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
    asyncio.run(serve(load_app(app_ref), concurrency, queues))


def main() -> None:
    """The console script `tether`."""
    cli(prog_name="tether")

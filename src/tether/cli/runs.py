"""`tether runs start | list | show | cancel | resume | fork`: start a run by workflow name, look
at runs, their steps, values and fork links, cancel them, resume failed or dead ones, and fork
one from a step.

Parses arguments, calls App and RunHandle, and renders what they return as tables or JSON. It
must not hold engine logic or talk SQL: what it needs beyond printing belongs in the library.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import click
from rich.pretty import Pretty
from rich.text import Text

from tether.actions import Actor, about_fork, recorded
from tether.app import App
from tether.cli.common import (
    chosen,
    console,
    database_options,
    fields_grid,
    new_table,
    run_with_app,
    short_time,
    shown,
    status_text,
)
from tether.core.handle import ForkInfo, RunInfo
from tether.core.observe import given_trace, valid_trace
from tether.core.workflow import Named
from tether.errors import RunCancelled, RunFailed
from tether.redact import redact
from tether.store.port import Checkpoint, RunStatus
from tether.values import ValueInfo
from tether.views import checkpoint_json, fork_json, held_reason, run_json, value_json


def dead_reason(info: RunInfo) -> str:
    """Why a dead run is dead, and what to do about it, in one line."""
    if info.failures:
        why = f"after {info.failures} executions in a row failed outside the workflow's code"
    else:
        why = "since no live worker serves its workflow"
    return f"{why}; fix the cause, then `tether runs resume {info.id}`"


def first_line(error: dict[str, Any] | None) -> str:
    if not error:
        return ""
    message = str(error.get("message", "")).strip().splitlines()
    return f"{error.get('type', 'Error')}: {message[0] if message else ''}"


@click.group()
@database_options
@click.pass_context
def runs(ctx: click.Context, database: str, app_ref: str | None) -> None:
    """List, inspect, cancel, resume and fork runs."""
    ctx.obj = chosen(ctx, database, app_ref)


def parse_input(text: str | None) -> tuple[list[Any], dict[str, Any]]:
    """--input as (args, kwargs): a JSON array is the positional arguments, an object the
    keyword arguments."""
    if text is None:
        return [], {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON ({exc})", param_hint="--input") from None
    if isinstance(value, list):
        return value, {}
    if isinstance(value, dict):
        return [], value
    raise click.BadParameter(
        "give a JSON array (positional arguments) or object (keyword arguments), "
        f"not {type(value).__name__}", param_hint="--input",
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Started:
    info: RunInfo
    result: object  # the result's JSON form (when waited for and it succeeded)
    ended: RunFailed | RunCancelled | None


@runs.command("start")
@click.argument("workflow", metavar="NAME")
@click.option("--input", "input_text", metavar="JSON", help="The arguments: a JSON array "
              "(positional) or object (keyword); none if not given.")  # fmt: skip
@click.option("--id", "run_id", metavar="ID", help="The run's id (its idempotency key: the "
              "same id and arguments are the same run); a new one if not given.")  # fmt: skip
@click.option("--queue", metavar="NAME", help="The workflow's queue, when --app is not given "
              "(the workflow's own otherwise).")  # fmt: skip
@click.option("--wait", is_flag=True, help="Wait for the run to end and print its result "
              "(exit code 1 unless it succeeded).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the run as a JSON object.")
@click.pass_context
def runs_start(
    ctx: click.Context, workflow: str, input_text: str | None, run_id: str | None,
    queue: str | None, wait: bool, as_json: bool,
) -> None:  # fmt: skip
    """Start a run of the workflow NAME; a worker that has its code executes it.

    Without --app nothing here needs the code: the arguments are stored as given, and a worker
    whose workflow cannot take them makes the run dead at once, saying why. With --app they
    are checked against the workflow's signature and type hints first. TRACEPARENT (and
    TRACESTATE) in the environment make the run's spans children of that W3C trace context.
    """
    args, kwargs = parse_input(input_text)
    if kwargs.keys() & {"id", "priority", "dedup_key", "started_by"}:
        raise click.BadParameter(
            "id, priority, dedup_key and started_by are start options, not arguments a "
            "workflow takes here", param_hint="--input",
        )  # fmt: skip

    async def work(app: App) -> Started:
        target = Named(workflow, queue=queue) if queue else workflow
        # The carrier of a script's trace, by the OpenTelemetry convention for environments.
        given_trace.set(valid_trace({"traceparent": os.environ.get("TRACEPARENT", ""),
                                     "tracestate": os.environ.get("TRACESTATE", "")}))  # fmt: skip
        handle = await app.start(target, *args, id=run_id, **kwargs)
        if not wait:
            return Started(await handle.info(), None, None)
        try:
            result = await handle.result()
        except (RunFailed, RunCancelled) as ended:
            return Started(await handle.info(), None, ended)
        encoded = json.loads(app.engine.serde.dumps(result, what="result"))
        return Started(await handle.info(), encoded, None)

    started = run_with_app(ctx, work)
    info, result = started.info, redact(started.result)
    if as_json:
        doc = {**run_json(info), **({"result": result} if wait else {})}
        click.echo(json.dumps(doc, indent=2))
    elif not wait:
        console().print(shown(f"run {info.id!r} of {info.workflow}: ") + status_text(info.status)
                        + Text(" (a worker executes it)"))  # fmt: skip
    else:
        console().print(shown(f"run {info.id!r} of {info.workflow}: ")
                        + status_text(info.status))  # fmt: skip
        if started.ended is None:
            console().print(Text("result", style="bold"), Pretty(result))
        elif isinstance(error := redact(info.error), dict):
            console().print(Text("error ", style="bold red") + shown(first_line(error)))
    if started.ended is not None:
        ctx.exit(1)


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
        console().print("no runs", style="dim")
        return
    table = new_table("id", "workflow", "status", "attempt", "created", "updated", "error")
    for i in infos:
        times = short_time(i.created_at), short_time(i.finished_at or i.updated_at)
        error_type = (i.error or {}).get("type", "")
        table.add_row(shown(i.id), shown(i.workflow), status_text(i.status), str(i.attempt),
                      *times, shown(error_type))  # fmt: skip
    console().print(table)


@runs.command("show")
@click.argument("run_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of tables.")
@click.pass_context
def runs_show(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Show one run: its fields, its steps, the values it published, the run it was forked
    from and the runs forked from it, and its result or error."""

    async def work(app: App) -> tuple[RunInfo, list[Checkpoint], object, object, Links]:
        handle = await app.get(run_id)
        info = await handle.info()
        result = await handle.result() if info.status is RunStatus.SUCCEEDED else None
        # For --json: the decoded result in its stored JSON form.
        encoded = json.loads(app.engine.serde.dumps(result, what="result"))
        values = [(v, json.loads(app.engine.serde.dumps(v.value, what="value")))
                  for v in await app.list_values(run_id)]  # fmt: skip
        links = Links(values, await handle.forks())
        return info, await handle.checkpoints(), result, encoded, links

    info, checkpoints, result, encoded, links = run_with_app(ctx, work)
    # What a person reads passes the redactor, like the inbox and the API.
    shown_result, shown_error = redact(encoded), redact(info.error)
    values = [(v, redact(plain)) for v, plain in links.values]
    if as_json:
        steps_json = [checkpoint_json(c) for c in checkpoints]
        doc = {**run_json(info), "result": shown_result, "error": shown_error,
               "checkpoints": steps_json, "forks": [fork_json(f) for f in links.forks],
               "values": {v.key: value_json(v, plain) for v, plain in links.values}}  # fmt: skip
        click.echo(json.dumps(doc, indent=2))
        return
    out = console()
    rows: list[tuple[str, str | Text]] = [
        ("id", shown(info.id)), ("workflow", shown(info.workflow)),
        ("status", status_text(info.status)),
        ("attempt", str(info.attempt)), ("failures", str(info.failures)),
        ("owner", shown(info.owner or "")),
        ("created", short_time(info.created_at)), ("updated", short_time(info.updated_at)),
        ("finished", short_time(info.finished_at)),
    ]  # fmt: skip
    if info.fork is not None:
        fork = info.fork
        rows.append(("forked from", shown(f"{fork.source_run_id} at step {fork.from_step}")))
    if links.forks:
        rows.append(("forks", shown(", ".join(f"{f.run_id} (from step {f.from_step})"
                                              for f in links.forks))))  # fmt: skip
    out.print(fields_grid(rows))
    steps = new_table("position", "name", "kind", "status", "attempts", "ms", "error",
                      title="steps")  # fmt: skip
    for cp in checkpoints:
        row = checkpoint_json(cp)
        ms = "" if row["duration_ms"] is None else f"{row['duration_ms']:.1f}"
        steps.add_row(str(cp.at), shown(cp.name), shown(cp.kind), status_text(cp.status),
                      str(cp.attempts), ms, shown(first_line(row["error"])))  # fmt: skip
    out.print(steps if checkpoints else Text("no steps recorded", style="dim"))
    if values:
        table = new_table("key", "version", "set", "value", title="values")
        for v, plain in values:
            table.add_row(shown(v.key), str(v.version), short_time(v.set_at),
                          shown(json.dumps(plain)[:200]))  # fmt: skip
        out.print(table)
    if info.status is RunStatus.SUCCEEDED:
        # The decoded value (its type shows) unless the redactor had something to hide.
        out.print(Text("result", style="bold"),
                  Pretty(result if shown_result == encoded else shown_result))  # fmt: skip
        return
    if info.status is RunStatus.DEAD:
        out.print(Text("dead-lettered ", style="bold red") + shown(dead_reason(info)))
    elif info.status is RunStatus.HELD:
        out.print(Text("held ", style="bold yellow") + Text(held_reason(info.id)))
        if isinstance(shown_error, dict):  # the whole divergence: both sequences, the diff
            out.print(shown(shown_error.get("message", ""), lines=True))
        return
    elif info.failures and info.error:  # not dead yet: the last failed execution
        out.print(Text(f"failed executions in a row: {info.failures} ", style="bold yellow")
                  + Text("(tried again after a backoff)"))  # fmt: skip
    if isinstance(shown_error, dict):
        out.print(Text("error ", style="bold red") + shown(first_line(shown_error)))
        if shown_error.get("traceback"):
            out.print(shown(str(shown_error["traceback"]).rstrip(), "dim", lines=True))


@dataclass(frozen=True, slots=True)
class Links:
    """What `runs show` reads beside the run: its values (with their JSON forms) and forks."""

    values: list[tuple[ValueInfo, object]]
    forks: list[ForkInfo]


@runs.command("cancel")
@click.argument("run_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def runs_cancel(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Cancel a run and print its status afterwards.

    A pending or waiting run ends at once (`cancelled`); a run that a worker holds ends at its
    next await (`running (cancel requested)`). Cancelling a finished run changes nothing.
    """

    async def work(app: App) -> tuple[RunStatus, RunStatus]:
        handle = await app.get(run_id)
        before = await handle.status()
        async with recorded(app, Actor.cli(), "cancel", run_id):
            await handle.cancel()
        return before, await handle.status()

    before, after = run_with_app(ctx, work)
    if as_json:
        click.echo(json.dumps({"id": run_id, "status": after.value, "before": before.value,
                               "cancel_requested": not after.terminal}))  # fmt: skip
        return
    line = shown(f"run {run_id!r}: ") + status_text(after)
    if before.terminal:
        line += Text(" (it had already finished; nothing changed)", style="dim")
    elif not after.terminal:
        line += Text(" (cancel requested)")
    console().print(line)


@runs.command("resume")
@click.argument("run_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def runs_resume(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Give a failed, dead or held run another go, once its cause is fixed (deploy it first).

    Completed steps replay from their checkpoints; the step whose failure ended the run gets
    one more attempt under the current code (failures the workflow caught stay as recorded);
    a dead run's count of failed executions starts over; a held run is tried again at once. A
    worker (`tether worker`) picks the run up.
    """

    async def work(app: App) -> RunStatus:
        async with recorded(app, Actor.cli(), "resume", run_id):
            handle = await app.resume(run_id)
        return await handle.status()

    status = run_with_app(ctx, work)
    if as_json:
        click.echo(json.dumps({"id": run_id, "status": status.value}))
        return
    console().print(shown(f"run {run_id!r}: ") + status_text(status)
                    + Text(" (a worker resumes it from its checkpoints)"))  # fmt: skip


@runs.command("fork")
@click.argument("run_id", metavar="ID")
@click.option(
    "--from-step",
    "from_step",
    required=True,
    metavar="NAME",
    help="The step to execute again, as `runs show` lists it (name#2: its second call); "
    "the checkpoints before it are reused.",
)
@click.option(
    "--id", "new_id", metavar="NEW_ID", help="The new run's id (its idempotency key); "
    "a new one if not given.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the new run as a JSON object.")
@click.pass_context
def runs_fork(
    ctx: click.Context, run_id: str, from_step: str, new_id: str | None, as_json: bool
) -> None:
    """Fork a run from a step: a new run of the same workflow, with the same arguments, that
    reuses the run's checkpoints before that step and executes from there under the current
    code (time travel: try a fix, or a path again). Give --app (the group's option): the fork
    needs the workflow's code. The run itself is not changed; a worker executes the fork.
    """

    async def work(app: App) -> RunInfo:
        about = about_fork(from_step)
        async with recorded(app, Actor.cli(), "fork", run_id, detail=about) as said:
            handle = await app.fork(run_id, from_step, id=new_id)
            said.detail = about_fork(from_step, handle.id)
        return await handle.info()

    info = run_with_app(ctx, work)
    if as_json:
        doc = {**run_json(info), "forked_from": fork_json(info.fork)}
        click.echo(json.dumps(doc, indent=2))
        return
    step = info.fork.from_step if info.fork is not None else from_step
    console().print(shown(f"run {info.id!r} forked from {run_id!r} at step {step!r}: ")
                    + status_text(info.status)
                    + Text(" (a worker executes it from that step)"))  # fmt: skip

"""`tether events send`: deliver an event, with a JSON payload, to a run's mailbox (taken by
`tether.wait_for_event`).

Parses the payload and calls App.send; it must not write events itself or talk SQL.
"""

from __future__ import annotations

import json

import click

from tether.actions import Actor, about_event, recorded
from tether.app import App
from tether.cli.common import CliError, chosen, database_options, run_with_app


@click.group()
@database_options
@click.pass_context
def events(ctx: click.Context, database: str, app_ref: str | None) -> None:
    """Send events to runs (taken by `tether.wait_for_event`)."""
    ctx.obj = chosen(ctx, database, app_ref)


@events.command("send")
@click.argument("run_id")
@click.argument("key")
@click.argument("payload", default="null")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def events_send(ctx: click.Context, run_id: str, key: str, payload: str, as_json: bool) -> None:
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

    async def work(app: App) -> None:
        async with recorded(app, Actor.cli(), "send", run_id, detail=about_event(key)):
            await app.send(run_id, key, value)

    run_with_app(ctx, work)
    if as_json:
        click.echo(json.dumps({"run": run_id, "key": key, "sent": True}))
        return
    click.echo(f"sent event {key!r} to run {run_id!r}")

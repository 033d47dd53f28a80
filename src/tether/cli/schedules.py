"""`tether schedules list`: the schedules an App defines and its database holds, with the last
slot handled and the next one.

Parses arguments, calls App.list_schedules, and renders a table or JSON. It must not hold engine
logic or talk SQL: what it needs beyond printing belongs in the library.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from tether.cli.common import (
    chosen,
    console,
    database_options,
    iso,
    new_table,
    run_with_app,
    short_time,
)


@click.group()
@database_options
@click.pass_context
def schedules(ctx: click.Context, database: str, app_ref: str | None) -> None:
    """List schedules: one run per cron slot (see docs/schedules.md)."""
    ctx.obj = chosen(ctx, database, app_ref)


@schedules.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")
@click.pass_context
def schedules_list(ctx: click.Context, as_json: bool) -> None:
    """List schedules by name (times in UTC). With --app, the App's own schedules are listed
    too before any worker has registered them."""
    infos = run_with_app(ctx, lambda app: app.list_schedules())
    if as_json:
        docs = [{**asdict(i), "last_slot": iso(i.last_slot), "next_slot": iso(i.next_slot)}
                for i in infos]  # fmt: skip
        click.echo(json.dumps(docs, indent=2))
        return
    if not infos:
        console().print("no schedules", style="dim")
        return
    table = new_table("name", "workflow", "cron", "tz", "catch-up", "last slot", "next slot")
    for i in infos:
        last = short_time(i.last_slot) if i.registered else "(not registered yet)"
        table.add_row(i.name, i.workflow, i.cron, i.tz, i.catch_up, last, short_time(i.next_slot))
    console().print(table)

"""`tether runs move-version`: pin an unfinished run to another application version, so that
workers of that version execute it from its next claim on (docs/versions.md).

Parses options and renders VersionsMixin.move_version; it must not talk SQL nor execute runs.
"""

from __future__ import annotations

import json

import click
from rich.text import Text

from tether.actions import Actor, recorded
from tether.app import App
from tether.cli.common import console, run_with_app, shown, status_text
from tether.cli.runs import runs
from tether.core.versions import check_version, declared_version, move_version
from tether.errors import ConfigurationError
from tether.store.port import RunRecord


@runs.command("move-version")
@click.argument("run_id", metavar="ID")
@click.option("--to", "version", metavar="VERSION",
              help="The version to pin the run to, as `tether status` lists it.")  # fmt: skip
@click.option(
    "--to-current",
    is_flag=True,
    help="Pin it to the version of the App given with --app (its code's digest, or its version=).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the run's id, status and version.")
@click.pass_context
def runs_move_version(
    ctx: click.Context, run_id: str, version: str | None, to_current: bool, as_json: bool
) -> None:
    """Pin the unfinished run ID to another version: from its next claim on only workers of
    that version execute it (an execution in flight goes on where it is). Move a run when the
    new code replays its history, or to let a new deploy finish it; a finished run is left
    as it is."""
    if (version is None) == (not to_current):
        raise click.UsageError("give one of --to VERSION and --to-current")
    if to_current and not ctx.obj.get("app"):
        raise click.UsageError("--to-current needs --app MODULE:APP (the code whose version)")
    if version is not None:
        try:
            check_version(version)
        except ConfigurationError as exc:
            raise click.BadParameter(str(exc), param_hint="--to") from None

    async def work(app: App) -> RunRecord:
        await app.open()
        target = declared_version(app.engine) if version is None else version
        async with recorded(app, Actor.cli(), "move-version", run_id, detail=f"to {target!r}"):
            return await move_version(app.engine, run_id, target)

    record = run_with_app(ctx, work)
    if as_json:
        click.echo(json.dumps({"id": record.id, "status": str(record.status),
                               "version": record.version}))  # fmt: skip
        return
    if record.status.terminal:
        console().print(shown(f"run {run_id!r} is ") + status_text(record.status)
                        + Text(": finished runs keep their version"))  # fmt: skip
        return
    console().print(shown(f"run {run_id!r} ({record.status}) now pinned to version "
                          f"{record.version}"))  # fmt: skip

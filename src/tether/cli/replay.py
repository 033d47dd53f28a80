"""`tether replay-check`: replay stored histories against the workflows an App registers now,
and name the runs the current code no longer replays (exit 1 if any: a deploy gate).

Renders App.replay_check; it must not replay anything itself, execute steps or write.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.text import Text

from tether.app import App
from tether.cli.common import console, load_app, new_table, require_database, run_app
from tether.core.replay import ReplayOutcome
from tether.store.port import RunStatus


def divergence_json(outcome: ReplayOutcome) -> dict[str, Any]:
    position, recorded, requested = outcome.first_difference or (None, None, None)
    return {
        "run_id": outcome.run_id, "workflow": outcome.workflow, "position": position,
        "recorded": recorded, "requested": requested, "message": str(outcome.error),
    }  # fmt: skip


@click.command("replay-check")
@click.argument("app_ref", metavar="MODULE:APP")
@click.option("--workflow", "-w", metavar="NAME", help="Only runs of this workflow.")
@click.option(
    "--status",
    "-s",
    type=click.Choice([s.value for s in RunStatus]),
    help="Only runs in this status (default: every unfinished one).",
)
@click.option(
    "--all", "finished", is_flag=True, help="Finished runs too, not only the unfinished ones."
)
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(min=1),
    default=None,
    help="At most this many runs, newest first (default: all).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of a table.")
@click.pass_context
def replay_check(
    ctx: click.Context,
    app_ref: str,
    workflow: str | None,
    status: str | None,
    finished: bool,
    limit: int | None,
    as_json: bool,
) -> None:
    """Check that stored runs still replay under the current code.

    Replays the histories in the database of the App at MODULE:APP against the workflows it
    registers now; nothing is executed or written. By default every unfinished run (pending,
    running, waiting, held), however old: the runs a deploy of this code would take on. Lists
    the runs whose history the code no longer replays, with where they first differ; exits 1
    if any do (gate deploys on it).
    """
    app = load_app(app_ref)
    require_database(app.url, f"{app_ref} has no stored runs to check")
    with Progress(TextColumn("replaying stored runs"), BarColumn(), MofNCompleteColumn(),
                  console=console(stderr=True), transient=True,
                  disable=as_json or not sys.stderr.isatty()) as bar:  # fmt: skip
        task = bar.add_task("replay", total=None)

        def advance(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        def check(a: App) -> Awaitable[list[ReplayOutcome]]:
            return a.replay_check(workflow=workflow, status=status, finished=finished,
                                  limit=limit, on_progress=advance)  # fmt: skip

        outcomes = run_app(app, check)
    diverging = [o for o in outcomes if not o.ok]
    if as_json:
        doc = {"checked": len(outcomes), "diverging": [divergence_json(o) for o in diverging]}
        click.echo(json.dumps(doc, indent=2))
    else:
        out = console()
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
            out.print(table)
            for note in notes:
                out.print(Text(note, style="dim"))
        summary = f"{len(outcomes)} runs checked, {len(diverging)} diverge"
        out.print(summary, style="red" if diverging else "green")
    if diverging:
        ctx.exit(1)

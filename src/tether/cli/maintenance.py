"""`tether gc` and `tether status`: delete by hand what a retention policy says is old (the
worker does it too when the App has `retention=`), and show the database's sizes, its runs by
status, the application versions in use and the retention in force.

Parses options and renders App.gc, App.storage_status and version_status; it must not delete,
count or talk SQL itself.
"""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import timedelta
from typing import Any

import click
from rich.text import Text

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
from tether.core.versions import VersionStatus, version_status
from tether.retention import GcReport, Retention, StorageStatus, hide_password

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


def parse_duration(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """A duration written as a number and a unit (90s, 15m, 12h, 30d, 2w) as a timedelta."""
    if value is None:
        return None
    found = _DURATION.fullmatch(value.strip().lower())
    if found is None or float(found[1]) <= 0:
        raise click.BadParameter(
            f"{value!r} is not a duration: write a positive number and a unit (s, m, h, d or "
            f"w), e.g. 30d, 12h or 2w"
        )
    return timedelta(seconds=float(found[1]) * _UNITS[found[2]])


def duration_text(span: timedelta) -> str:
    """`30d`, `12h`, `1d 6h`: the two largest units of a duration."""
    rest, parts = int(span.total_seconds()), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
        if len(parts) == 2:
            break
    return " ".join(parts) or "0s"


def size_text(count: int | None) -> str:
    """Bytes for people: 512 B, 1.5 KiB, 12.0 MiB; empty when unknown."""
    if count is None:
        return ""
    if abs(count) < 1024:
        return f"{count} B"
    value = count / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def retention_text(retention: Retention) -> str:
    return (
        f"runs {duration_text(retention.runs)}, streams {duration_text(retention.streams_kept)}, "
        f"audit {duration_text(retention.audit)}; {retention.batch} rows per transaction, "
        f"a sweep every {duration_text(retention.interval)}"
    )


@click.command("gc")
@database_options
@click.option(
    "--runs",
    metavar="DURATION",
    callback=parse_duration,
    help="Delete runs that ended longer ago than this (e.g. 30d), with their checkpoints, "
    "events, streams and values. Default: the App's retention (--app), else 30d.",
)
@click.option(
    "--streams",
    metavar="DURATION",
    callback=parse_duration,
    help="Delete the stream chunks of runs that ended longer ago than this, keeping the runs "
    "(at most --runs). Default: the App's, else as --runs.",
)
@click.option(
    "--audit",
    metavar="DURATION",
    callback=parse_duration,
    help="Delete approvals and their audit trail last changed longer ago than this, once their "
    "run is gone (at least --runs). Default: the App's, else 365d.",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    help="Rows deleted per transaction (default: the App's, else 500).",
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option(
    "--vacuum",
    is_flag=True,
    help="Then rebuild the database at its smallest (SQLite: VACUUM, which also lets a database "
    "made before retention shrink from then on; writers wait meanwhile).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of a table.")
@click.pass_context
def gc(
    ctx: click.Context,
    database: str,
    app_ref: str | None,
    runs: timedelta | None,
    streams: timedelta | None,
    audit: timedelta | None,
    batch: int | None,
    dry_run: bool,
    vacuum: bool,
    as_json: bool,
) -> None:
    """Delete what ended long ago, now, in small paced batches.

    Runs that ended (succeeded, failed, cancelled, dead) before the cutoff go with their
    checkpoints, events, stream chunks, values and delivered outbox messages; unfinished runs,
    runs whose parent or a child is unfinished and runs with undelivered outbox messages are
    kept. Approvals and their audit trail are kept longer (--audit). Safe while workers run.
    """
    ctx.obj = chosen(ctx, database, app_ref)

    async def work(app: App) -> GcReport:
        base = app.retention or Retention()
        policy = dataclasses.replace(
            base, runs=runs or base.runs, streams=streams or base.streams,
            audit=audit or base.audit, batch=batch or base.batch,
        )  # fmt: skip
        return await app.gc(retention=policy, dry_run=dry_run, vacuum=vacuum)

    report = run_with_app(ctx, work)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
        return
    out = console()
    out.print(Text(
        f"{'would delete' if report.dry_run else 'deleted'}: runs that ended before "
        f"{short_time(report.runs_before)}, stream chunks of runs that ended before "
        f"{short_time(report.streams_before)}, approvals last changed before "
        f"{short_time(report.audit_before)} (UTC)"
    ))  # fmt: skip
    if report.total:
        table = new_table("table", "rows")
        for name, count in sorted(report.deleted.items()):
            table.add_row(name, str(count))
        out.print(table)
    summary = f"{report.total} rows in {report.batches} batches ({report.seconds:.2f} s)"
    if report.bytes_freed is not None:
        summary += f"; the database file gave back {size_text(report.bytes_freed)}"
    out.print(Text(summary, style="dim" if not report.total else ""))


@click.command("status")
@database_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of tables.")
@click.pass_context
def status(ctx: click.Context, database: str, app_ref: str | None, as_json: bool) -> None:
    """Show the database's size (file and WAL on SQLite), each table's rows and bytes, the runs
    by status, the versions in use (each one's unfinished runs and live workers), and the
    retention in force (the App's, with --app)."""
    ctx.obj = chosen(ctx, database, app_ref)

    async def work(app: App) -> tuple[StorageStatus, list[VersionStatus]]:
        found = await app.storage_status()
        return found, await version_status(app.engine)

    found, versions = run_with_app(ctx, work)
    if as_json:
        shown_json = found.to_json()
        shown_json["versions"] = [{"version": v.version, "unfinished_runs": v.runs,
                                   "workers": list(v.workers)} for v in versions]  # fmt: skip
        click.echo(json.dumps(shown_json, indent=2))
        return
    sizes, out = found.sizes, console()
    rows: list[tuple[str, str | Text]] = [
        ("database", f"{hide_password(found.url)} ({sizes.backend})")
    ]
    if sizes.database_bytes is not None:
        rows.append(("size", size_text(sizes.database_bytes)))
    if sizes.wal_bytes is not None:
        rows.append(("wal", size_text(sizes.wal_bytes)))
    if sizes.free_bytes is not None:
        rows.append(("free inside", f"{size_text(sizes.free_bytes)} (reused before it grows)"))
    if sizes.auto_vacuum is not None:
        rows.append(("auto_vacuum", sizes.auto_vacuum))
    counts = Text()
    for name, count in found.runs.items():
        counts += status_text(name) + Text(f" {count}  ")
    rows.append(("runs", counts))
    if found.retention is not None:
        rows.append(("retention", retention_text(found.retention)))
    elif app_ref:
        rows.append(("retention", "none: nothing is deleted but by `tether gc`"))
    else:
        rows.append(("retention", "pass --app MODULE:APP to show the App's"))
    out.print(fields_grid(rows))
    if versions:
        listed = new_table("version", "unfinished runs", "live workers")
        for v in versions:
            label = Text("(not pinned)", style="dim") if v.version is None else shown(v.version)
            listed.add_row(label, str(v.runs), shown(", ".join(v.workers)) if v.workers else "0")
        out.print(listed)
    table = new_table("table", "rows", "size")
    for t in sizes.tables:
        table.add_row(t.name, str(t.rows), size_text(t.bytes))
    out.print(table)

"""The operations of retention: delete, a bounded number of rows per transaction, what ended
long ago (runs with everything of theirs, stream entries of ended runs, approvals whose run is
gone), or count it (dry run).

Written once for both SQL dialects; which tables hold a run's rows is the dialect's (SQLite
keeps no stream counters). It plans each batch here too. It must not touch a
connection.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tether.store.port.retention import Cursor, Purge
from tether.store.query import Op, Query, one, select


def add_rows(into: dict[str, int], table: str, count: int) -> None:
    """Count `count` more rows of `table` (nothing for 0)."""
    if count > 0:
        into[table] = into.get(table, 0) + count


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """Which runs one purge_runs batch deletes: `whole` (all their rows, then the run), or,
    when the first run alone has more rows than the batch, part of `big`'s rows. `after` is the
    cursor past the runs this batch dealt with (deleted or kept); `complete` when it dealt with
    every run it was given."""

    whole: tuple[str, ...]
    big: Cursor | None
    after: Cursor
    complete: bool


def scan_size(limit: int) -> int:
    """How many ended runs a batch of `limit` rows looks at: a run has a row of its own and
    usually several more (checkpoints, events, ...)."""
    return max(1, limit // 4)


def plan_batch(
    found: Sequence[tuple[str, float]],
    waiting: Collection[str],
    rows: Mapping[str, int],
    limit: int,
    after: Cursor,
    *,
    dry_run: bool,
) -> BatchPlan:
    """The plan of a batch given the runs found in deletion order, those kept for their
    outbox, and the rows each has beside its own: whole runs while they fit in `limit` rows;
    a first run bigger than that goes in parts (counted whole when dry)."""
    whole: list[str] = []
    total = 0
    for run_id, at in found:
        if run_id not in waiting:
            size = rows.get(run_id, 0) + 1
            if not whole and size > limit and not dry_run:
                return BatchPlan((), (at, run_id), after, complete=False)
            if whole and total + size > limit:
                return BatchPlan(tuple(whole), None, after, complete=False)
            whole.append(run_id)
            total += size
        after = (at, run_id)
    return BatchPlan(tuple(whole), None, after, complete=True)


def _cursor_args(before: float, limit: int, after: Cursor) -> dict[str, Any]:
    return {"before": before, "limit": limit, "after_at": after[0], "after_id": after[1]}


def _purge_rows(
    run_id: str, tables: tuple[str, ...], budget: int, counts: dict[str, int], *, dry_run: bool
) -> Op[bool]:
    """Delete (or count, all of them) up to `budget` of the run's rows in `tables`, table by
    table. False when the budget ran out first: the rest goes in the next batch."""
    args: dict[str, Any] = {"id": run_id, "limit": budget}
    for table in tables:
        if dry_run:
            row = yield from one(f"retention_count_{table}", **args)
            add_rows(counts, table, int(row[0]) if row else 0)
            continue
        deleted = yield Query(f"retention_delete_{table}", dict(args))
        add_rows(counts, table, deleted)
        args["limit"] = budget = budget - deleted
        if budget <= 0:
            return False
    return True


def purge_runs(
    before: float, limit: int, after: Cursor, dry_run: bool, tables: tuple[str, ...]
) -> Op[Purge]:
    limit = max(1, int(limit))
    found = yield from select("retention_expired_runs", **_cursor_args(before, scan_size(limit),
                                                                        after))  # fmt: skip
    plan = plan_batch(
        [(str(r[0]), float(r[1])) for r in found], {r[0] for r in found if r[3]},
        {r[0]: int(r[2]) for r in found}, limit, after, dry_run=dry_run,
    )  # fmt: skip
    deleted: dict[str, int] = {}
    chosen = {"ids": list(plan.whole)}
    for table in tables if plan.whole else ():
        if dry_run:
            rows = yield from select(f"retention_rows_{table}", **chosen)
            add_rows(deleted, table, sum(int(n) for _, n in rows))
        else:
            add_rows(deleted, table, (yield Query(f"retention_delete_all_{table}", chosen)))
    if plan.whole:
        gone = len(plan.whole) if dry_run else (yield Query("retention_delete_runs", chosen))
        add_rows(deleted, "tether_runs", gone)
    if plan.big is not None:  # a run bigger than a batch: part of its rows
        big = plan.big[1]
        if not (yield from _purge_rows(big, tables, limit, deleted, dry_run=False)):
            return Purge(deleted, plan.after)
        add_rows(deleted, "tether_runs", (yield Query("retention_delete_run", {"id": big})))
        return Purge(deleted, plan.big)
    more = not plan.complete or len(found) == scan_size(limit)
    return Purge(deleted, plan.after if more else None)


def purge_streams(
    before: float, limit: int, after: Cursor, dry_run: bool, tables: tuple[str, ...]
) -> Op[Purge]:
    limit = max(1, int(limit))
    found = yield from select("retention_ended_runs", **_cursor_args(before, limit, after))
    counts: dict[str, int] = {}
    cursor = after
    for run_id, finished_at, has_entries in found:
        if has_entries:
            budget = limit - sum(counts.values())
            if budget <= 0:
                return Purge(counts, cursor)
            if not (yield from _purge_rows(run_id, tables, budget, counts, dry_run=dry_run)):
                return Purge(counts, cursor)
        cursor = (float(finished_at), str(run_id))
    return Purge(counts, cursor if len(found) == limit else None)


def purge_approvals(before: float, limit: int, after: Cursor, dry_run: bool) -> Op[Purge]:
    limit = max(1, int(limit))
    found = yield from select("retention_expired_approvals", **_cursor_args(before, limit, after))
    counts: dict[str, int] = {}
    cursor = after
    for approval_id, updated_at in found:
        if sum(counts.values()) >= limit:
            return Purge(counts, cursor)
        args = {"id": approval_id}
        if dry_run:
            row = yield from one("retention_count_audit", **args)
            add_rows(counts, "tether_approval_audit", int(row[0]) if row else 0)
            add_rows(counts, "tether_approvals", 1)
        else:
            add_rows(counts, "tether_approval_audit",
                     (yield Query("retention_delete_audit", args)))  # fmt: skip
            add_rows(counts, "tether_approvals", (yield Query("retention_delete_approval", args)))
        cursor = (float(updated_at), str(approval_id))
    return Purge(counts, cursor if len(found) == limit else None)

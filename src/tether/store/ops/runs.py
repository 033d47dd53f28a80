"""The operations on runs: create, read, claim, suspend, finish, fail, hold, cancel, resume,
dead-letter the unserved, and the counts for monitoring.

Written once for both SQL dialects; what a run's end does beside its row (approvals cancelled,
the parent told) is `ended`, shared by every way a run ends. It must not touch a connection or
a driver.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tether.errors import RunNotFound
from tether.store.keys import child_key, child_outcome
from tether.store.ops.approvals import close_approvals
from tether.store.ops.common import NOTIFY, deliver, fence, lease_lost
from tether.store.port import (
    Checkpoint,
    Lease,
    NewRun,
    QueueLimits,
    RunRecord,
    RunStatus,
    StoreStats,
)
from tether.store.query import Conflict, Op, Query, execute, one, select
from tether.store.rows import carried_rows, checkpoint_values, page_params, run_from_row
from tether.store.rules import duplicate_run, queue_budget, store_stats


def _not_found(run_id: str) -> RunNotFound:
    return RunNotFound(f"no run has id {run_id!r}; check the id with `tether runs list`")


def new_run_params(
    run: NewRun,
    now: float,
    owner: str | None,
    lease_until: float | None,
    version: str | None = None,
) -> dict[str, Any]:
    """The parameters of insert_run: a run created pending (waiting until run.wake_at, when
    set), or already claimed by `owner` until `lease_until` (epoch 1) and pinned to its
    `version`."""
    status = RunStatus.RUNNING if owner else RunStatus.PENDING
    wake_at = None if owner else run.wake_at  # app.start_at: waiting until then
    return {
        "id": run.id, "workflow": run.workflow, "args": run.args, "now": now,
        "deadline_at": run.deadline_at, "parent_id": run.parent_id, "owner": owner,
        "status": (RunStatus.WAITING if wake_at is not None else status).value,
        "epoch": 1 if owner else 0, "lease_expires_at": lease_until if owner else None,
        "queue": run.queue, "priority": run.priority, "dedup_key": run.dedup_key,
        "started_by": run.started_by,
        # A run created already claimed has started: rate limits count it.
        "started_at": now if owner else None, "wake_at": wake_at,
        "version": version if owner else None, "trace_context": run.trace_context,
    }  # fmt: skip


def create_run(
    run: NewRun,
    now: float,
    owner: str | None,
    lease_until: float | None,
    version: str | None = None,
) -> Op[tuple[RunRecord, bool]]:
    args = new_run_params(run, now, owner, lease_until, version)
    if (yield Query("insert_run", args)) != 1:
        row = yield from one("get_run", id=run.id)
        if row is not None:  # its id exists: the same run, asked for again
            return run_from_row(row), False
        # Else an unfinished run of its queue holds its dedup key.
        holder = yield from one("dedup_holder", queue=run.queue, dedup_key=run.dedup_key)
        raise duplicate_run(run.queue, run.dedup_key, holder[0] if holder else "?")
    if owner is None:
        yield NOTIFY
    created = RunRecord(
        id=run.id, workflow=run.workflow, status=RunStatus(args["status"]), args=run.args,
        owner=owner, epoch=args["epoch"], lease_expires_at=args["lease_expires_at"],
        wake_at=args["wake_at"], deadline_at=run.deadline_at,
        created_at=now, updated_at=now, parent_id=run.parent_id, queue=run.queue,
        priority=run.priority, dedup_key=run.dedup_key, started_at=now if owner else None,
        started_by=run.started_by, version=args["version"], trace_context=run.trace_context,
    )  # fmt: skip
    return created, True


def get_run(run_id: str) -> Op[RunRecord | None]:
    row = yield from one("get_run", id=run_id)
    return None if row is None else run_from_row(row)


def list_runs(
    statuses: Sequence[RunStatus],
    workflow: str | None,
    limit: int,
    before: tuple[float, str] | None,
    queue: str | None = None,
    version: str | None = None,
    started_by: str | None = None,
    created_after: float | None = None,
    created_before: float | None = None,
    id_prefix: str | None = None,
) -> Op[list[RunRecord]]:
    # Only the filters given are in the statement (named fragments, not `:x IS NULL OR ...`),
    # so each one's index can serve it, in newest-first order.
    where: list[str] = []
    params: dict[str, Any] = {"limit": max(0, limit)}
    for fragment, name, value in (
        ("runs_of_workflow", "workflow", workflow), ("runs_of_queue", "queue", queue),
        ("runs_of_version", "version", version), ("runs_started_by", "started_by", started_by),
        ("runs_created_from", "created_after", created_after),
        ("runs_created_before", "created_before", created_before),
    ):  # fmt: skip
        if value is not None:
            where.append(fragment)
            params[name] = value
    if id_prefix:
        # A range of ids, in code point order (SQLite's BINARY, PostgreSQL's "C"): every id
        # that starts with the prefix and nothing else, with no LIKE pattern to escape.
        end = prefix_end(id_prefix)
        where.append("runs_id_prefix" if end is not None else "runs_id_from")
        params |= {"id_from": id_prefix, "id_to": end}
    if before is not None:
        where.append("runs_before")
        params |= page_params(before)
    wanted = sorted(set(statuses))
    if len(wanted) <= 1:
        if wanted:
            where.append("runs_with_status")
            params["status"] = str(wanted[0])
        rows = yield from select("list_runs", tuple(where), **params)
        return [run_from_row(r) for r in rows]
    # Several statuses: one page per status, each read in order from its (status, created_at,
    # id) index, then merged; one query with IN would sort every match, or scan past all
    # the runs of other statuses. Each statement sees its own moment (PostgreSQL's READ
    # COMMITTED): a run whose status changed in between is shown once, as read last.
    found: dict[str, RunRecord] = {}
    for status in wanted:
        rows = yield from select("list_runs", (*where, "runs_with_status"), **params,
                                 status=str(status))  # fmt: skip
        found |= {row[0]: run_from_row(row) for row in rows}
    merged = sorted(found.values(), key=lambda r: (r.created_at, r.id), reverse=True)
    return merged[: params["limit"]]


def prefix_end(prefix: str) -> str | None:
    """The least string after every string that starts with `prefix` (in code point order):
    its last character that can be incremented, incremented, and what follows it dropped; None
    when there is none (the prefix is all U+10FFFF): every id from the prefix on matches."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < 0x10FFFF:
            # Surrogates are not text (UTF-8 cannot hold them): the next character is U+E000.
            chars.append(chr(0xE000 if 0xD800 <= last + 1 <= 0xDFFF else last + 1))
            return "".join(chars)
    return None


def claim_runs(
    worker_id: str,
    workflows: Sequence[str],
    now: float,
    lease_until: float,
    limit: int,
    queues: Mapping[str, QueueLimits],
    version: str | None = None,
    live_since: float | None = None,
) -> Op[list[RunRecord]]:
    base = {"worker": worker_id, "workflows": list(workflows), "now": now,
            "lease_until": lease_until, "version": version,
            "live_since": live_since}  # fmt: skip
    rows: list[Any] = []
    room = limit
    for name in sorted(queues):  # a fixed order: no deadlock between claimers
        limits = queues[name]
        # Claims of one queue are serialized, so its limits hold across workers.
        yield Query("lock_queue", {"lock": f"tether:{name}"})
        load = {**base, "queue": name, "since": now - limits.period}
        counts = yield from one("queue_load", **load)
        assert counts is not None
        budget = queue_budget(limits, counts[0], counts[1], counts[2], room)
        if budget:
            rows += yield from select("claim_queue", **load, limit=budget)
            room = limit - len(rows)
    if room > 0:
        rows += yield from select("claim_runs", **base, limited=sorted(queues), limit=room)
    # RETURNING has no order: give them back in claim order.
    return sorted((run_from_row(r) for r in rows), key=lambda r: (-r.priority, r.created_at, r.id))


def next_wake_at(
    workflows: Sequence[str], version: str | None = None, live_since: float | None = None
) -> Op[float | None]:
    row = yield from one("next_wake_at", workflows=list(workflows), version=version,
                         live_since=live_since)  # fmt: skip
    return None if row is None or row[0] is None else float(row[0])


def move_version(run_id: str, version: str | None, now: float) -> Op[RunRecord]:
    row = yield from one("move_version", id=run_id, version=version, now=now)
    if row is not None:
        yield NOTIFY  # its new version's workers may claim it now
        return run_from_row(row)
    row = yield from one("get_run", id=run_id)
    if row is None:
        raise _not_found(run_id)
    return run_from_row(row)  # finished: left as it is


def version_counts() -> Op[dict[str | None, int]]:
    rows = yield from select("version_counts")
    return {row[0]: int(row[1]) for row in rows}


def _fenced(lease: Lease, query: str, **extra: Any) -> Op[None]:
    """The update `query` under `lease` (LeaseLost when it is not held), then a wake-up for
    waiting workers (a queue's budget may have freed up)."""
    if (yield Query(query, {**fence(lease), **extra})) != 1:
        raise (yield from lease_lost(lease))
    yield NOTIFY


def suspend_run(
    lease: Lease, wake_at: float | None, now: float, wake_on: Sequence[str]
) -> Op[None]:
    # Locked first, so an event delivered meanwhile is seen by the UPDATE (see lock_run).
    yield Query("lock_run", fence(lease))
    keys = list(wake_on)
    yield from _fenced(lease, "suspend_run", wake_at=wake_at, now=now, wake_on=json.dumps(keys),
                       wake_on_keys=keys)  # fmt: skip


def finish_run(
    lease: Lease,
    status: RunStatus,
    result: str | None,
    error: str | None,
    failures: int | None,
    now: float,
    checkpoints: Sequence[Checkpoint] = (),
) -> Op[None]:
    """The run's end, with the `checkpoints` its execution completed last in the same commit."""
    params = {**fence(lease), "status": str(status), "result": result, "error": error,
              "now": now, "failures": failures}  # fmt: skip
    # A run with no parent and no pending approval ends by its own row: a dialect may do that
    # in one statement (it answers TRUE, having woken the workers if it freed a queue's budget),
    # with the checkpoints in it; else it changes nothing, and the full end below does it all.
    if checkpoints:
        alone = Query("finish_alone_carrying", {**params, "carried": carried_rows(checkpoints)},
                      alone=True)  # fmt: skip
    else:
        alone = Query("finish_alone", params, alone=True)
    done = yield alone
    if done and done[0][0] is True:
        return
    worker, epoch = lease.worker_id, lease.epoch
    for c in checkpoints:
        upsert = checkpoint_values(lease.run_id, c, c.result, worker, epoch)
        if (yield Query("upsert_checkpoint", upsert)) != 1:
            raise (yield from lease_lost(lease))
    row = yield from one("finish_run", **params)
    if row is None:
        raise (yield from lease_lost(lease))
    if row[1] is not None:  # its end frees a queue's budget: idle workers may claim
        yield NOTIFY
    yield from ended(lease.run_id, row[0], status, result, error, now)


def ended(
    run_id: str,
    parent_id: str | None,
    status: RunStatus,
    result: str | None,
    error: str | None,
    now: float,
) -> Op[None]:
    """What ending a run does beside its row, in its transaction: its pending approvals are
    cancelled, and its parent is told."""
    yield from close_approvals(run_id, status, now)
    if parent_id is not None:
        yield from deliver(parent_id, child_key(run_id), child_outcome(status, result, error), now)


def fail_execution(
    lease: Lease, error: str, failures: int, retry_at: float, now: float
) -> Op[None]:
    yield from _fenced(lease, "fail_execution", error=error, failures=failures,
                       retry_at=retry_at, now=now)  # fmt: skip


def hold_run(lease: Lease, error: str, failures: int, wake_at: float, now: float) -> Op[None]:
    yield from _fenced(lease, "hold_run", error=error, failures=failures, wake_at=wake_at,
                       now=now)  # fmt: skip


def wake_held(workflows: Sequence[str], now: float) -> Op[int]:
    woken = yield from execute("wake_held", workflows=list(workflows), now=now)
    if woken:
        yield NOTIFY
    return woken


def database_time() -> Op[float]:
    row = yield from one("database_time")
    assert row is not None
    return float(row[0])


def unserved_runs(since: float) -> Op[list[tuple[str, str, str | None]]]:
    """Unfinished runs of workflows that no live worker (a heartbeat since `since`) serves:
    (id, workflow, parent id); none while a live worker's workflows are unknown."""
    live = yield from select("live_workflows", since=since)
    if any(names is None for (names,) in live):
        return []  # an older worker: what it serves is unknown
    served = sorted({name for (names,) in live for name in json.loads(names)})
    rows = yield from select("unserved_runs", since=since, served=served)
    return [(r[0], r[1], r[2]) for r in rows]


def dead_letter_unserved(
    since: float, error: Callable[[str, str], str], now: float
) -> Op[list[str]]:
    buried = []
    for run_id, workflow, parent_id in (yield from unserved_runs(since)):  # again, in the write
        text = error(run_id, workflow)
        yield Query("bury_run", {"id": run_id, "error": text, "now": now})
        yield from ended(run_id, parent_id, RunStatus.DEAD, None, text, now)
        buried.append(run_id)
    return buried


def cancel_run(run_id: str, error: str, now: float) -> Op[RunRecord]:
    todo = [run_id]
    while todo:  # the run, then its unfinished descendants
        current = todo.pop()
        # Locked first: a suspension committing meanwhile is seen (not a cancel of a row that
        # was running in this statement's snapshot and waiting by its end).
        if (yield from one("lock_run_status", id=current)) is None and current == run_id:
            raise _not_found(run_id)
        args = {"id": current, "error": error, "now": now}
        row = yield from one("cancel_unowned", **args)
        if row is None:
            yield Query("cancel_owned", args)
        else:
            yield from close_approvals(current, RunStatus.CANCELLED, now)
            if row[0] is not None:
                outcome = child_outcome(RunStatus.CANCELLED, None, error)
                yield from deliver(row[0], child_key(current), outcome, now)
        todo += [r[0] for r in (yield from select("children", id=current))]
    row = yield from one("get_run", id=run_id)
    assert row is not None
    return run_from_row(row)


def resume_run(
    run_id: str, now: float, deadline_at: float | None, retry: str | None
) -> Op[RunRecord]:
    args = {"id": run_id, "now": now, "deadline_at": deadline_at, "retry": retry}
    try:
        resumed = (yield Query("resume_run", args, guard=True)) == 1
    except Conflict:  # an unfinished run of its queue holds its dedup key now
        row = yield from one("get_run", id=run_id)
        assert row is not None  # the update matched it
        run = run_from_row(row)
        holder = yield from one("dedup_holder", queue=run.queue, dedup_key=run.dedup_key)
        raise duplicate_run(run.queue, run.dedup_key, holder[0] if holder else "?") from None
    if resumed:
        yield Query("resume_checkpoints", args)
    row = yield from one("get_run", id=run_id)
    if row is None:
        raise _not_found(run_id)
    return run_from_row(row)


def stats(now: float) -> Op[StoreStats]:
    rows = yield from select("store_stats", now=now)  # one statement: one snapshot
    return store_stats(rows)

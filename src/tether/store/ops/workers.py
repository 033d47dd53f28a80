"""The operations on workers: register, list, release a dead one, heartbeat its leases.

Written once for both SQL dialects; it must not touch a connection or a driver.
"""

from __future__ import annotations

from collections.abc import Sequence

from tether.store.ops.common import NOTIFY
from tether.store.port import HeartbeatReply, Lease, WorkerInfo
from tether.store.query import Op, Query, execute, select
from tether.store.rows import worker_from_row, worker_params


def register_worker(worker: WorkerInfo, now: float) -> Op[None]:
    yield Query("upsert_worker", worker_params(worker, now))


def list_workers(host: str | None) -> Op[list[WorkerInfo]]:
    rows = yield from select("list_workers", host=host)
    return [worker_from_row(row) for row in rows]


def release_worker(worker_id: str, now: float) -> Op[list[str]]:
    rows = yield from select("release_worker_runs", id=worker_id, now=now)
    yield Query("delete_worker", {"id": worker_id})
    if rows:
        yield NOTIFY
    return sorted(r[0] for r in rows)


def heartbeat(
    worker_id: str, leases: Sequence[Lease], lease_until: float, now: float
) -> Op[HeartbeatReply]:
    epochs = {lease.run_id: lease.epoch for lease in leases}
    held: dict[str, bool] = {}  # run id -> its cancellation was asked
    if epochs:
        # One statement for every lease. A run's row another transaction holds is skipped
        # (PostgreSQL), not waited for: waiting with the rows extended so far locked could
        # deadlock with that transaction, a commit of this worker's own writes.
        rows = yield from select("extend_leases", worker=worker_id, lease_until=lease_until,
                                 ids=list(epochs), epochs=list(epochs.values()))  # fmt: skip
        held.update((row[0], bool(row[1])) for row in rows)
        rest = [run_id for run_id in epochs if run_id not in held]
        if rest:  # lost, or skipped: the row, as committed, tells which (no lock taken)
            rows = yield from select("leases_held", worker=worker_id, ids=rest,
                                     epochs=[epochs[run_id] for run_id in rest])  # fmt: skip
            held.update((row[0], bool(row[1])) for row in rows)
    touched = yield from execute("touch_worker", id=worker_id, now=now)
    return HeartbeatReply(
        lost=[lease.run_id for lease in leases if lease.run_id not in held],
        cancel=[lease.run_id for lease in leases if held.get(lease.run_id)],
        unknown=touched == 0,
    )

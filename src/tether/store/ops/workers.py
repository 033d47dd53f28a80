"""The operations on workers: register, list, release a dead one, heartbeat its leases.

Written once for both SQL dialects; it must not touch a connection or a driver.
"""

from __future__ import annotations

from collections.abc import Sequence

from tether.store.ops.common import NOTIFY
from tether.store.port import HeartbeatReply, Lease, WorkerInfo
from tether.store.query import Op, Query, execute, one, select
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
    lost, cancel = [], []
    for lease in leases:
        row = yield from one("extend_lease", run_id=lease.run_id, worker=worker_id,
                             epoch=lease.epoch, lease_until=lease_until)  # fmt: skip
        if row is None:
            lost.append(lease.run_id)
        elif row[0]:
            cancel.append(lease.run_id)
    touched = yield from execute("touch_worker", id=worker_id, now=now)
    return HeartbeatReply(lost=lost, cancel=cancel, unknown=touched == 0)

"""Small rules the store's operations share: what a duplicate dedup key says, how many runs a
queue may still start, the counts for monitoring, lost leases explained, and which of a
writer's stream chunks no reset retracts. Pure functions, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tether.errors import DuplicateRun, LeaseLost
from tether.store.port.runs import (
    Lease,
    QueueLimits,
    RunStatus,
    StoreStats,
)
from tether.store.port.streams import StreamEntry, StreamKind


def tx_lease_lost(run_id: str, worker_id: str, epoch: int, name: str) -> LeaseLost:
    """The error for a transaction step of a run whose lease its worker no longer holds."""
    return LeaseLost(
        f"worker {worker_id!r} no longer holds run {run_id!r} at epoch {epoch} (another "
        f"worker adopted it, or it ended); transaction step {name!r} was rolled back, nothing "
        f"of it was stored, and this worker stops executing the run"
    )


def value_lease_lost(run_id: str, worker_id: str, epoch: int, key: str) -> LeaseLost:
    """The error for a set_value by a worker that no longer holds the run (nothing written)."""
    return LeaseLost(
        f"worker {worker_id!r} no longer holds run {run_id!r} at epoch {epoch} (another worker "
        f"adopted it, or it ended); its value {key!r} was not stored, and this worker stops "
        f"executing the run"
    )


def unretracted(entries: Sequence[StreamEntry]) -> list[int]:
    """The offsets of the chunks among `entries` that no reset among them names, in order."""
    retracted: set[int] = set()
    for entry in entries:
        if entry.kind is StreamKind.RESET:
            retracted.update(json.loads(entry.data))
    return [e.offset for e in entries if e.kind is StreamKind.CHUNK and e.offset not in retracted]


def duplicate_run(queue: str | None, dedup_key: str | None, holder: str) -> DuplicateRun:
    """The error for a start whose dedup key an unfinished run of its queue holds."""
    return DuplicateRun(
        f"run {holder!r} of queue {queue!r} is unfinished with dedup key {dedup_key!r}; wait "
        f"for it to end or use another key",
        run_id=holder,
    )


def queue_budget(limits: QueueLimits, running: int, mine: int, started: int, room: int) -> int:
    """How many of a queue's runs a claim may take now, given its load (see claim_runs)."""
    budget = room
    if limits.concurrency is not None:
        budget = min(budget, limits.concurrency - running)
    if limits.worker_concurrency is not None:
        budget = min(budget, limits.worker_concurrency - mine)
    if limits.rate is not None:
        budget = min(budget, limits.rate - started)
    return max(budget, 0)


OUTBOX_BACKLOG = ("pending", "sending", "failed")  # the outbox statuses stats() counts


def store_stats(rows: Sequence[Sequence[Any]]) -> StoreStats:
    """StoreStats from the rows of store_stats, (kind, label, count, extra); statuses and
    outbox states that had no row count 0."""
    by_kind: dict[str, dict[str, tuple[int, Any]]] = {}
    for kind, label, count, extra in rows:
        by_kind.setdefault(kind, {})[label] = (int(count), extra)
    statuses, outbox = by_kind.get("runs", {}), by_kind.get("outbox", {})
    runs = {status: statuses.get(status.value, (0, None))[0] for status in RunStatus}
    ((pending, oldest),) = by_kind["approvals"].values()
    return StoreStats(
        runs=runs,
        pending_approvals=pending,
        oldest_pending_approval_at=None if oldest is None else float(oldest),
        due={queue: n for queue, (n, _) in sorted(by_kind.get("due", {}).items())},
        outbox={status: outbox.get(status, (0, None))[0] for status in OUTBOX_BACKLOG},
        outbox_in_doubt=sum(int(doubt or 0) for _, doubt in outbox.values()),
    )


def stream_lease_lost(lease: Lease, key: str) -> LeaseLost:
    """The error for an append to a stream by a worker that no longer holds the run."""
    return LeaseLost(
        f"worker {lease.worker_id!r} no longer holds run {lease.run_id!r} at epoch "
        f"{lease.epoch} (another worker adopted it, or it ended); its write to stream {key!r} "
        f"was not stored, and this worker stops executing the run"
    )

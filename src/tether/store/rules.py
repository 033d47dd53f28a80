"""Rules every backend applies the same way: a queue's claim budget, the monitoring counts, and
the errors of a dedup-key conflict and of a stream append by a worker that lost its run.

Pure functions of the port's records; no database driver, nothing of tether.core.
"""

from __future__ import annotations

from collections.abc import Mapping

from tether.errors import DuplicateRun, LeaseLost
from tether.store.base import Lease, QueueLimits, RunStatus, StoreStats


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


def store_stats(by_status: Mapping[str, int], pending: int, oldest: float | None) -> StoreStats:
    """StoreStats from a backend's counts (statuses it did not report count 0)."""
    runs = {status: int(by_status.get(status.value, 0)) for status in RunStatus}
    return StoreStats(runs, int(pending), None if oldest is None else float(oldest))


def stream_lease_lost(lease: Lease, key: str) -> LeaseLost:
    """The error for an append to a stream by a worker that no longer holds the run."""
    return LeaseLost(
        f"worker {lease.worker_id!r} no longer holds run {lease.run_id!r} at epoch "
        f"{lease.epoch} (another worker adopted it, or it ended); its write to stream {key!r} "
        f"was not stored, and this worker stops executing the run"
    )

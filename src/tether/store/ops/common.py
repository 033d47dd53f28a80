"""What many operations do inside their transaction: explain a lost lease, wake waiting
workers, deliver an event to a run's mailbox.

Pieces of operations, never whole ones: each is a generator of queries that an operation
yields from. It must not touch a connection or a driver.
"""

from __future__ import annotations

from typing import Any

from tether.errors import LeaseLost
from tether.store.port import Lease
from tether.store.query import Op, Query, one

# The query that tells idle workers something became due: PostgreSQL's NOTIFY, which its driver
# sends once per transaction however many operations ask; nothing on SQLite, whose workers look
# at the file's data version instead.
NOTIFY = Query("notify", {})


def fence(lease: Lease) -> dict[str, Any]:
    """The parameters by which a fenced query checks the lease."""
    return {"run_id": lease.run_id, "worker": lease.worker_id, "epoch": lease.epoch}


def lease_lost(lease: Lease) -> Op[LeaseLost]:
    """The error of a write whose lease is not held, saying what became of the run."""
    row = yield from one("lease_state", run_id=lease.run_id)
    now = "is gone" if row is None else f"is {row[2]}, owner {row[0]!r}, epoch {row[1]}"
    return LeaseLost(
        f"worker {lease.worker_id!r} lost run {lease.run_id!r} (it held epoch {lease.epoch}; "
        f"the run {now}); this worker stops executing it"
    )


def deliver(run_id: str, key: str, payload: str, now: float) -> Op[None]:
    """Append an event to the run's mailbox and wake the run if it waits for that key."""
    args = {"run_id": run_id, "key": key, "payload": payload, "now": now}
    yield Query("lock_run", args)  # serialized with the run's suspension (see lock_run)
    yield Query("insert_event", args)
    yield Query("wake_for_event", args)
    yield NOTIFY

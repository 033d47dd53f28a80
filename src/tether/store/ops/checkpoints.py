"""The operations on a run's history: load it, write one checkpoint (the hot path).

Written once for both SQL dialects; the upsert is fenced in its own statement (no row unless
the lease is held) and bound by position (rows.CHECKPOINT_PARAMS). It must not touch a
connection or a driver.
"""

from __future__ import annotations

from tether.store.ops.common import lease_lost
from tether.store.port import Checkpoint, Lease
from tether.store.query import Op, Query, select
from tether.store.rows import checkpoint_from_row, checkpoint_values


def load_history(run_id: str) -> Op[list[Checkpoint]]:
    rows = yield from select("load_history", run_id=run_id)
    return [checkpoint_from_row(r) for r in rows]


def write_checkpoint(lease: Lease, checkpoint: Checkpoint, result: str | None) -> Op[None]:
    """Upsert `checkpoint` with `result` in place of its own (take_event, set_value and
    transactions fill theirs in)."""
    values = checkpoint_values(lease.run_id, checkpoint, result, lease.worker_id, lease.epoch)
    if (yield Query("upsert_checkpoint", values)) != 1:
        raise (yield from lease_lost(lease))

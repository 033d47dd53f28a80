"""The operations on a run's history: load it (or those of many runs at once), write one
checkpoint (the hot path).

Written once for both SQL dialects; the upsert is fenced in its own statement (no row unless
the lease is held) and bound by position (rows.CHECKPOINT_PARAMS). It must not touch a
connection or a driver.
"""

from __future__ import annotations

from collections.abc import Sequence

from tether.store.ops.common import lease_lost
from tether.store.port import Checkpoint, Lease
from tether.store.query import Op, Query, select
from tether.store.rows import checkpoint_from_row, checkpoint_values


def load_history(run_id: str) -> Op[list[Checkpoint]]:
    rows = yield from select("load_history", run_id=run_id)
    return [checkpoint_from_row(r) for r in rows]


def load_histories(run_ids: Sequence[str]) -> Op[dict[str, list[Checkpoint]]]:
    histories: dict[str, list[Checkpoint]] = {}
    if run_ids:
        for row in (yield from select("load_histories", run_ids=list(run_ids))):
            histories.setdefault(row[0], []).append(checkpoint_from_row(row[1:]))
    return histories


def write_checkpoint(lease: Lease, checkpoint: Checkpoint, result: str | None) -> Op[None]:
    """Upsert `checkpoint` with `result` in place of its own (take_event, set_value and
    transactions fill theirs in)."""
    values = checkpoint_values(lease.run_id, checkpoint, result, lease.worker_id, lease.epoch)
    if (yield Query("upsert_checkpoint", values)) != 1:
        raise (yield from lease_lost(lease))

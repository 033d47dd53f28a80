"""The Store port's records for published values and fork links: plain data, no I/O.

It must not import tether.store.base (which builds on it), tether.core or any backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.errors import LeaseLost


@dataclass(frozen=True, slots=True)
class ValueRecord:
    """One version of a value a run published (`tether.set_value`): the row of tether_values.
    The key's latest value is its highest version; versions count from 1 per (run, key)."""

    run_id: str
    key: str
    version: int
    value: str  # JSON made by tether.serde, opaque to the store
    seq: int  # the position of the set_value checkpoint in the run's history
    created_at: float


@dataclass(frozen=True, slots=True)
class ForkRecord:
    """A fork link, the row of tether_forks: run `run_id` was forked from `source_run_id`,
    reusing its checkpoints before `from_step` (at position `from_seq`)."""

    run_id: str
    source_run_id: str
    from_step: str
    from_seq: int
    created_at: float


VALUE_COLUMNS = "run_id, key, version, value, seq, created_at"
FORK_COLUMNS = "run_id, source_run_id, from_step, from_seq, created_at"


def value_from_row(row: tuple[object, ...]) -> ValueRecord:
    """A value from the columns of VALUE_COLUMNS, in that order."""
    run_id, key, version, value, seq, created_at = row
    return ValueRecord(str(run_id), str(key), int(str(version)), str(value), int(str(seq)),
                       float(str(created_at)))  # fmt: skip


def fork_from_row(row: tuple[object, ...]) -> ForkRecord:
    """A fork link from the columns of FORK_COLUMNS, in that order."""
    run_id, source, step, seq, created_at = row
    return ForkRecord(str(run_id), str(source), str(step), int(str(seq)), float(str(created_at)))


def value_lease_lost(run_id: str, worker_id: str, epoch: int, key: str) -> LeaseLost:
    """The error for a set_value by a worker that no longer holds the run (nothing written)."""
    return LeaseLost(
        f"worker {worker_id!r} no longer holds run {run_id!r} at epoch {epoch} (another worker "
        f"adopted it, or it ended); its value {key!r} was not stored, and this worker stops "
        f"executing the run"
    )

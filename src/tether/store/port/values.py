"""The values-and-forks part of the Store port: the versions of values a run publishes, the
link of a run forked from another's history, and the operations on them. It must not import
tether.core or any backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tether.store.port.runs import Checkpoint, Lease, NewRun, RunRecord


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


class ValuesPort(Protocol):
    """Values a run publishes, and forks."""

    async def set_value(
        self, lease: Lease, key: str, value: str, checkpoint: Checkpoint, now: float
    ) -> int:
        """Publish `value` (JSON) as the next version of (lease.run_id, key) (1 for its first)
        and write `checkpoint` with the result {"key": key, "version": n} in the same
        transaction; returns n. Raises LeaseLost if the lease is not held (nothing written)."""

    async def get_value(self, run_id: str, key: str) -> ValueRecord | None:
        """The latest (highest) version of the run's value `key`, or None."""

    async def list_values(self, run_id: str) -> list[ValueRecord]:
        """The latest version of each of the run's values, by key."""

    async def fork_run(
        self,
        run: NewRun,
        link: ForkRecord,
        checkpoints: Sequence[Checkpoint],
        events: Sequence[tuple[str, str]],
        now: float,
    ) -> tuple[RunRecord, bool]:
        """Create run `run` as a fork of link.source_run_id, unless its id exists (then write
        nothing and return (that run, False)). In one transaction: the run, pending (as
        create_run without owner); `checkpoints` as its history; the source's value versions
        set at the positions of those checkpoints; the source's mailbox events whose key does
        not start with "tether:" and which none of those checkpoints consumed (in their
        order); `events` (key, payload) appended to its mailbox after them; and the link.
        Returns (the stored run, True)."""

    async def get_fork(self, run_id: str) -> ForkRecord | None:
        """The link of a run created by fork_run, or None for any other run."""

    async def list_forks(self, source_run_id: str) -> list[ForkRecord]:
        """The links of the runs forked from this one, oldest first."""

"""The retention part of the Store port: what one purge call deleted and where the next goes
on, and the purges. It must not import tether.core or any backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

# Where a purge goes on: after this (time, id) in the order it deletes in. START is before all.
Cursor = tuple[float, str]

START: Cursor = (float("-inf"), "")


@dataclass(frozen=True, slots=True)
class Purge:
    """What one purge call deleted (or, dry, would delete): rows per table (tables with none are
    left out), and the cursor to pass to the next call (None: nothing more to do)."""

    rows: Mapping[str, int] = field(default_factory=dict)
    after: Cursor | None = None

    @property
    def total(self) -> int:
        return sum(self.rows.values())


class RetentionPort(Protocol):
    """Retention: deleting what ended long ago, in batches."""

    async def purge_runs(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        """Delete, in one transaction, about `limit` rows of runs that ended (succeeded,
        failed, cancelled, dead) before `before`, oldest first from after the cursor: each
        run's checkpoints, events, stream entries, values, fork link (the one naming it as the
        fork) and delivered or failed outbox messages, then the run row once nothing of it is
        left. A run with more rows than `limit` takes several calls; its row goes last. Kept
        whole: a run whose parent is unfinished, one with an unfinished child, and one with an
        outbox message neither delivered nor failed. Approvals are not touched (purge_approvals).
        With dry_run nothing is deleted and the counts are those of whole runs. Returns the rows
        per table and the cursor of the next call (None: nothing more ended before `before`)."""

    async def purge_streams(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        """Delete, in one transaction, up to about `limit` stream entries of runs that ended
        before `before` (the runs themselves stay), oldest run first from after the cursor;
        returns them per table and the cursor of the next call, as purge_runs does."""

    async def purge_approvals(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        """Delete, in one transaction, up to about `limit` rows of approvals whose run is gone,
        that are not pending and whose last change is older than `before`: their audit
        entries, then the approval. Ordered by last change from after the cursor; returns the
        rows per table and the cursor of the next call, as purge_runs does."""

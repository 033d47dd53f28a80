"""The order in which outcomes reach the workflow's tasks: the same on replay as the first time.

Every outcome a task awaits (a step's result or final failure, a wait's end) is ranked when it
is recorded (its finished_at, made strictly increasing within the run), and reaches its task
only once every outcome ranked before it did and no other workflow task can run (see
suspension.turn). Replay, where recorded outcomes are there at once, hands them back in the
same order at the same points, so code that depends on which branch finished first
(as_completed, FIRST_COMPLETED, a Queue fed by branches, a task cancelled on the first result)
takes the same path. This module only keeps the ranks; it does no I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from tether.clock import Clock
from tether.store.port import Checkpoint, CheckpointStatus

# The kinds of checkpoint whose outcome a task awaits (their order is observable); recorded
# helpers and markers are taken synchronously, and the others are not ordered.
TURN_KINDS = frozenset({"step", "sleep", "event", "any", "join", "approval-wait"})
_HANDED = (CheckpointStatus.COMPLETED, CheckpointStatus.FAILED)
_STEP = 1e-6  # the least distance between two ranks (seconds of finished_at)


class Turns:
    """The ranks of the outcomes not handed to their tasks yet, in this execution."""

    __slots__ = ("gated", "heap", "last", "ranked", "recorded")

    def __init__(self, history: Iterable[Checkpoint]) -> None:
        self.gated = 0  # tasks parked until their turn
        if not history:  # a new run (most): nothing recorded to hand back
            self.ranked: dict[int, float] = {}
            self.heap: list[tuple[float, int]] = []
            self.last = 0.0
            self.recorded: set[int] = set()
            return
        self.ranked = {
            c.seq: c.finished_at
            for c in history
            if c.kind in TURN_KINDS and c.status in _HANDED and c.finished_at is not None
        }
        self.heap = [(rank, seq) for seq, rank in self.ranked.items()]
        heapq.heapify(self.heap)
        self.last = max(self.ranked.values(), default=0.0)
        # Recorded outcomes not handed back yet: until then the replay is not over (nothing
        # new happens: a new wait would read a mailbox the first execution saw earlier).
        self.recorded = set(self.ranked)

    def stamp(self, c: Checkpoint, clock: Clock, alone: bool) -> Checkpoint:
        """`c` as it is written: an outcome a task awaits is ranked after every outcome before
        it (a clock that went back, or another worker's, changes nothing). `alone`: the
        workflow has no task but the one awaiting it, which takes it at once (not kept)."""
        if c.kind not in TURN_KINDS or c.status not in _HANDED:
            return c
        rank = c.finished_at
        fits = rank is not None and rank > self.last  # the common case: kept as it is
        if not fits:
            rank = max(clock.now(), self.last + _STEP)
        assert rank is not None
        self.last = rank
        if not alone:
            self.ranked[c.seq] = rank
            heapq.heappush(self.heap, (rank, c.seq))
        if fits:
            return c
        # Built field by field: dataclasses.replace costs several times more on this path.
        return Checkpoint(c.seq, c.name, c.kind, c.status, c.result, c.error, c.attempts,
                          c.started_at, rank, c.retry_at, c.position, c.args)  # fmt: skip

    def first(self) -> int | None:
        """The seq of the outcome whose turn it is (None: none is waiting to be handed)."""
        heap, ranked = self.heap, self.ranked
        while heap:
            rank, seq = heap[0]
            if ranked.get(seq) == rank:
                return seq
            heapq.heappop(heap)
        return None

    def handed(self, seq: int) -> None:
        """The outcome at `seq` reached its task (or never will: its write failed)."""
        self.ranked.pop(seq, None)
        self.recorded.discard(seq)


__all__ = ["TURN_KINDS", "Turns"]

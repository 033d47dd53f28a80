"""A checkpoint workflow code asks for (a Slot: where it sits, its name, what the history holds
there) and what it keeps of the call's arguments, compared on replay. Plain values: it does no
I/O and knows nothing of executions.
"""

from __future__ import annotations

import hashlib
from typing import Any

from tether.serde import canonical, plain_canonical
from tether.store.port import Checkpoint, CheckpointStatus

ARGS_KEPT = 2048  # the longest arguments a checkpoint keeps as text; longer: their digest


def arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """What a checkpoint keeps of a call's arguments, compared on replay: their canonical JSON
    {"args": [...], "kwargs": {...}}, or {"$digest": its sha256} when that is longer than
    ARGS_KEPT; None for arguments that are not JSON (not compared). The text of a given value
    must never change from one version to the next: recorded arguments must keep matching."""
    call = {"args": args, "kwargs": kwargs}
    try:
        text = plain_canonical(call)  # plain JSON values (most calls): the C encoder alone
    except (TypeError, ValueError):
        try:
            text = canonical(call)  # tagged values (datetimes, sets, models...): serde's
        except Exception:  # an object the serializer does not know: not compared
            return None
    if len(text) <= ARGS_KEPT:
        return text
    return plain_canonical({"$digest": hashlib.sha256(text.encode()).hexdigest()})


class Slot:
    """A checkpoint the code asked for: where it sits, its name, and what the history holds
    there (None: it is new). Made for every checkpoint asked for: a plain class, not a
    dataclass, for speed."""

    __slots__ = ("args", "kind", "name", "position", "recorded", "seq")

    def __init__(
        self,
        seq: int,
        position: str,
        name: str,
        kind: str,
        recorded: Checkpoint | None,
        args: str | None = None,
    ) -> None:
        self.seq, self.position, self.name, self.kind = seq, position, name, kind
        self.recorded, self.args = recorded, args

    def checkpoint(
        self,
        status: CheckpointStatus,
        *,
        result: str | None = None,
        error: str | None = None,
        attempts: int = 0,
        started_at: float | None = None,
        finished_at: float | None = None,
        retry_at: float | None = None,
    ) -> Checkpoint:
        """This slot's checkpoint in `status`."""
        return Checkpoint(self.seq, self.name, self.kind, status, result, error, attempts,
                          started_at, finished_at, retry_at, self.position, self.args)  # fmt: skip


__all__ = ["ARGS_KEPT", "Slot", "arguments"]

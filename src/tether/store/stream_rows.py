"""The Store port's records of streams: append-only, offset-addressed logs of a run's chunks,
and the retraction markers (resets) that undo a failed attempt's chunks. Plain data, no I/O.

It must not import tether.store.base (which builds on it), tether.core or any backend.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class StreamKind(StrEnum):
    CHUNK = "chunk"  # data: the JSON of one value a run wrote
    RESET = "reset"  # data: a JSON list of the offsets of chunks it retracts


@dataclass(frozen=True, slots=True)
class StreamAppend:
    """An entry to append to a stream; the store gives it its offset."""

    kind: StreamKind
    data: str
    writer: str  # the checkpoint name of the step (or workflow write) that wrote it
    attempt: int = 0  # the step attempt that wrote it (0: workflow code)
    ref: str | None = None  # dedupe reference: an entry whose ref the stream holds is skipped


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """An entry of a stream, as stored: append-only, addressed by its offset."""

    offset: int
    kind: StreamKind
    data: str
    writer: str
    attempt: int
    ref: str | None
    created_at: float


def unretracted(entries: Sequence[StreamEntry]) -> list[int]:
    """The offsets of the chunks among `entries` that no reset among them names, in order."""
    retracted: set[int] = set()
    for entry in entries:
        if entry.kind is StreamKind.RESET:
            retracted.update(json.loads(entry.data))
    return [e.offset for e in entries if e.kind is StreamKind.CHUNK and e.offset not in retracted]

"""The streams part of the Store port: entries of a run's append-only, offset-addressed logs
(chunks and reset markers) and the operations on them. It must not import tether.core or any
backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from tether.store.port.runs import Lease


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


class StreamsPort(Protocol):
    """Streams: append-only, offset-addressed logs of a run's chunks."""

    async def append_stream(
        self, lease: Lease, key: str, entries: Sequence[StreamAppend], now: float
    ) -> list[int]:
        """Append `entries`, in order, to the stream (lease.run_id, key) and return their
        offsets: contiguous from the stream's end (its first entry is offset 0), never handed
        out twice, even to concurrent appenders in other processes. An entry whose ref the
        stream already holds (from an earlier append, or earlier in this one) is not written:
        its offset is the one stored under that ref. Raises LeaseLost if the lease is not held
        (nothing is written)."""

    async def read_stream(
        self, run_id: str, key: str, offset: int, limit: int
    ) -> list[StreamEntry]:
        """Up to `limit` entries of the stream from `offset` on, by offset (empty for a stream
        or run that does not exist)."""

    async def stream_unretracted(self, run_id: str, key: str, writer: str) -> list[int]:
        """The offsets of the chunks that `writer` appended to the stream and that no reset
        names, in order (`unretracted` of the writer's entries)."""

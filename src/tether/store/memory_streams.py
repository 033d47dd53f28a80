"""The stream operations of the in-memory backend, mixed into MemoryStore: each runs whole
under the store's lock, giving the answers the SQL backends give. It must not import
tether.core.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from tether.store.base import Lease, RunRecord
from tether.store.rules import stream_lease_lost
from tether.store.stream_rows import StreamAppend, StreamEntry, unretracted


class MemoryStreams:
    _lock: threading.Lock
    _streams: dict[tuple[str, str], list[StreamEntry]]  # by (run id, key); index = offset
    _stream_refs: dict[tuple[str, str], dict[str, int]]  # the offset stored under each ref

    def _held(self, lease: Lease) -> RunRecord | None:
        raise NotImplementedError  # MemoryStore's

    async def append_stream(
        self, lease: Lease, key: str, entries: Sequence[StreamAppend], now: float
    ) -> list[int]:
        with self._lock:
            if self._held(lease) is None:
                raise stream_lease_lost(lease, key)
            stream = self._streams.setdefault((lease.run_id, key), [])
            refs = self._stream_refs.setdefault((lease.run_id, key), {})
            offsets: list[int] = []
            for new in entries:
                if new.ref is not None and new.ref in refs:
                    offsets.append(refs[new.ref])
                    continue
                entry = StreamEntry(offset=len(stream), kind=new.kind, data=new.data,
                                    writer=new.writer, attempt=new.attempt, ref=new.ref,
                                    created_at=now)  # fmt: skip
                stream.append(entry)
                if new.ref is not None:
                    refs[new.ref] = entry.offset
                offsets.append(entry.offset)
            return offsets

    async def read_stream(
        self, run_id: str, key: str, offset: int, limit: int
    ) -> list[StreamEntry]:
        with self._lock:
            stream = self._streams.get((run_id, key), [])
            return stream[max(offset, 0) : max(offset, 0) + max(limit, 0)]

    async def stream_unretracted(self, run_id: str, key: str, writer: str) -> list[int]:
        with self._lock:
            stream = self._streams.get((run_id, key), [])
            return unretracted([e for e in stream if e.writer == writer])

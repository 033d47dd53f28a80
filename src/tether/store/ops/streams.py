"""The operations on streams: append a run's chunks under its lease (offsets handed out once,
a ref stored once), read from an offset, and a writer's chunks that no reset retracts.

Written once for both SQL dialects: appenders of one stream take turns on its lock_stream row
(PostgreSQL) or the write lock (SQLite). It must not touch a connection or a driver.
"""

from __future__ import annotations

from collections.abc import Sequence

from tether.store.ops.common import fence
from tether.store.port import Lease
from tether.store.port.streams import StreamAppend, StreamEntry
from tether.store.query import Op, Query, one, select
from tether.store.rows import stream_entry_from_row
from tether.store.rules import stream_lease_lost, unretracted


def append_stream(
    lease: Lease, key: str, entries: Sequence[StreamAppend], now: float
) -> Op[list[int]]:
    where = {"run_id": lease.run_id, "key": key}
    if (yield from one("lease_held", **fence(lease))) is None:
        raise stream_lease_lost(lease, key)
    row = yield from one("lock_stream", **where)
    assert row is not None
    end = int(row[0])
    wanted = sorted({e.ref for e in entries if e.ref is not None})
    refs: dict[str, int] = {}
    if wanted:
        found = yield from select("stream_refs", **where, refs=wanted)
        refs = {r[0]: int(r[1]) for r in found}
    offsets: list[int] = []
    rows: list[tuple[object, ...]] = []
    for e in entries:
        if e.ref is not None and e.ref in refs:
            offsets.append(refs[e.ref])
            continue
        if e.ref is not None:
            refs[e.ref] = end
        rows.append((lease.run_id, key, end, e.kind.value, e.data, e.writer, e.attempt, e.ref,
                     now))  # fmt: skip
        offsets.append(end)
        end += 1
    if rows:
        yield Query("insert_stream_entries", rows, many=True)
        yield Query("set_stream_next", {**where, "next": end})
    return offsets


def read_stream(run_id: str, key: str, offset: int, limit: int) -> Op[list[StreamEntry]]:
    rows = yield from select("read_stream", run_id=run_id, key=key, offset=max(offset, 0),
                             limit=max(limit, 0))  # fmt: skip
    return [stream_entry_from_row(r) for r in rows]


def stream_unretracted(run_id: str, key: str, writer: str) -> Op[list[int]]:
    rows = yield from select("stream_writer_entries", run_id=run_id, key=key, writer=writer)
    return unretracted([stream_entry_from_row(r) for r in rows])

"""The stream operations of the SQLite backend, mixed into SqliteStore: one transaction each,
SQL in sql/sqlite/queries.sql. It must not import tether.core.

An append is a write transaction (BEGIN IMMEDIATE, or a share of a group commit): SQLite has
one writer at a time across processes, so the stream's end read inside it is still its end
when the rows are inserted, and offsets are never handed out twice.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tether.store.base import Lease
from tether.store.rows import load_sql, stream_entry_from_row
from tether.store.rules import stream_lease_lost
from tether.store.stream_rows import StreamAppend, StreamEntry, unretracted

if TYPE_CHECKING:
    from tether.store.sqlite_commit import CommitQueue

_Q, _ = load_sql("sqlite")


class SqliteStreams:
    _db: CommitQueue

    async def append_stream(
        self, lease: Lease, key: str, entries: Sequence[StreamAppend], now: float
    ) -> list[int]:
        fence = {"run_id": lease.run_id, "worker": lease.worker_id, "epoch": lease.epoch}
        where = {"run_id": lease.run_id, "key": key}

        def op(c: sqlite3.Connection) -> list[int]:
            if c.execute(_Q["lease_held"], fence).fetchone() is None:
                raise stream_lease_lost(lease, key)
            end = int(c.execute(_Q["stream_next_offset"], where).fetchone()[0])
            offsets: list[int] = []
            rows: list[tuple[object, ...]] = []
            refs: dict[str, int] = {}
            for e in entries:
                if e.ref is not None:
                    found = refs.get(e.ref)
                    if found is None:
                        row = c.execute(_Q["stream_ref"], {**where, "ref": e.ref}).fetchone()
                        found = None if row is None else int(row[0])
                    if found is not None:
                        offsets.append(found)
                        continue
                    refs[e.ref] = end
                rows.append((lease.run_id, key, end, e.kind.value, e.data, e.writer, e.attempt,
                             e.ref, now))  # fmt: skip
                offsets.append(end)
                end += 1
            c.executemany(_Q["insert_stream_entry"], rows)
            return offsets

        label = f"append_stream:{key}"
        return await self._db.submit(op, write=True, label=label, multi=True)

    async def read_stream(
        self, run_id: str, key: str, offset: int, limit: int
    ) -> list[StreamEntry]:
        args = {"run_id": run_id, "key": key, "offset": max(offset, 0), "limit": max(limit, 0)}

        def op(c: sqlite3.Connection) -> list[StreamEntry]:
            return [stream_entry_from_row(r) for r in c.execute(_Q["read_stream"], args)]

        return await self._db.submit(op, write=False)

    async def stream_unretracted(self, run_id: str, key: str, writer: str) -> list[int]:
        args = {"run_id": run_id, "key": key, "writer": writer}

        def op(c: sqlite3.Connection) -> list[int]:
            rows = c.execute(_Q["stream_writer_entries"], args)
            return unretracted([stream_entry_from_row(r) for r in rows])

        return await self._db.submit(op, write=False)

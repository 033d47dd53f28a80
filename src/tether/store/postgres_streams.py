"""The stream operations of the PostgreSQL backend, mixed into PostgresStore: one transaction
each, SQL in sql/postgres/queries.sql. It must not import tether.core.

An append first locks its stream's counter row (tether_streams, created on first use by an
upsert), so appenders of one stream in any number of processes take turns: each reads the next
offset, inserts its entries in one statement and moves the counter, then commits and lets the
next one in. Refs are looked up under the same lock, so a re-append never writes twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from tether.store.base import Lease
from tether.store.rows import load_sql, stream_entry_from_row
from tether.store.rules import stream_lease_lost
from tether.store.stream_rows import StreamAppend, StreamEntry, unretracted

_Q, _ = load_sql("postgres")
T = TypeVar("T")


class PostgresStreams:
    async def _tx(self, fn: Callable[[Any], Awaitable[T]], *, write: bool, label: str = "") -> T:
        raise NotImplementedError  # PostgresStore's

    async def _rows(self, query: str, args: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError  # PostgresStore's

    async def append_stream(
        self, lease: Lease, key: str, entries: Sequence[StreamAppend], now: float
    ) -> list[int]:
        fence = {"run_id": lease.run_id, "worker": lease.worker_id, "epoch": lease.epoch}
        where = {"run_id": lease.run_id, "key": key}
        wanted = sorted({e.ref for e in entries if e.ref is not None})

        async def op(c: Any) -> list[int]:
            if await (await c.execute(_Q["lease_held"], fence)).fetchone() is None:
                raise stream_lease_lost(lease, key)
            end = int((await (await c.execute(_Q["lock_stream"], where)).fetchone())[0])
            refs: dict[str, int] = {}
            if wanted:
                cur = await c.execute(_Q["stream_refs"], {**where, "refs": wanted})
                refs = {r[0]: int(r[1]) for r in await cur.fetchall()}
            offsets: list[int] = []
            new: list[tuple[int, StreamAppend]] = []
            for e in entries:
                if e.ref is not None and e.ref in refs:
                    offsets.append(refs[e.ref])
                    continue
                if e.ref is not None:
                    refs[e.ref] = end
                new.append((end, e))
                offsets.append(end)
                end += 1
            if new:
                await c.execute(_Q["insert_stream_entries"], {
                    **where, "now": now, "offsets": [o for o, _ in new],
                    "kinds": [e.kind.value for _, e in new], "datas": [e.data for _, e in new],
                    "writers": [e.writer for _, e in new],
                    "attempts": [e.attempt for _, e in new], "refs": [e.ref for _, e in new],
                })  # fmt: skip
                await c.execute(_Q["set_stream_next"], {**where, "next": end})
            return offsets

        return await self._tx(op, write=True, label=f"append_stream:{key}")

    async def read_stream(
        self, run_id: str, key: str, offset: int, limit: int
    ) -> list[StreamEntry]:
        args = {"run_id": run_id, "key": key, "offset": max(offset, 0), "limit": max(limit, 0)}
        return [stream_entry_from_row(r) for r in await self._rows(_Q["read_stream"], args)]

    async def stream_unretracted(self, run_id: str, key: str, writer: str) -> list[int]:
        args = {"run_id": run_id, "key": key, "writer": writer}
        rows = await self._rows(_Q["stream_writer_entries"], args)
        return unretracted([stream_entry_from_row(r) for r in rows])

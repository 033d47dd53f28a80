"""The values a run publishes for callers, and forks (a new run from another's history): the
operations of the Postgres backend, mixed into PostgresStore.

Each operation is one transaction; set_value locks its run's row first, so versions of a key
are numbered without gaps or repeats. SQL in sql/postgres/values.sql. It must not import
tether.core.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from tether.store.base import Checkpoint, Lease, NewRun, RunRecord
from tether.store.rows import checkpoint_params, load_sql, run_from_row
from tether.store.value_rows import (
    ForkRecord,
    ValueRecord,
    fork_from_row,
    value_from_row,
    value_lease_lost,
)

_Q, _ = load_sql("postgres")
T = TypeVar("T")


class PostgresValues:
    """Mixed into PostgresStore."""

    async def _tx(self, fn: Callable[[Any], Awaitable[T]], *, write: bool, label: str = "") -> T:
        raise NotImplementedError  # PostgresStore's

    async def _rows(self, query: str, args: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError  # PostgresStore's

    async def set_value(
        self, lease: Lease, key: str, value: str, checkpoint: Checkpoint, now: float
    ) -> int:
        fence = {"run_id": lease.run_id, "worker": lease.worker_id, "epoch": lease.epoch}
        where = {"run_id": lease.run_id, "key": key}

        async def op(c: Any) -> int:
            if await (await c.execute(_Q["value_lease_held"], fence)).fetchone() is None:
                raise value_lease_lost(lease.run_id, lease.worker_id, lease.epoch, key)
            row = await (await c.execute(_Q["next_value_version"], where)).fetchone()
            version = int(row[0])
            await c.execute(_Q["insert_value"], {**where, "version": version, "value": value,
                                                 "seq": checkpoint.seq, "now": now})  # fmt: skip
            result = json.dumps({"key": key, "version": version})
            await c.execute(
                _Q["put_checkpoint"],
                checkpoint_params(lease.run_id, checkpoint, result, lease.worker_id, lease.epoch),
            )
            return version

        return await self._tx(op, write=True, label=f"set_value:{key}")

    async def get_value(self, run_id: str, key: str) -> ValueRecord | None:
        rows = await self._rows(_Q["latest_value"], {"run_id": run_id, "key": key})
        return value_from_row(rows[0]) if rows else None

    async def list_values(self, run_id: str) -> list[ValueRecord]:
        return [value_from_row(r) for r in await self._rows(_Q["latest_values"],
                                                             {"run_id": run_id})]  # fmt: skip

    async def fork_run(
        self,
        run: NewRun,
        link: ForkRecord,
        checkpoints: Sequence[Checkpoint],
        events: Sequence[tuple[str, str]],
        now: float,
    ) -> tuple[RunRecord, bool]:
        source = link.source_run_id
        insert = {"id": run.id, "workflow": run.workflow, "args": run.args, "now": now,
                  "deadline_at": run.deadline_at, "parent_id": run.parent_id,
                  "queue": run.queue, "priority": run.priority,
                  "started_by": run.started_by}  # fmt: skip
        copy = {"run_id": run.id, "source": source, "seqs": [c.seq for c in checkpoints],
                "names": [c.name for c in checkpoints]}  # fmt: skip

        async def op(c: Any) -> tuple[RunRecord, bool]:
            created = (await c.execute(_Q["fork_insert_run"], insert)).rowcount == 1
            if created:
                if checkpoints:
                    rows = [checkpoint_params(run.id, cp, cp.result, None, None)
                            for cp in checkpoints]  # fmt: skip
                    async with c.cursor() as cur:
                        await cur.executemany(_Q["put_checkpoint"], rows)
                await c.execute(_Q["fork_values"], copy)
                await c.execute(_Q["fork_events"], copy)
                for key, payload in events:
                    await c.execute(_Q["fork_event"], {"run_id": run.id, "key": key,
                                                       "payload": payload, "now": now})  # fmt: skip
                await c.execute(_Q["insert_fork"], {"run_id": run.id, "source_run_id": source,
                                                    "from_step": link.from_step,
                                                    "from_seq": link.from_seq,
                                                    "created_at": link.created_at})  # fmt: skip
                # postgres.CHANNEL: idle workers look for the new pending run.
                await c.execute("NOTIFY tether")
            row = await (await c.execute(_Q["get_run"], {"id": run.id})).fetchone()
            return run_from_row(row), created

        return await self._tx(op, write=True, label=f"fork_run:{run.id}")

    async def get_fork(self, run_id: str) -> ForkRecord | None:
        rows = await self._rows(_Q["get_fork"], {"run_id": run_id})
        return fork_from_row(rows[0]) if rows else None

    async def list_forks(self, source_run_id: str) -> list[ForkRecord]:
        return [fork_from_row(r) for r in await self._rows(_Q["list_forks"],
                                                            {"source": source_run_id})]  # fmt: skip

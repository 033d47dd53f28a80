"""The values a run publishes for callers, and forks (a new run from another's history): the
operations of the Sqlite backend, mixed into SqliteStore.

Each operation is one function of a connection committed by the group commit; the writes are
multi-statement, so they run whole in BEGIN IMMEDIATE (or a savepoint of a shared batch).
SQL in sql/sqlite/values.sql. It must not import tether.core.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tether.store.base import Checkpoint, Lease, NewRun, RunRecord
from tether.store.rows import checkpoint_params, load_sql, run_from_row
from tether.store.value_rows import (
    ForkRecord,
    ValueRecord,
    fork_from_row,
    value_from_row,
    value_lease_lost,
)

if TYPE_CHECKING:
    from tether.store.sqlite_commit import CommitQueue

_Q, _ = load_sql("sqlite")


class SqliteValues:
    """Mixed into SqliteStore."""

    _db: CommitQueue

    async def set_value(
        self, lease: Lease, key: str, value: str, checkpoint: Checkpoint, now: float
    ) -> int:
        fence = {"run_id": lease.run_id, "worker": lease.worker_id, "epoch": lease.epoch}
        where = {"run_id": lease.run_id, "key": key}

        def op(c: sqlite3.Connection) -> int:
            if c.execute(_Q["value_lease_held"], fence).fetchone() is None:
                raise value_lease_lost(lease.run_id, lease.worker_id, lease.epoch, key)
            version = int(c.execute(_Q["next_value_version"], where).fetchone()[0])
            c.execute(_Q["insert_value"], {**where, "version": version, "value": value,
                                           "seq": checkpoint.seq, "now": now})  # fmt: skip
            result = json.dumps({"key": key, "version": version})
            c.execute(
                _Q["put_checkpoint"],
                checkpoint_params(lease.run_id, checkpoint, result, lease.worker_id, lease.epoch),
            )
            return version

        return await self._db.submit(op, write=True, label=f"set_value:{key}", multi=True)

    async def get_value(self, run_id: str, key: str) -> ValueRecord | None:
        args = {"run_id": run_id, "key": key}

        def op(c: sqlite3.Connection) -> ValueRecord | None:
            row = c.execute(_Q["latest_value"], args).fetchone()
            return None if row is None else value_from_row(row)

        return await self._db.submit(op, write=False)

    async def list_values(self, run_id: str) -> list[ValueRecord]:
        def op(c: sqlite3.Connection) -> list[ValueRecord]:
            rows = c.execute(_Q["latest_values"], {"run_id": run_id})
            return [value_from_row(r) for r in rows]

        return await self._db.submit(op, write=False)

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
        copy = {"run_id": run.id, "source": source,
                "seqs": json.dumps([c.seq for c in checkpoints]),
                "names": json.dumps([c.name for c in checkpoints])}  # fmt: skip

        def op(c: sqlite3.Connection) -> tuple[RunRecord, bool]:
            created = c.execute(_Q["fork_insert_run"], insert).rowcount == 1
            if created:
                rows = [checkpoint_params(run.id, cp, cp.result, None, None)
                        for cp in checkpoints]  # fmt: skip
                c.executemany(_Q["put_checkpoint"], rows)
                c.execute(_Q["fork_values"], copy)
                c.execute(_Q["fork_events"], copy)
                c.executemany(_Q["fork_event"], [{"run_id": run.id, "key": k, "payload": p,
                                                  "now": now} for k, p in events])  # fmt: skip
                c.execute(_Q["insert_fork"], {"run_id": run.id, "source_run_id": source,
                                              "from_step": link.from_step,
                                              "from_seq": link.from_seq,
                                              "created_at": link.created_at})  # fmt: skip
            return run_from_row(c.execute(_Q["get_run"], {"id": run.id}).fetchone()), created

        return await self._db.submit(op, write=True, label=f"fork_run:{run.id}", multi=True)

    async def get_fork(self, run_id: str) -> ForkRecord | None:
        def op(c: sqlite3.Connection) -> ForkRecord | None:
            row = c.execute(_Q["get_fork"], {"run_id": run_id}).fetchone()
            return None if row is None else fork_from_row(row)

        return await self._db.submit(op, write=False)

    async def list_forks(self, source_run_id: str) -> list[ForkRecord]:
        def op(c: sqlite3.Connection) -> list[ForkRecord]:
            rows = c.execute(_Q["list_forks"], {"source": source_run_id})
            return [fork_from_row(r) for r in rows]

        return await self._db.submit(op, write=False)

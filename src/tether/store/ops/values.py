"""The operations on values a run publishes and on forks (a new run from another's history).

Written once for both SQL dialects; set_value locks its run's row first (PostgreSQL), so the
versions of a key are numbered without gaps or repeats. It must not touch a connection.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from tether.store.ops.common import NOTIFY, fence
from tether.store.port import Checkpoint, Lease, NewRun, RunRecord
from tether.store.port.values import ForkRecord, ValueRecord
from tether.store.query import Op, Query, execute_many, one, select
from tether.store.rows import checkpoint_params, fork_from_row, run_from_row, value_from_row
from tether.store.rules import value_lease_lost


def set_value(lease: Lease, key: str, value: str, checkpoint: Checkpoint, now: float) -> Op[int]:
    where = {"run_id": lease.run_id, "key": key}
    if (yield from one("value_lease_held", **fence(lease))) is None:
        raise value_lease_lost(lease.run_id, lease.worker_id, lease.epoch, key)
    row = yield from one("next_value_version", **where)
    assert row is not None
    version = int(row[0])
    yield Query("insert_value", {**where, "version": version, "value": value,
                                 "seq": checkpoint.seq, "now": now})  # fmt: skip
    result = json.dumps({"key": key, "version": version})
    yield Query("put_checkpoint", checkpoint_params(lease.run_id, checkpoint, result,
                                                    lease.worker_id, lease.epoch))  # fmt: skip
    return version


def get_value(run_id: str, key: str) -> Op[ValueRecord | None]:
    row = yield from one("latest_value", run_id=run_id, key=key)
    return None if row is None else value_from_row(row)


def list_values(run_id: str) -> Op[list[ValueRecord]]:
    return [value_from_row(r) for r in (yield from select("latest_values", run_id=run_id))]


def fork_run(
    run: NewRun,
    link: ForkRecord,
    checkpoints: Sequence[Checkpoint],
    events: Sequence[tuple[str, str]],
    now: float,
) -> Op[tuple[RunRecord, bool]]:
    insert = {"id": run.id, "workflow": run.workflow, "args": run.args, "now": now,
              "deadline_at": run.deadline_at, "parent_id": run.parent_id, "queue": run.queue,
              "priority": run.priority, "started_by": run.started_by}  # fmt: skip
    created = (yield Query("fork_insert_run", insert)) == 1
    if created:
        yield from execute_many(
            "put_checkpoint",
            [checkpoint_params(run.id, cp, cp.result, None, None) for cp in checkpoints],
        )
        copy = {
            "run_id": run.id,
            "source": link.source_run_id,
            "seqs": [c.seq for c in checkpoints],
            "names": [c.name for c in checkpoints],
        }
        yield Query("fork_values", copy)
        yield Query("fork_events", copy)
        yield from execute_many("fork_event", [{"run_id": run.id, "key": k, "payload": p,
                                                "now": now} for k, p in events])  # fmt: skip
        yield Query("insert_fork", {"run_id": run.id, "source_run_id": link.source_run_id,
                                    "from_step": link.from_step, "from_seq": link.from_seq,
                                    "created_at": link.created_at})  # fmt: skip
        yield NOTIFY  # idle workers look for the new pending run
    row = yield from one("get_run", id=run.id)
    assert row is not None
    return run_from_row(row), created


def get_fork(run_id: str) -> Op[ForkRecord | None]:
    row = yield from one("get_fork", run_id=run_id)
    return None if row is None else fork_from_row(row)


def list_forks(source_run_id: str) -> Op[list[ForkRecord]]:
    return [fork_from_row(r) for r in (yield from select("list_forks", source=source_run_id))]

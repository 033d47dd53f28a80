"""What the SQL backends share: loading their named queries and migrations from sql/<dialect>/,
and turning rows into the port's records (and audit entries into rows).

It knows the column order of the run, checkpoint, worker, approval, audit and stream queries,
nothing of any database driver.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

from tether.store.approval_rows import APPROVAL_COLUMNS, AUDIT_COLUMNS, AuditEntry
from tether.store.base import Checkpoint, CheckpointStatus, RunRecord, RunStatus, WorkerInfo
from tether.store.stream_rows import StreamEntry, StreamKind

# A checkpoint's columns as load_history selects them (checkpoint_from_row reads this order);
# a position NULL is that of a row recorded before positions: its seq.
CHECKPOINT_COLUMNS = (
    "seq, name, kind, status, result, error, attempts, started_at, finished_at, retry_at,"
    " coalesce(position, CAST(seq AS TEXT)), args"
)
# The parameters of a checkpoint's upsert, in the order of its positional form (?1..?15).
CHECKPOINT_PARAMS = (
    "run_id", "seq", "name", "kind", "status", "result", "error", "attempts", "started_at",
    "finished_at", "retry_at", "worker", "epoch", "position", "args",
)  # fmt: skip

RUN_COLUMNS = (
    "id, workflow, status, args, result, error, owner, epoch, lease_expires_at, wake_at,"
    " deadline_at, cancel_requested, created_at, updated_at, finished_at, parent_id, wake_on,"
    " queue, priority, dedup_key, started_at, started_by, failures"
)


def load_sql(dialect: str) -> tuple[dict[str, str], list[tuple[int, str]]]:
    """(named queries, [(version, migration script)] in order) of sql/<dialect>/."""
    folder = resources.files("tether.store") / "sql" / dialect
    queries: dict[str, str] = {}
    # queries.sql, and one file of queries per concept added since (outbox.sql, ...).
    files = [f for f in folder.iterdir() if f.name.endswith(".sql") and not f.name[:4].isdigit()]
    for file in sorted(files, key=lambda f: f.name):
        name = None
        for line in file.read_text().splitlines():
            if line.startswith("-- name:"):
                name = line.split(":", 1)[1].strip()
                if name in queries:
                    raise ValueError(f"two queries are named {name!r} in sql/{dialect}/")
                queries[name] = ""
            elif name is not None and not line.startswith("--"):
                queries[name] += line + "\n"
    columns = {"run_columns": RUN_COLUMNS, "approval_columns": APPROVAL_COLUMNS,
               "audit_columns": AUDIT_COLUMNS,
               "checkpoint_columns": CHECKPOINT_COLUMNS}  # fmt: skip
    queries = {k: v.strip().format(**columns) for k, v in queries.items()}
    migrations = sorted(
        (int(f.name.split("_", 1)[0]), f.read_text())
        for f in folder.iterdir()
        if f.name[:4].isdigit() and f.name.endswith(".sql")
    )
    return queries, migrations


def run_from_row(row: Sequence[Any]) -> RunRecord:
    return RunRecord(
        id=row[0], workflow=row[1], status=RunStatus(row[2]), args=row[3], result=row[4],
        error=row[5], owner=row[6], epoch=row[7], lease_expires_at=row[8], wake_at=row[9],
        deadline_at=row[10], cancel_requested=bool(row[11]), created_at=row[12],
        updated_at=row[13], finished_at=row[14], parent_id=row[15],
        wake_on=tuple(json.loads(row[16])) if row[16] else (), queue=row[17], priority=row[18],
        dedup_key=row[19], started_at=row[20], started_by=row[21], failures=row[22],
    )  # fmt: skip


def worker_from_row(row: Sequence[Any]) -> WorkerInfo:
    """A worker from the columns of the list_workers query."""
    workflows = None if row[6] is None else tuple(json.loads(row[6]))
    return WorkerInfo(row[0], row[1], row[2], row[3], row[4], row[5], workflows,
                      row[7] or "", row[8] or "")  # fmt: skip


def worker_params(worker: WorkerInfo, now: float) -> dict[str, Any]:
    """The parameters of the upsert_worker query; its workflows a JSON list (NULL: unknown)."""
    workflows = None if worker.workflows is None else json.dumps(sorted(worker.workflows))
    return {"id": worker.id, "host": worker.host, "pid": worker.pid,
            "pid_token": worker.pid_token, "now": now, "workflows": workflows,
            "boot_id": worker.boot_id or None, "pid_ns": worker.pid_ns or None}  # fmt: skip


def page_params(before: tuple[float, str] | None) -> dict[str, Any]:
    """The keyset parameters of list_runs: the page starts after (created_at, id)."""
    return {"before_at": None if before is None else before[0],
            "before_id": None if before is None else before[1]}  # fmt: skip


def checkpoint_from_row(row: Sequence[Any]) -> Checkpoint:
    return Checkpoint(
        seq=row[0], name=row[1], kind=row[2], status=CheckpointStatus(row[3]), result=row[4],
        error=row[5], attempts=row[6], started_at=row[7], finished_at=row[8], retry_at=row[9],
        position=row[10], args=row[11],
    )  # fmt: skip


def checkpoint_values(
    run_id: str, cp: Checkpoint, result: str | None, owner: str | None, epoch: int | None
) -> tuple[Any, ...]:
    """The values of a checkpoint's upsert in CHECKPOINT_PARAMS order, `result` in place of
    the checkpoint's own (a store fills it in), fenced by (owner, epoch)."""
    return (run_id, cp.seq, cp.name, cp.kind, cp.status.value, result, cp.error, cp.attempts,
            cp.started_at, cp.finished_at, cp.retry_at, owner, epoch, cp.at, cp.args)  # fmt: skip


def checkpoint_params(
    run_id: str, cp: Checkpoint, result: str | None, owner: str | None, epoch: int | None
) -> dict[str, Any]:
    """checkpoint_values by name, for the named forms of the upsert."""
    return dict(zip(CHECKPOINT_PARAMS, checkpoint_values(run_id, cp, result, owner, epoch),
                    strict=True))  # fmt: skip


def audit_to_row(entry: AuditEntry) -> dict[str, Any]:
    """Parameters of an insert_audit query (named like AUDIT_COLUMNS)."""
    return {f: getattr(entry, f) for f in AuditEntry.__dataclass_fields__}


_KINDS = {kind.value: kind for kind in StreamKind}


def stream_entry_from_row(row: Sequence[Any]) -> StreamEntry:
    """A stream entry from the columns of the read_stream query (a reader's hot path: by
    position, the kind looked up rather than parsed)."""
    return StreamEntry(row[0], _KINDS[row[1]], row[2], row[3], row[4], row[5], row[6])

"""How the port's records map to rows: the column lists the queries of both dialects select by
name, and each record from its row (and to its query parameters). It knows no database driver.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import orjson

from tether.store.port.approvals import (
    ApprovalRecord,
    AuditEntry,
)
from tether.store.port.outbox import (
    NewOutboxMessage,
    OutboxMessage,
    OutboxSettlement,
    OutboxStatus,
)
from tether.store.port.runs import (
    Checkpoint,
    CheckpointStatus,
    RunRecord,
    RunStatus,
    WorkerInfo,
)
from tether.store.port.schedules import ScheduleRecord, ScheduleSpec
from tether.store.port.streams import StreamEntry, StreamKind
from tether.store.port.users import UserRecord
from tether.store.port.values import ForkRecord, ValueRecord

# The columns the SQL backends keep outside the JSON body (queried or updated on their own).
_COLUMNS = ("id", "run_id", "step", "status", "created_at", "expires_at", "updated_at",
            "audit_count", "audit_head")  # fmt: skip


def approval_to_row(record: ApprovalRecord) -> dict[str, Any]:
    """Column values for a SQL row: the queried columns, and `body` (JSON of the rest)."""
    data = {f: getattr(record, f) for f in ApprovalRecord.__dataclass_fields__}
    row = {c: data.pop(c) for c in _COLUMNS}
    row["body"] = json.dumps(data, sort_keys=True)
    return row


def approval_from_row(row: Sequence[Any]) -> ApprovalRecord:
    """The record from a row selected as APPROVAL_COLUMNS."""
    values = dict(zip((*_COLUMNS, "body"), row, strict=True))
    body = json.loads(values.pop("body"))
    return ApprovalRecord(**values, **body)


APPROVAL_COLUMNS = ", ".join((*_COLUMNS, "body"))

AUDIT_COLUMNS = "approval_id, seq, at, event, actor, detail, prev_hash, hash"


def audit_from_row(row: Sequence[Any]) -> AuditEntry:
    return AuditEntry(*row)


def message_rows(
    run_id: str, checkpoint: str, messages: Sequence[NewOutboxMessage], now: float
) -> list[dict[str, Any]]:
    """Parameters of the outbox_insert query for messages recorded with this checkpoint."""
    return [
        {"id": m.id, "run_id": run_id, "checkpoint": checkpoint, "destination": m.destination,
         "key": m.key, "payload": m.payload, "now": now}
        for m in messages
    ]  # fmt: skip


def settle_args(
    message_id: str, claim: int, settlement: OutboxSettlement, now: float
) -> dict[str, Any]:
    """Parameters of the outbox_settle query."""
    delivered = settlement.status is OutboxStatus.DELIVERED
    return {"id": message_id, "claim": claim, "status": settlement.status.value,
            "next_at": settlement.next_at, "error": settlement.error,
            "delivered_at": now if delivered else None, "now": now}  # fmt: skip


# The columns of the outbox queries, in the order outbox_from_row reads them.
OUTBOX_COLUMNS = (
    "id, run_id, checkpoint, destination, key, payload, status, attempts, uncertain, in_doubt,"
    " claims, claimed_by, next_at, error, created_at, updated_at, delivered_at"
)


def outbox_from_row(row: Sequence[Any]) -> OutboxMessage:
    return OutboxMessage(
        id=row[0], run_id=row[1], checkpoint=row[2], destination=row[3], key=row[4],
        payload_json=row[5], status=OutboxStatus(row[6]), attempts=int(row[7]),
        uncertain=int(row[8]), in_doubt=bool(row[9]), claim=int(row[10]), claimed_by=row[11],
        next_at=float(row[12]), error=row[13], created_at=float(row[14]),
        updated_at=float(row[15]), delivered_at=None if row[16] is None else float(row[16]),
    )  # fmt: skip


VALUE_COLUMNS = "run_id, key, version, value, seq, created_at"

FORK_COLUMNS = "run_id, source_run_id, from_step, from_seq, created_at"


def value_from_row(row: tuple[object, ...]) -> ValueRecord:
    """A value from the columns of VALUE_COLUMNS, in that order."""
    run_id, key, version, value, seq, created_at = row
    return ValueRecord(str(run_id), str(key), int(str(version)), str(value), int(str(seq)),
                       float(str(created_at)))  # fmt: skip


def fork_from_row(row: tuple[object, ...]) -> ForkRecord:
    """A fork link from the columns of FORK_COLUMNS, in that order."""
    run_id, source, step, seq, created_at = row
    return ForkRecord(str(run_id), str(source), str(step), int(str(seq)), float(str(created_at)))


def schedule_from_row(row: Sequence[Any]) -> ScheduleRecord:
    """A schedule from its columns: name, workflow, cron, tz, catch_up, last_slot, created_at,
    updated_at."""
    return ScheduleRecord(
        name=row[0], workflow=row[1], cron=row[2], tz=row[3], catch_up=row[4],
        last_slot=float(row[5]), created_at=float(row[6]), updated_at=float(row[7]),
    )  # fmt: skip


def spec_to_row(spec: ScheduleSpec, now: float) -> dict[str, Any]:
    """Parameters of the put_schedule queries: the definition, and `now` (the first cursor)."""
    return {"name": spec.name, "workflow": spec.workflow, "cron": spec.cron, "tz": spec.tz,
            "catch_up": spec.catch_up, "now": now}  # fmt: skip


USER_COLUMNS = "name, groups, token_hash, created_at, revoked_at"


def user_to_row(user: UserRecord) -> dict[str, Any]:
    return {"name": user.name, "groups": json.dumps(list(user.groups)),
            "token_hash": user.token_hash, "created_at": user.created_at,
            "revoked_at": user.revoked_at}  # fmt: skip


def user_from_row(row: Sequence[Any]) -> UserRecord:
    return UserRecord(row[0], tuple(json.loads(row[1])), row[2], row[3], row[4])


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
    " queue, priority, dedup_key, started_at, started_by, failures, version, trace_context"
)

# What the queries of both dialects select by name ({run_columns} ...).
COLUMNS = {"run_columns": RUN_COLUMNS, "approval_columns": APPROVAL_COLUMNS,
           "audit_columns": AUDIT_COLUMNS,
           "checkpoint_columns": CHECKPOINT_COLUMNS}  # fmt: skip


def run_from_row(row: Sequence[Any]) -> RunRecord:
    return RunRecord(
        id=row[0], workflow=row[1], status=RunStatus(row[2]), args=row[3], result=row[4],
        error=row[5], owner=row[6], epoch=row[7], lease_expires_at=row[8], wake_at=row[9],
        deadline_at=row[10], cancel_requested=bool(row[11]), created_at=row[12],
        updated_at=row[13], finished_at=row[14], parent_id=row[15],
        wake_on=tuple(json.loads(row[16])) if row[16] else (), queue=row[17], priority=row[18],
        dedup_key=row[19], started_at=row[20], started_by=row[21], failures=row[22],
        version=row[23], trace_context=row[24],
    )  # fmt: skip


def worker_from_row(row: Sequence[Any]) -> WorkerInfo:
    """A worker from the columns of the list_workers query."""
    workflows = None if row[6] is None else tuple(json.loads(row[6]))
    return WorkerInfo(row[0], row[1], row[2], row[3], row[4], row[5], workflows,
                      row[7] or "", row[8] or "", row[9])  # fmt: skip


def worker_params(worker: WorkerInfo, now: float) -> dict[str, Any]:
    """The parameters of the upsert_worker query; its workflows a JSON list (NULL: unknown)."""
    workflows = None if worker.workflows is None else json.dumps(sorted(worker.workflows))
    return {"id": worker.id, "host": worker.host, "pid": worker.pid,
            "pid_token": worker.pid_token, "now": now, "workflows": workflows,
            "boot_id": worker.boot_id or None, "pid_ns": worker.pid_ns or None,
            "version": worker.version}  # fmt: skip


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


# The columns of checkpoints carried by a run's end (finish_alone_carrying).
CARRIED_COLUMNS = tuple(c for c in CHECKPOINT_PARAMS if c not in ("run_id", "worker", "epoch"))


# The carried columns of double precision, and how PostgreSQL's float input spells what JSON
# has no number for (orjson would write null, storing NULL where a write stores the value).
_TIMES = ("started_at", "finished_at", "retry_at")
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def carried_rows(checkpoints: Sequence[Checkpoint]) -> str:
    """The checkpoints as one JSON array of objects keyed by CARRIED_COLUMNS (by orjson: a
    carried 1 MB result is escaped in a fraction of the standard library's time), each value
    read back as a checkpoint write stores it. One row per seq, the last given, as upserting
    them one after another leaves it: a single INSERT may not change a row twice."""
    last = {c.seq: c for c in checkpoints}
    rows = []
    for c in last.values():
        params = checkpoint_params("", c, c.result, None, None)
        row = {column: params[column] for column in CARRIED_COLUMNS}
        for column in _TIMES:
            value = row[column]
            if value is not None and not math.isfinite(value):
                row[column] = _NON_FINITE[repr(float(value))]
        rows.append(row)
    try:
        return orjson.dumps(rows).decode()
    except TypeError:
        # What orjson refuses (text with surrogates) is written raw, not escaped: sending it
        # then fails as a write of it does. Escaped, a pair of surrogates would be joined into
        # one character by the server's JSON, storing a text the code never gave.
        return json.dumps(rows, ensure_ascii=False)


def audit_to_row(entry: AuditEntry) -> dict[str, Any]:
    """Parameters of an insert_audit query (named like AUDIT_COLUMNS)."""
    return {f: getattr(entry, f) for f in AuditEntry.__dataclass_fields__}


_KINDS = {kind.value: kind for kind in StreamKind}


def stream_entry_from_row(row: Sequence[Any]) -> StreamEntry:
    """A stream entry from the columns of the read_stream query (a reader's hot path: by
    position, the kind looked up rather than parsed)."""
    return StreamEntry(row[0], _KINDS[row[1]], row[2], row[3], row[4], row[5], row[6])

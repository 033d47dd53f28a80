"""The operations of transaction steps and the outbox: record what a transaction's body did
(its messages and the step's checkpoint, fenced by the lease), claim messages to send, settle a
send, list and retry them.

Written once for both SQL dialects; the body itself runs on the driver's connection (drivers'
body.py), before `record_transaction` in the same transaction. It must not touch a connection.
"""

from __future__ import annotations

from dataclasses import replace

from tether.store.port import Checkpoint, Lease
from tether.store.port.outbox import (
    OutboxMessage,
    OutboxSettlement,
    OutboxStatus,
    TransactionOutcome,
)
from tether.store.query import Op, Query, execute_many, one, select
from tether.store.rows import checkpoint_values, message_rows, outbox_from_row, settle_args
from tether.store.rules import tx_lease_lost


def check_transaction(lease: Lease, checkpoint: Checkpoint) -> Op[None]:
    """Before the body, in its transaction: the lease must hold, or the body never runs. A
    read without a lock: heartbeats go on while the body runs; the checkpoint's fenced
    statement after it decides whether anything commits."""
    row = yield from one("lease_state", run_id=lease.run_id)
    if row is None or (row[0], row[1], row[2]) != (lease.worker_id, lease.epoch, "running"):
        raise tx_lease_lost(lease.run_id, lease.worker_id, lease.epoch, checkpoint.name)


def record_transaction(
    lease: Lease, checkpoint: Checkpoint, outcome: TransactionOutcome, now: float
) -> Op[str]:
    """After the body, in its transaction: its messages into the outbox (pending, due now),
    then the checkpoint with its result. Without the lease the checkpoint writes nothing and
    LeaseLost rolls everything back, the body's writes too."""
    cp = checkpoint
    yield from execute_many("outbox_insert", message_rows(lease.run_id, cp.name,
                                                          outcome.messages, now))  # fmt: skip
    done = replace(cp, finished_at=outcome.finished_at or cp.finished_at)
    values = checkpoint_values(lease.run_id, done, outcome.result, lease.worker_id, lease.epoch)
    if (yield Query("upsert_checkpoint", values)) != 1:
        raise tx_lease_lost(lease.run_id, lease.worker_id, lease.epoch, cp.name)
    return outcome.result


def claim_outbox(
    worker_id: str, now: float, claim_until: float, limit: int
) -> Op[list[OutboxMessage]]:
    rows = yield from select("outbox_claim", worker=worker_id, now=now, claim_until=claim_until,
                             limit=max(0, limit))  # fmt: skip
    return sorted((outbox_from_row(r) for r in rows), key=lambda m: (m.created_at, m.id))


def settle_outbox(
    message_id: str, claim: int, settlement: OutboxSettlement, now: float
) -> Op[bool]:
    changed: int = yield Query("outbox_settle", settle_args(message_id, claim, settlement, now))
    return changed == 1


def next_outbox_at() -> Op[float | None]:
    row = yield from one("outbox_next_at")
    return None if row is None or row[0] is None else float(row[0])


def list_outbox(
    status: OutboxStatus | None, run_id: str | None, limit: int
) -> Op[list[OutboxMessage]]:
    rows = yield from select(
        "outbox_list", status=None if status is None else OutboxStatus(status).value,
        run_id=run_id, limit=max(0, limit),
    )  # fmt: skip
    return [outbox_from_row(r) for r in rows]


def retry_outbox(message_id: str, now: float) -> Op[OutboxMessage | None]:
    yield Query("outbox_retry", {"id": message_id, "now": now})
    row = yield from one("outbox_get", id=message_id, now=now)
    return None if row is None else outbox_from_row(row)

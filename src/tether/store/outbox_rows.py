"""The Store port's records for transactions and the outbox (what a transaction body returns,
messages as recorded and as stored, how a send ended) and their pure rules: message ids, the
statements a transaction body may not run, rows to records. Plain data, no I/O.

It must not import tether.store.base (which builds on it), tether.core or any backend.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tether.errors import LeaseLost


class OutboxStatus(StrEnum):
    PENDING = "pending"  # waiting to be sent (first time, or again after a failed send)
    SENDING = "sending"  # claimed by a worker; if it stays so past its claim, outcome unknown
    DELIVERED = "delivered"  # the sender accepted it (or its reconcile hook found it done)
    FAILED = "failed"  # retries exhausted or a permanent refusal; `error` says why


@dataclass(frozen=True, slots=True)
class NewOutboxMessage:
    """A message to insert with a checkpoint; an id the store already holds is skipped."""

    id: str
    destination: str
    key: str  # the idempotency key its sends carry
    payload: str  # JSON text


@dataclass(frozen=True, slots=True)
class TransactionOutcome:
    """What a transaction body gives the store back: the JSON of its result (the checkpoint's
    result) and the messages it recorded, to insert in the same transaction."""

    result: str
    messages: tuple[NewOutboxMessage, ...] = ()
    finished_at: float | None = None  # when the body returned: the checkpoint's finished_at


# A transaction body: called with the connection the store guards (opaque above the store).
TransactionBody = Callable[[Any], TransactionOutcome]


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """An outgoing message as stored: what a sender gets, and what `app.list_outbox` shows.
    Times are seconds since the epoch (UTC)."""

    id: str  # deterministic: from the run, the checkpoint that recorded it, its index there
    run_id: str
    checkpoint: str  # the checkpoint it was committed with ("outbox#2", "debit")
    destination: str  # a sender's name or an http(s):// URL
    key: str  # the idempotency key: the same on every send of this message
    payload_json: str  # the payload as JSON text (what the HTTP sender posts)
    status: OutboxStatus
    attempts: int  # sends started (a claim counts one)
    uncertain: int  # sends whose outcome was never recorded (the worker died during them)
    in_doubt: bool  # this claim follows such a send: reconcile, or send again with the key
    claim: int  # which claim of the message this is: fences the claimer's settle_outbox
    claimed_by: str | None
    next_at: float  # pending: due time; sending: when the claim expires
    error: str | None  # JSON {type, message, traceback} of the last failed send
    created_at: float
    updated_at: float
    delivered_at: float | None = None

    @property
    def payload(self) -> Any:
        """The payload as JSON data."""
        return json.loads(self.payload_json)


@dataclass(frozen=True, slots=True)
class OutboxSettlement:
    """How a claimed message's send ended: DELIVERED; PENDING again at `next_at` (a retry);
    FAILED for good. `error` is the JSON of the failure, if any."""

    status: OutboxStatus
    next_at: float | None = None
    error: str | None = None


def message_id(run_id: str, checkpoint: str, index: int) -> str:
    """The id (and default idempotency key) of the `index`-th message recorded with the
    checkpoint `checkpoint` of run `run_id`: the same on every retry and replay."""
    text = f"{len(run_id)}:{run_id}:{checkpoint}:{index}"
    return f"tether-msg-{hashlib.sha256(text.encode()).hexdigest()[:40]}"


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


def tx_lease_lost(run_id: str, worker_id: str, epoch: int, name: str) -> LeaseLost:
    """The error for a transaction step of a run whose lease its worker no longer holds."""
    return LeaseLost(
        f"worker {worker_id!r} no longer holds run {run_id!r} at epoch {epoch} (another "
        f"worker adopted it, or it ended); transaction step {name!r} was rolled back, nothing "
        f"of it was stored, and this worker stops executing the run"
    )


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


# -- what a transaction body may not run -------------------------------------------------------

# Statements that would end, split or reconfigure the transaction Tether runs the body in.
_REFUSED = frozenset(
    {"BEGIN", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE", "START", "VACUUM",
     "ATTACH", "DETACH", "SET", "RESET", "DISCARD"}
)  # fmt: skip
# Pragmas that take an argument and only read (others with one change the connection).
_READ_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo",
     "foreign_key_list", "foreign_key_check", "integrity_check", "quick_check"}
)  # fmt: skip
_COMMENTS = re.compile(r"\s*(?:--[^\n]*(?:\n|$)|/\*.*?\*/)", re.DOTALL)
_WORD = re.compile(r"\s*([A-Za-z]+)")

REFUSAL = (
    "inside an @app.transaction() body, the body runs in Tether's transaction, which commits "
    "its writes together with the step's checkpoint: return from the body to commit, raise to "
    "roll back"
)


@functools.lru_cache(maxsize=1024)  # bodies run the same few statements again and again
def refused_statement(sql: str) -> str | None:
    """Why a transaction body may not run `sql` (its first keyword ends or changes the
    transaction), or None when it may."""
    text = sql
    while True:
        found = _COMMENTS.match(text)
        if found is None or not found.group(0):
            break
        text = text[found.end() :]
    word = _WORD.match(text)
    if word is None:
        return None
    keyword = word.group(1).upper()
    rest = text[word.end() :].lstrip().upper()
    if keyword == "SET" and rest.startswith("CONSTRAINTS"):
        return None  # deferring constraint checks stays inside the transaction
    if keyword == "PRAGMA" and "=" not in rest:
        name = rest.split("(", 1)[0].strip().lower().rsplit(".", 1)[-1]
        if "(" not in rest or name in _READ_PRAGMAS:
            return None  # reading a pragma
    if (
        keyword in _REFUSED
        or keyword == "PRAGMA"
        or (keyword == "PREPARE" and rest.startswith("TRANSACTION"))
    ):
        return f"{keyword} is not allowed {REFUSAL}"
    return None

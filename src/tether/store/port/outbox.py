"""The transactions-and-outbox part of the Store port: what a transaction step's body returns,
outbox messages as recorded and as stored, how a send ended, and the operations on them.
It must not import tether.core or any backend.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from tether.store.port.runs import Checkpoint, Lease


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


class OutboxPort(Protocol):
    """Transaction steps and the outbox."""

    async def run_transaction(
        self, lease: Lease, body: TransactionBody, checkpoint: Checkpoint, now: float
    ) -> str:
        """In one transaction of this database: call `body(connection)` (a connection to this
        database inside the transaction, guarded so that the body cannot commit, roll back or
        end it), insert the messages it returns into the outbox (pending, due now; an id the
        outbox holds is skipped), and write `checkpoint` with result = the text it returns;
        commit, and return that text. The lease is checked before the body runs and held to
        the commit. A body that raises rolls everything back and its exception propagates as
        it is (an SQL error of the body is the body's, not StoreUnavailable). Raises LeaseLost
        (nothing written), StoreUnavailable when the database fails."""

    async def claim_outbox(
        self, worker_id: str, now: float, claim_until: float, limit: int
    ) -> list[OutboxMessage]:
        """Take up to `limit` messages to send, soonest due first: pending ones due by `now`,
        and sending ones whose claim expired or whose claimer's worker row is gone (their
        send's outcome is unknown: `uncertain` grows by one and `in_doubt` is set). Each
        becomes sending, claimed by `worker_id` until `claim_until` (next_at), with one more
        attempt and claim. Two claimers never get the same message at once."""

    async def settle_outbox(
        self, message_id: str, claim: int, settlement: OutboxSettlement, now: float
    ) -> bool:
        """Record how the send of a claimed message ended (delivered, pending again at
        settlement.next_at, or failed), if the message is still sending under this `claim`;
        returns whether it was. A claim that expired and was taken again is not recorded."""

    async def next_outbox_at(self) -> float | None:
        """When the next message becomes claimable (0 for one whose claimer's worker row is
        gone), or None when no message is pending or sending."""

    async def list_outbox(
        self,
        *,
        status: OutboxStatus | None = None,
        run_id: str | None = None,
        limit: int = 100,
    ) -> list[OutboxMessage]:
        """Messages, oldest first, filtered by status and run."""

    async def retry_outbox(self, message_id: str, now: float) -> OutboxMessage | None:
        """A failed message becomes pending, due now, with its attempts at 0 (after a fix
        on the receiver's side); one in another status is left as it is. Returns the message
        as stored after, None if there is no such message."""

"""Transactions and the outbox on the memory backend, mixed into MemoryStore. Memory has no
database for business writes, so a transaction body gets a private in-memory SQLite database of
this store (for tests only: it is not Tether's data and lives as long as the store object).
It must not import tether.core.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import TYPE_CHECKING

from tether.store.base import Checkpoint, Lease, RunRecord, WorkerInfo
from tether.store.outbox_rows import (
    OutboxMessage,
    OutboxSettlement,
    OutboxStatus,
    TransactionBody,
    tx_lease_lost,
)

if TYPE_CHECKING:
    import sqlite3


class MemoryOutbox:
    """Mixed into MemoryStore."""

    _lock: threading.Lock
    _history: dict[str, dict[int, Checkpoint]]
    _workers: dict[str, WorkerInfo]
    _outbox: dict[str, OutboxMessage]  # by id, in insertion order
    _tx_db: sqlite3.Connection | None

    def _init_outbox(self) -> None:
        """Set up this mixin's state (called by MemoryStore.__init__)."""
        self._outbox = {}
        self._tx_db = None

    def _held(self, lease: Lease) -> RunRecord | None:
        raise NotImplementedError  # MemoryStore's

    @property
    def transaction_database(self) -> sqlite3.Connection:
        """The private in-memory SQLite database that transaction bodies write to on this
        store (made on first use). For tests: look at what the bodies wrote."""
        if self._tx_db is None:
            import sqlite3

            self._tx_db = sqlite3.connect(":memory:", isolation_level=None,
                                          check_same_thread=False)  # fmt: skip
        return self._tx_db

    async def run_transaction(
        self, lease: Lease, body: TransactionBody, checkpoint: Checkpoint, now: float
    ) -> str:
        from tether.store.sqlite_outbox import _BodyFailed, run_body

        conn = self.transaction_database
        with self._lock:  # the body runs whole under the lock, as every operation here
            if self._held(lease) is None:
                raise tx_lease_lost(lease.run_id, lease.worker_id, lease.epoch, checkpoint.name)
            conn.execute("BEGIN IMMEDIATE")
            try:
                outcome = run_body(conn, body, keep_sqlite_errors=True)
            except _BodyFailed as failed:
                conn.execute("ROLLBACK")
                raise failed.error from None
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            for m in outcome.messages:
                if m.id not in self._outbox:
                    self._outbox[m.id] = OutboxMessage(
                        id=m.id, run_id=lease.run_id, checkpoint=checkpoint.name,
                        destination=m.destination, key=m.key, payload_json=m.payload,
                        status=OutboxStatus.PENDING, attempts=0, uncertain=0, in_doubt=False,
                        claim=0, claimed_by=None, next_at=now, error=None, created_at=now,
                        updated_at=now,
                    )  # fmt: skip
            finished = outcome.finished_at
            self._history.setdefault(lease.run_id, {})[checkpoint.seq] = replace(
                checkpoint, result=outcome.result, position=checkpoint.at,
                finished_at=checkpoint.finished_at if finished is None else finished,
            )  # fmt: skip
            conn.execute("COMMIT")
            return outcome.result

    def _due(self, message: OutboxMessage) -> float | None:
        """When the message is claimable (0: its claimer is gone), None if it never is."""
        if message.status is OutboxStatus.PENDING:
            return message.next_at
        if message.status is OutboxStatus.SENDING:
            gone = message.claimed_by is None or message.claimed_by not in self._workers
            return 0.0 if gone else message.next_at
        return None

    async def claim_outbox(
        self, worker_id: str, now: float, claim_until: float, limit: int
    ) -> list[OutboxMessage]:
        with self._lock:
            due = []
            for message in self._outbox.values():
                at = self._due(message)
                if at is not None and at <= now:
                    due.append((message.next_at, message.id))
            claimed = []
            for _, message_id in sorted(due)[: max(0, limit)]:
                old = self._outbox[message_id]
                doubt = old.status is OutboxStatus.SENDING
                new = replace(old, status=OutboxStatus.SENDING, attempts=old.attempts + 1,
                              uncertain=old.uncertain + doubt, in_doubt=doubt,
                              claim=old.claim + 1, claimed_by=worker_id, next_at=claim_until,
                              updated_at=now)  # fmt: skip
                self._outbox[message_id] = new
                claimed.append(new)
            return sorted(claimed, key=lambda m: (m.created_at, m.id))

    async def settle_outbox(
        self, message_id: str, claim: int, settlement: OutboxSettlement, now: float
    ) -> bool:
        with self._lock:
            old = self._outbox.get(message_id)
            if old is None or old.status is not OutboxStatus.SENDING or old.claim != claim:
                return False
            delivered = settlement.status is OutboxStatus.DELIVERED
            self._outbox[message_id] = replace(
                old, status=settlement.status, error=settlement.error, claimed_by=None,
                in_doubt=False, updated_at=now,
                next_at=old.next_at if settlement.next_at is None else settlement.next_at,
                delivered_at=now if delivered else None,
            )  # fmt: skip
            return True

    async def next_outbox_at(self) -> float | None:
        with self._lock:
            times = [self._due(m) for m in self._outbox.values()]
            return min((t for t in times if t is not None), default=None)

    async def list_outbox(
        self,
        *,
        status: OutboxStatus | None = None,
        run_id: str | None = None,
        limit: int = 100,
    ) -> list[OutboxMessage]:
        with self._lock:
            found = [m for m in self._outbox.values()
                     if (status is None or m.status == status)
                     and (run_id is None or m.run_id == run_id)]  # fmt: skip
        return sorted(found, key=lambda m: (m.created_at, m.id))[: max(0, limit)]

    async def retry_outbox(self, message_id: str, now: float) -> OutboxMessage | None:
        with self._lock:
            old = self._outbox.get(message_id)
            if old is not None and old.status is OutboxStatus.FAILED:
                self._outbox[message_id] = replace(
                    old, status=OutboxStatus.PENDING, next_at=now, attempts=0, in_doubt=False,
                    claimed_by=None, updated_at=now,
                )  # fmt: skip
            return self._outbox.get(message_id)

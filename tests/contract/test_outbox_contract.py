"""The Store contract for transaction steps and the outbox, run once per backend (see conftest).

run_transaction commits a body's writes, its messages and the step's checkpoint together, or
nothing (a lost lease, a body that raises); claim_outbox, settle_outbox, next_outbox_at,
list_outbox and retry_outbox move messages through pending, sending, delivered and failed,
fenced by claims. A body's SQL is written with `?` placeholders and turned into PostgreSQL's
`%s` by `sql()`. Same rules as test_store_contract: plain float times, nothing sleeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from tests.contract.test_store_contract import LEASE, NOW, WF, get, new

from tether.errors import LeaseLost, StoreUnavailable
from tether.store.port import Checkpoint, CheckpointStatus, Lease, RunStatus, Store, WorkerInfo
from tether.store.port.outbox import (
    NewOutboxMessage,
    OutboxMessage,
    OutboxSettlement,
    OutboxStatus,
    TransactionOutcome,
)
from tether.store.postgres import PostgresStore

DELIVERED = OutboxSettlement(OutboxStatus.DELIVERED)


class BodyError(Exception):
    """What a test's body raises: its own exception, not the store's."""


def sql(store: Store, text: str) -> str:
    """`text` with `?` placeholders in the store's dialect (psycopg takes %s)."""
    return text.replace("?", "%s") if isinstance(store, PostgresStore) else text


def step(seq: int, name: str | None = None) -> Checkpoint:
    """A transaction step's checkpoint as the engine writes it (the result comes from the body)."""
    return Checkpoint(
        seq=seq,
        name=name or f"tx{seq}",
        kind="transaction",
        status=CheckpointStatus.COMPLETED,
        attempts=1,
        started_at=NOW,
        finished_at=NOW,
    )


def message(message_id: str, payload: object = None) -> NewOutboxMessage:
    return NewOutboxMessage(
        message_id, f"https://example.invalid/{message_id}", f"key-{message_id}",
        json.dumps({"id": message_id} if payload is None else payload),
    )  # fmt: skip


def stored(
    new_message: NewOutboxMessage, run_id: str, checkpoint: str, now: float = NOW
) -> OutboxMessage:
    """A message as the outbox holds it right after its transaction committed."""
    return OutboxMessage(
        id=new_message.id, run_id=run_id, checkpoint=checkpoint,
        destination=new_message.destination, key=new_message.key,
        payload_json=new_message.payload, status=OutboxStatus.PENDING, attempts=0, uncertain=0,
        in_doubt=False, claim=0, claimed_by=None, next_at=now, error=None, created_at=now,
        updated_at=now, delivered_at=None,
    )  # fmt: skip


async def running(
    store: Store, run_id: str = "r1", worker: str = "w1", lease_until: float = NOW + LEASE
) -> Lease:
    """A run held by `worker` at epoch 1."""
    await store.create_run(new(run_id), NOW, owner=worker, lease_until=lease_until)
    return Lease(run_id, worker, 1)


async def worker(store: Store, worker_id: str) -> None:
    await store.register_worker(WorkerInfo(worker_id, "host", 1, "token"), NOW)


class Ledger:
    """A table of the test's own, written by bodies and read back through a transaction step
    of a run of its own ("reader"), so that only the Store port is used."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reads = 0

    async def create(self) -> None:
        lease = await running(self.store, "reader", "w-reader", NOW + 1e9)  # never taken over

        def body(conn: Any) -> TransactionOutcome:
            conn.execute("CREATE TABLE ledger (account TEXT, amount INTEGER)")
            return TransactionOutcome("null")

        await self.store.run_transaction(lease, body, step(0, "create"), NOW)

    def insert(self, conn: Any, account: str, amount: int) -> None:
        conn.execute(sql(self.store, "INSERT INTO ledger VALUES (?, ?)"), (account, amount))

    async def rows(self) -> list[list[Any]]:
        self.reads += 1

        def body(conn: Any) -> TransactionOutcome:
            rows = conn.execute("SELECT account, amount FROM ledger ORDER BY account").fetchall()
            return TransactionOutcome(json.dumps([list(r) for r in rows]))

        lease = Lease("reader", "w-reader", 1)
        read = step(self.reads, f"read{self.reads}")
        rows: list[list[Any]] = json.loads(await self.store.run_transaction(lease, body, read, NOW))
        return rows


async def record(
    store: Store, lease: Lease, ids: Sequence[str], seq: int = 0, now: float = NOW
) -> list[NewOutboxMessage]:
    """Messages recorded by a transaction step (seq) that writes nothing else."""
    messages = tuple(message(i) for i in ids)
    await store.run_transaction(
        lease, lambda conn: TransactionOutcome("null", messages), step(seq), now
    )
    return list(messages)


async def outbox(store: Store, message_id: str) -> OutboxMessage:
    (found,) = [m for m in await store.list_outbox() if m.id == message_id]
    return found


# -- run_transaction ---------------------------------------------------------------------------


async def test_run_transaction_commits_the_bodys_writes_its_messages_and_its_checkpoint(
    store: Store,
) -> None:
    ledger = Ledger(store)
    await ledger.create()
    lease = await running(store)
    messages = (message("m-b"), message("m-a", {"amount": 30}))
    seen: list[int] = []

    def body(conn: Any) -> TransactionOutcome:
        ledger.insert(conn, "alice", -30)
        ledger.insert(conn, "bob", 30)
        query = sql(store, "SELECT sum(amount) FROM ledger WHERE account = ?")
        seen.append(conn.execute(query, ("alice",)).fetchone()[0])  # its own write, unseen yet
        return TransactionOutcome('{"paid": 30}', messages, finished_at=NOW + 0.5)

    result = await store.run_transaction(lease, body, step(0, "pay"), NOW)
    assert result == '{"paid": 30}'
    assert seen == [-30]
    assert await store.load_history("r1") == [
        dataclasses.replace(step(0, "pay"), result=result, finished_at=NOW + 0.5, position="0")
    ]
    assert await store.list_outbox(run_id="r1") == [  # oldest first: same time, then by id
        stored(messages[1], "r1", "pay"),
        stored(messages[0], "r1", "pay"),
    ]
    assert await ledger.rows() == [["alice", -30], ["bob", 30]]
    assert (await get(store, "r1")).status is RunStatus.RUNNING


async def test_run_transaction_skips_a_message_whose_id_the_outbox_holds(store: Store) -> None:
    lease = await running(store)
    (first,) = await record(store, lease, ["m1"])
    again = (message("m1", {"changed": True}), message("m2"))
    await store.run_transaction(
        lease, lambda conn: TransactionOutcome("1", again), step(1), NOW + 1
    )
    assert await store.list_outbox() == [
        stored(first, "r1", "tx0"),  # as first recorded
        stored(again[1], "r1", "tx1", NOW + 1),
    ]
    assert [c.result for c in await store.load_history("r1")] == ["null", "1"]


async def test_run_transaction_with_a_lost_lease_writes_nothing_and_raises_lease_lost(
    store: Store,
) -> None:
    ledger = Ledger(store)
    await ledger.create()
    stale = await running(store)
    await store.claim_runs("w2", [WF], NOW + LEASE + 1, NOW + 2 * LEASE, 1)  # adopted: epoch 2

    def body(conn: Any) -> TransactionOutcome:
        ledger.insert(conn, "alice", -30)
        return TransactionOutcome("1", (message("m1"),))

    with pytest.raises(LeaseLost):
        await store.run_transaction(stale, body, step(0), NOW + LEASE + 2)
    assert await store.load_history("r1") == []
    assert await store.list_outbox() == []
    assert await ledger.rows() == []
    # The new owner's lease commits the same step.
    assert await store.run_transaction(Lease("r1", "w2", 2), body, step(0), NOW + LEASE + 3) == "1"
    assert [c.result for c in await store.load_history("r1")] == ["1"]
    assert [m.id for m in await store.list_outbox()] == ["m1"]
    assert await ledger.rows() == [["alice", -30]]


async def test_run_transaction_checks_the_lease_before_the_body_runs(store: Store) -> None:
    stale = await running(store)
    await store.claim_runs("w2", [WF], NOW + LEASE + 1, NOW + 2 * LEASE, 1)  # adopted: epoch 2
    calls: list[str] = []

    def body(conn: Any) -> TransactionOutcome:
        calls.append("called")
        return TransactionOutcome("1")

    with pytest.raises(LeaseLost):
        await store.run_transaction(stale, body, step(0), NOW + LEASE + 2)
    assert calls == []


async def test_run_transaction_of_an_ended_run_raises_lease_lost(store: Store) -> None:
    lease = await running(store)
    await store.finish_run(lease, RunStatus.SUCCEEDED, "1", None, NOW + 1)
    with pytest.raises(LeaseLost):
        await store.run_transaction(
            lease, lambda conn: TransactionOutcome("1", (message("m1"),)), step(0), NOW + 2
        )
    assert await store.load_history("r1") == []
    assert await store.list_outbox() == []


async def test_a_body_that_raises_rolls_everything_back_and_its_exception_propagates_as_it_is(
    store: Store,
) -> None:
    ledger = Ledger(store)
    await ledger.create()
    lease = await running(store)
    error = BodyError("the receiver said no")

    def body(conn: Any) -> TransactionOutcome:
        ledger.insert(conn, "alice", -30)
        raise error

    with pytest.raises(BodyError) as raised:
        await store.run_transaction(lease, body, step(0), NOW)
    assert raised.value is error
    assert await store.load_history("r1") == []
    assert await store.list_outbox() == []
    assert await ledger.rows() == []
    # Nothing is left half done: the next step of the run commits.
    await record(store, lease, ["m1"])
    assert [m.id for m in await store.list_outbox()] == ["m1"]


async def test_an_sql_error_of_the_body_is_the_bodys_own_not_store_unavailable(
    store: Store,
) -> None:
    ledger = Ledger(store)
    await ledger.create()
    lease = await running(store)
    seen: list[Exception] = []

    def body(conn: Any) -> TransactionOutcome:
        ledger.insert(conn, "alice", -30)
        try:
            conn.execute("INSERT INTO no_such_table VALUES (1)")
        except Exception as exc:
            seen.append(exc)
            raise
        return TransactionOutcome("1")  # pragma: no cover (the insert fails)

    with pytest.raises((psycopg.Error, sqlite3.Error)) as raised:  # the driver's own error
        await store.run_transaction(lease, body, step(0), NOW)
    assert [raised.value] == seen  # the very exception the body met
    assert not isinstance(raised.value, StoreUnavailable)
    assert await store.load_history("r1") == []
    assert await ledger.rows() == []


async def test_the_body_cannot_commit_or_roll_back_its_transaction(store: Store) -> None:
    ledger = Ledger(store)
    await ledger.create()
    lease = await running(store)
    refused: list[str] = []

    def body(conn: Any) -> TransactionOutcome:
        ledger.insert(conn, "alice", -30)
        for attempt in (
            lambda: conn.execute("COMMIT"),
            lambda: conn.execute("ROLLBACK"),
            conn.commit,
            conn.rollback,
        ):
            try:
                attempt()
            except Exception:
                refused.append("refused")
        raise BodyError("undo it all")

    with pytest.raises(BodyError):
        await store.run_transaction(lease, body, step(0), NOW)
    assert refused == ["refused"] * 4
    assert await ledger.rows() == []  # nothing the body did was committed on its own


# -- claim_outbox ------------------------------------------------------------------------------


async def test_claim_outbox_takes_due_messages_up_to_the_limit_and_marks_them_sending(
    store: Store,
) -> None:
    await worker(store, "w1")
    lease = await running(store)
    m1, m2, m3 = await record(store, lease, ["m1", "m2", "m3"])
    assert await store.claim_outbox("w1", NOW - 1, NOW + 60, 10) == []  # not due yet
    assert await store.claim_outbox("w1", NOW, NOW + 60, 0) == []
    claimed = await store.claim_outbox("w1", NOW + 1, NOW + 61, 2)
    sending = {"status": OutboxStatus.SENDING, "attempts": 1, "claim": 1, "claimed_by": "w1",
               "next_at": NOW + 61, "updated_at": NOW + 1}  # fmt: skip
    assert claimed == [dataclasses.replace(stored(m, "r1", "tx0"), **sending) for m in (m1, m2)]
    assert await store.list_outbox(status=OutboxStatus.SENDING) == claimed
    assert await store.claim_outbox("w1", NOW + 1, NOW + 61, 5) == [
        dataclasses.replace(stored(m3, "r1", "tx0"), **sending)
    ]
    assert await store.claim_outbox("w1", NOW + 2, NOW + 62, 5) == []  # all claimed, live


async def test_claim_outbox_takes_the_soonest_due_first(store: Store) -> None:
    await worker(store, "w1")
    lease = await running(store)
    await record(store, lease, ["a", "b", "c"])
    claimed = await store.claim_outbox("w1", NOW, NOW + 5, 3)
    due = {"a": NOW + 20, "b": NOW + 10, "c": NOW + 30}
    for m in claimed:
        retry = OutboxSettlement(OutboxStatus.PENDING, next_at=due[m.id])
        assert await store.settle_outbox(m.id, m.claim, retry, NOW + 1)
    assert [m.id for m in await store.claim_outbox("w1", NOW + 25, NOW + 90, 1)] == ["b"]
    assert [m.id for m in await store.claim_outbox("w1", NOW + 25, NOW + 90, 5)] == ["a"]
    assert [m.id for m in await store.claim_outbox("w1", NOW + 30, NOW + 90, 5)] == ["c"]


async def test_two_claimers_at_once_never_get_the_same_message(store: Store) -> None:
    await worker(store, "a")
    await worker(store, "b")
    lease = await running(store)
    ids = [f"m{i:02}" for i in range(20)]
    await record(store, lease, ids)
    other = store.another() or store
    if other is not store:
        await other.open()
    try:
        a, b = await asyncio.gather(
            store.claim_outbox("a", NOW, NOW + 60, 12), other.claim_outbox("b", NOW, NOW + 60, 12)
        )
    finally:
        if other is not store:
            await other.close()
    assert not {m.id for m in a} & {m.id for m in b}
    assert sorted(m.id for m in a + b) == ids
    assert {m.claimed_by for m in a} <= {"a"}
    assert {m.claimed_by for m in b} <= {"b"}
    assert await store.claim_outbox("c", NOW + 1, NOW + 60, 20) == []


async def test_an_expired_claim_is_taken_again_with_one_more_uncertain_send_in_doubt(
    store: Store,
) -> None:
    await worker(store, "w1")
    await worker(store, "w2")
    lease = await running(store)
    await record(store, lease, ["m1"])
    (first,) = await store.claim_outbox("w1", NOW, NOW + 10, 1)
    assert await store.claim_outbox("w2", NOW + 9, NOW + 70, 1) == []  # still w1's
    (again,) = await store.claim_outbox("w2", NOW + 10, NOW + 70, 1)
    assert again == dataclasses.replace(
        first, attempts=2, uncertain=1, in_doubt=True, claim=2, claimed_by="w2",
        next_at=NOW + 70, updated_at=NOW + 10,
    )  # fmt: skip
    (third,) = await store.claim_outbox("w1", NOW + 70, NOW + 80, 1)
    assert (third.attempts, third.uncertain, third.in_doubt, third.claim) == (3, 2, True, 3)


async def test_a_claim_whose_worker_row_is_gone_is_taken_again_at_once(store: Store) -> None:
    await worker(store, "w2")
    lease = await running(store)
    await record(store, lease, ["m1"])
    (first,) = await store.claim_outbox("ghost", NOW, NOW + 60, 1)  # no worker row
    assert (first.claimed_by, first.claim, first.uncertain) == ("ghost", 1, 0)
    assert await store.next_outbox_at() == 0
    (again,) = await store.claim_outbox("w2", NOW + 1, NOW + 61, 1)  # long before NOW + 60
    assert again == dataclasses.replace(
        first, attempts=2, uncertain=1, in_doubt=True, claim=2, claimed_by="w2",
        next_at=NOW + 61, updated_at=NOW + 1,
    )  # fmt: skip
    assert await store.next_outbox_at() == NOW + 61


# -- settle_outbox -----------------------------------------------------------------------------


async def test_settle_outbox_records_how_each_send_ended(store: Store) -> None:
    await worker(store, "w1")
    lease = await running(store)
    await record(store, lease, ["m1", "m2", "m3"])
    m1, m2, m3 = await store.claim_outbox("w1", NOW, NOW + 60, 3)
    retry = OutboxSettlement(OutboxStatus.PENDING, next_at=NOW + 30, error='{"try": 1}')
    failed = OutboxSettlement(OutboxStatus.FAILED, error='{"refused": true}')
    assert await store.settle_outbox("m1", m1.claim, DELIVERED, NOW + 1)
    assert await store.settle_outbox("m2", m2.claim, retry, NOW + 2)
    assert await store.settle_outbox("m3", m3.claim, failed, NOW + 3)
    settled = {"claimed_by": None, "in_doubt": False}
    assert await store.list_outbox() == [
        dataclasses.replace(m1, **settled, status=OutboxStatus.DELIVERED, updated_at=NOW + 1,
                            delivered_at=NOW + 1),
        dataclasses.replace(m2, **settled, status=OutboxStatus.PENDING, next_at=NOW + 30,
                            error='{"try": 1}', updated_at=NOW + 2),
        dataclasses.replace(m3, **settled, status=OutboxStatus.FAILED,
                            error='{"refused": true}', updated_at=NOW + 3),
    ]  # fmt: skip
    # Each is no longer sending under that claim: a second outcome is not recorded.
    assert not await store.settle_outbox("m1", m1.claim, failed, NOW + 4)
    assert not await store.settle_outbox("m2", m2.claim, DELIVERED, NOW + 4)
    assert (await outbox(store, "m2")).status is OutboxStatus.PENDING
    assert not await store.settle_outbox("nope", 1, DELIVERED, NOW + 4)


async def test_settle_outbox_with_a_stale_claim_returns_false_and_writes_nothing(
    store: Store,
) -> None:
    await worker(store, "w1")
    await worker(store, "w2")
    lease = await running(store)
    await record(store, lease, ["m1", "m2"])
    stale, lone = await store.claim_outbox("w1", NOW, NOW + 10, 2)
    await store.settle_outbox("m2", lone.claim, DELIVERED, NOW + 1)
    await store.retry_outbox("m2", NOW + 1)  # delivered: left as it is
    (taken,) = await store.claim_outbox("w2", NOW + 11, NOW + 70, 1)  # w1's claim expired
    assert taken.id == "m1"
    assert not await store.settle_outbox("m1", stale.claim, DELIVERED, NOW + 12)
    assert await outbox(store, "m1") == taken
    assert await store.settle_outbox("m1", taken.claim, DELIVERED, NOW + 13)
    assert (await outbox(store, "m1")).delivered_at == NOW + 13


async def test_an_expired_claim_that_nobody_took_again_still_settles(store: Store) -> None:
    await worker(store, "w1")
    lease = await running(store)
    await record(store, lease, ["m1"])
    (claimed,) = await store.claim_outbox("w1", NOW, NOW + 10, 1)
    assert await store.settle_outbox("m1", claimed.claim, DELIVERED, NOW + 50)
    assert (await outbox(store, "m1")).status is OutboxStatus.DELIVERED


# -- next_outbox_at, list_outbox, retry_outbox -------------------------------------------------


async def test_next_outbox_at_is_when_the_next_message_becomes_claimable(store: Store) -> None:
    assert await store.next_outbox_at() is None
    await worker(store, "w1")
    lease = await running(store)
    await record(store, lease, ["m1", "m2"], now=NOW + 5)
    assert await store.next_outbox_at() == NOW + 5  # pending, due at once
    m1, m2 = await store.claim_outbox("w1", NOW + 5, NOW + 60, 2)
    assert await store.next_outbox_at() == NOW + 60  # when the claims expire
    await store.settle_outbox("m1", m1.claim, OutboxSettlement(OutboxStatus.PENDING, NOW + 40),
                              NOW + 6)  # fmt: skip
    assert await store.next_outbox_at() == NOW + 40
    await store.settle_outbox("m2", m2.claim, OutboxSettlement(OutboxStatus.FAILED), NOW + 7)
    assert await store.next_outbox_at() == NOW + 40  # a failed one is never due
    (m1,) = await store.claim_outbox("w1", NOW + 40, NOW + 90, 1)
    await store.settle_outbox("m1", m1.claim, DELIVERED, NOW + 41)
    assert await store.next_outbox_at() is None  # delivered and failed: nothing to send


async def test_list_outbox_filters_by_status_and_run_oldest_first(store: Store) -> None:
    await worker(store, "w1")
    r2 = await running(store, "r2")
    r1 = await running(store, "r1")
    await record(store, r2, ["z"], now=NOW + 1)
    await record(store, r1, ["y", "x"], now=NOW + 2)
    await record(store, r2, ["a"], now=NOW + 3)
    assert [m.id for m in await store.list_outbox()] == ["z", "x", "y", "a"]
    assert [m.id for m in await store.list_outbox(limit=2)] == ["z", "x"]
    assert [m.id for m in await store.list_outbox(run_id="r2")] == ["z", "a"]
    assert await store.list_outbox(run_id="nope") == []
    (z,) = await store.claim_outbox("w1", NOW + 1, NOW + 60, 1)
    assert z.id == "z"
    assert [m.id for m in await store.list_outbox(status=OutboxStatus.SENDING)] == ["z"]
    assert [m.id for m in await store.list_outbox(status=OutboxStatus.PENDING)] == ["x", "y", "a"]
    assert [m.id for m in await store.list_outbox(status=OutboxStatus.PENDING, run_id="r2")] == [
        "a"
    ]
    assert await store.list_outbox(status=OutboxStatus.DELIVERED) == []


async def test_retry_outbox_makes_only_a_failed_message_pending_due_now_with_no_attempts(
    store: Store,
) -> None:
    await worker(store, "w1")
    lease = await running(store)
    await record(store, lease, ["f", "d", "s", "p"])
    claimed = {m.id: m for m in await store.claim_outbox("w1", NOW, NOW + 60, 3)}
    assert sorted(claimed) == ["d", "f", "p"]
    failed = OutboxSettlement(OutboxStatus.FAILED, error='{"refused": true}')
    await store.settle_outbox("f", claimed["f"].claim, failed, NOW + 1)
    await store.settle_outbox("d", claimed["d"].claim, DELIVERED, NOW + 1)
    later = OutboxSettlement(OutboxStatus.PENDING, NOW + 30)
    await store.settle_outbox("p", claimed["p"].claim, later, NOW + 1)
    before = {m.id: m for m in await store.list_outbox()}
    retried = await store.retry_outbox("f", NOW + 50)
    assert retried == dataclasses.replace(
        before["f"], status=OutboxStatus.PENDING, next_at=NOW + 50, attempts=0,
        updated_at=NOW + 50,
    )  # fmt: skip
    assert await outbox(store, "f") == retried
    for other in ("d", "s", "p"):  # delivered, pending (never claimed) and pending again
        assert await store.retry_outbox(other, NOW + 50) == before[other]
    assert await store.retry_outbox("nope", NOW + 50) is None
    due = {m.id: m for m in await store.claim_outbox("w1", NOW + 50, NOW + 99, 10)}
    assert sorted(due) == ["f", "p", "s"]  # due again now, as the others that are due
    assert (due["f"].attempts, due["f"].claim) == (1, claimed["f"].claim + 1)

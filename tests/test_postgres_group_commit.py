"""PostgreSQL's group commit and the callers it serves: a write whose caller is cancelled does
not commit after what that caller does next. Still queued, it is withdrawn; taken into a
transaction, the caller's cancellation waits until it has landed, for SETTLE seconds at most (a
stopping worker's claim that committed after the worker released its runs kept a run leased to
a worker that was gone)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from tests.contract.test_store_contract import LEASE, NOW, WF, checkpoint, lease_of, new
from tests.postgres_server import connect_in

from tether.store.drivers.postgres import commit
from tether.store.port import Lease
from tether.store.postgres import PostgresStore


@pytest.fixture
def store(postgres_store: PostgresStore) -> PostgresStore:
    return postgres_store


async def committers_busy(store: PostgresStore, count: int) -> None:
    """Until `count` writes are taken into transactions (none left queued)."""
    commits = store.driver.commits
    for _ in range(500):
        if commits._committers >= count and not commits._queued:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the writes were never taken into transactions")


async def checkpoints_of(store: PostgresStore, run_id: str) -> list[int]:
    return [c.seq for c in await store.load_history(run_id)]


async def cancelled(*tasks: asyncio.Task[Any]) -> None:
    """Every task of a test ended (cancelled if it still runs), whatever the test met."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def locked_run(store: PostgresStore) -> tuple[Lease, psycopg.AsyncConnection[Any]]:
    """Run "r", claimed, and a connection whose transaction holds its row locked: every
    checkpoint write of it waits on the lock until that transaction ends."""
    await store.create_run(new("r"), NOW)
    (run,) = await store.claim_runs("w", [WF], NOW, NOW + LEASE, 1)
    blocker = await connect_in(store.driver.url)
    await blocker.execute("SELECT 1 FROM tether_runs WHERE id = 'r' FOR UPDATE")
    return lease_of(run), blocker


async def test_a_cancelled_write_is_withdrawn_while_queued_and_waited_for_once_taken(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commit, "SETTLE", 60.0)  # the wait's bound is the next test's
    lease, blocker = await locked_run(store)
    tasks: list[asyncio.Task[Any]] = []
    try:
        first = asyncio.create_task(store.write_checkpoint(lease, checkpoint(0), NOW + 1))
        await asyncio.sleep(0.05)  # alone: committing in its own task
        taken = asyncio.create_task(store.write_checkpoint(lease, checkpoint(1), NOW + 1))
        tasks += [first, taken]
        await committers_busy(store, 2)  # a committer took it
        queued = asyncio.create_task(store.write_checkpoint(lease, checkpoint(2), NOW + 1))
        tasks.append(queued)
        await asyncio.sleep(0.05)
        assert store.driver.commits._queued  # no committer is free for it
        queued.cancel()
        taken.cancel()
        await asyncio.sleep(0.3)
        assert queued.done()  # withdrawn at once
        assert not taken.done()  # its cancellation waits for its transaction
        await blocker.rollback()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(taken, 10)
        # Its cancellation ended once the write had landed.
        assert 1 in await checkpoints_of(store, "r")
        with pytest.raises(asyncio.CancelledError):
            await queued
        await asyncio.wait_for(first, 10)
    finally:
        await blocker.close()
        await cancelled(*tasks)
    # The one still queued never reached the database, nor will: nothing is left to commit.
    await store.driver.commits.drain()
    assert await checkpoints_of(store, "r") == [0, 1]


async def test_a_cancelled_callers_wait_for_its_write_is_bounded(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction that waits on a lock held elsewhere does not hold its cancelled caller
    (a stopping worker) for as long: SETTLE seconds, as a cancelled statement gets."""
    monkeypatch.setattr(commit, "SETTLE", 0.2)
    lease, blocker = await locked_run(store)
    tasks: list[asyncio.Task[Any]] = []
    try:
        tasks.append(asyncio.create_task(store.write_checkpoint(lease, checkpoint(0), NOW + 1)))
        await asyncio.sleep(0.05)
        taken = asyncio.create_task(store.write_checkpoint(lease, checkpoint(1), NOW + 1))
        tasks.append(taken)
        await committers_busy(store, 2)
        taken.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(taken, 10)  # while the lock is still held
        assert await checkpoints_of(store, "r") == []
    finally:
        await blocker.rollback()
        await blocker.close()
        await asyncio.gather(*tasks[:1], return_exceptions=True)
        await cancelled(*tasks)


async def test_a_claim_cancelled_while_queued_claims_nothing(store: PostgresStore) -> None:
    await store.create_run(new("busy"), NOW)
    await store.create_run(new("free"), NOW)
    (run,) = await store.claim_runs("w", [WF], NOW, NOW + LEASE, 1)
    assert run.id == "busy"
    lease = lease_of(run)
    blocker = await connect_in(store.driver.url)
    tasks: list[asyncio.Task[Any]] = []
    try:
        await blocker.execute("SELECT 1 FROM tether_runs WHERE id = 'busy' FOR UPDATE")
        tasks += [asyncio.create_task(store.write_checkpoint(lease, checkpoint(seq), NOW + 1))
                  for seq in range(2)]  # fmt: skip
        await committers_busy(store, 2)
        claim = asyncio.create_task(store.claim_runs("w", [WF], NOW, NOW + LEASE, 1))
        tasks.append(claim)
        await asyncio.sleep(0.05)
        claim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(claim, 10)
        await blocker.rollback()  # the committers go on: the claim is not among their writes
        await asyncio.wait_for(asyncio.gather(*tasks[:2], return_exceptions=True), 10)
    finally:
        await blocker.close()
        await cancelled(*tasks)
    await store.driver.commits.drain()
    free = await store.get_run("free")
    assert free is not None
    assert (free.status.value, free.owner) == ("pending", None)

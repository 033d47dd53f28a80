"""PostgreSQL's group commit and the callers it serves: a write whose caller is cancelled never
commits after that caller has gone on. Still queued, it is withdrawn; taken into a transaction,
the caller's cancellation waits until it has landed (a stopping worker's claim that committed
after the worker released its runs kept a run leased to a worker that was gone)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from tests.contract.test_store_contract import LEASE, NOW, WF, checkpoint, lease_of, new
from tests.postgres_server import with_schema

from tether.store.postgres import PostgresStore, parse_postgres_url


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[PostgresStore]:
    backend = PostgresStore(with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}"))
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()


async def blocker_of(store: PostgresStore) -> psycopg.AsyncConnection[Any]:
    """A connection of its own on the store's schema, in a transaction (not autocommit)."""
    conninfo, schema = parse_postgres_url(store.driver.url)
    conn = await psycopg.AsyncConnection.connect(conninfo)
    await conn.execute(f'SET search_path TO "{schema}"')
    return conn


async def committers_busy(store: PostgresStore, count: int) -> None:
    """Until `count` writes are taken into transactions (none left queued)."""
    commits = store.driver.commits
    for _ in range(500):
        if commits._committers >= count and not commits._queued:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the writes were never taken into transactions")


async def test_a_cancelled_write_is_withdrawn_while_queued_and_waited_for_once_taken(
    store: PostgresStore,
) -> None:
    await store.create_run(new("r"), NOW)
    (run,) = await store.claim_runs("w", [WF], NOW, NOW + LEASE, 1)
    lease = lease_of(run)
    blocker = await blocker_of(store)
    try:
        # The run's row locked: every checkpoint write of it waits on the lock.
        await blocker.execute("SELECT 1 FROM tether_runs WHERE id = 'r' FOR UPDATE")
        first = asyncio.create_task(store.write_checkpoint(lease, checkpoint(0), NOW + 1))
        await asyncio.sleep(0.05)  # alone: committing in its own task
        taken = asyncio.create_task(store.write_checkpoint(lease, checkpoint(1), NOW + 1))
        await committers_busy(store, 2)  # a committer took it
        queued = asyncio.create_task(store.write_checkpoint(lease, checkpoint(2), NOW + 1))
        await asyncio.sleep(0.05)
        assert store.driver.commits._queued  # no committer is free for it
        queued.cancel()
        taken.cancel()
        await asyncio.sleep(0.3)
        assert queued.done()  # withdrawn at once
        assert not taken.done()  # its cancellation waits for its transaction
        await blocker.rollback()
        for task in (taken, queued):
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
        await asyncio.wait_for(first, 10)
    finally:
        await blocker.close()
    # The write taken into a transaction landed before its caller's cancellation ended; the
    # one still queued never reached the database, nor will.
    await asyncio.sleep(0.2)
    assert [c.seq for c in await store.load_history("r")] == [0, 1]


async def test_a_claim_cancelled_while_queued_claims_nothing(store: PostgresStore) -> None:
    await store.create_run(new("busy"), NOW)
    await store.create_run(new("free"), NOW)
    (run,) = await store.claim_runs("w", [WF], NOW, NOW + LEASE, 1)
    assert run.id == "busy"
    lease = lease_of(run)
    blocker = await blocker_of(store)
    try:
        await blocker.execute("SELECT 1 FROM tether_runs WHERE id = 'busy' FOR UPDATE")
        writes = [asyncio.create_task(store.write_checkpoint(lease, checkpoint(seq), NOW + 1))
                  for seq in range(2)]  # fmt: skip
        await committers_busy(store, 2)
        claim = asyncio.create_task(store.claim_runs("w", [WF], NOW, NOW + LEASE, 1))
        await asyncio.sleep(0.05)
        claim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(claim, 10)
        await blocker.rollback()  # the committers go on: the claim is not among their writes
        await asyncio.wait_for(asyncio.gather(*writes, return_exceptions=True), 10)
    finally:
        await blocker.close()
    await asyncio.sleep(0.2)
    free = await store.get_run("free")
    assert free is not None
    assert (free.status.value, free.owner) == ("pending", None)

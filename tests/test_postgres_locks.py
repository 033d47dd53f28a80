"""PostgreSQL's row locks and the heartbeat: extending many leases never waits on a run's row
that another transaction holds, since a wait there, with the rows extended so far locked, can
deadlock with that transaction (a commit of the same worker's checkpoints and ends: deadlocks
that failed runs' ends under load). A lease skipped so is neither extended nor reported lost."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.contract.test_store_contract import LEASE, NOW, WF, lease_of, new
from tests.postgres_server import connect_in

from tether.store.port import Lease
from tether.store.postgres import PostgresStore


@pytest.fixture
def store(postgres_store: PostgresStore) -> PostgresStore:
    return postgres_store


async def claimed(store: PostgresStore, *ids: str) -> list[Lease]:
    for run_id in ids:
        await store.create_run(new(run_id), NOW)
    runs = await store.claim_runs("w1", [WF], NOW, NOW + LEASE, len(ids))
    return sorted((lease_of(r) for r in runs), key=lambda lease: lease.run_id)


async def test_a_heartbeat_and_a_commit_locking_the_same_runs_never_deadlock(
    store: PostgresStore,
) -> None:
    a, b = await claimed(store, "a", "b")
    async with await connect_in(store.driver.url) as commit:
        # A commit of this worker's holds run b's row (a checkpoint's share lock) and will
        # end run a next; the heartbeat extends a, then comes to b.
        await commit.execute("SELECT 1 FROM tether_runs WHERE id = 'b' FOR SHARE")
        beat = asyncio.create_task(store.heartbeat("w1", [a, b], NOW + 100, NOW + 5))
        # It answers while b is held: before, it waited there with a extended and locked,
        # and the commit's next statement, on a, made the deadlock.
        reply = await asyncio.wait_for(asyncio.shield(beat), 10)
        await commit.execute("UPDATE tether_runs SET updated_at = 1 WHERE id = 'a'")
        await commit.commit()
    assert (reply.lost, reply.cancel) == ([], [])  # b was busy, not lost
    (run_a,) = [r for r in await store.list_runs(limit=10) if r.id == "a"]
    (run_b,) = [r for r in await store.list_runs(limit=10) if r.id == "b"]
    assert (run_a.lease_expires_at, run_b.lease_expires_at) == (NOW + 100, NOW + LEASE)
    again = await store.heartbeat("w1", [a, b], NOW + 200, NOW + 6)  # b free: extended now
    assert (again.lost, again.cancel) == ([], [])
    run = await store.get_run("b")
    assert run is not None
    assert run.lease_expires_at == NOW + 200


async def test_a_lease_skipped_for_its_lock_is_still_reported_lost_once_lost(
    store: PostgresStore,
) -> None:
    (a,) = await claimed(store, "a")
    stale = Lease(a.run_id, a.worker_id, a.epoch - 1)
    async with await connect_in(store.driver.url) as commit:
        await commit.execute("SELECT 1 FROM tether_runs WHERE id = 'a' FOR SHARE")
        reply = await asyncio.wait_for(store.heartbeat("w1", [stale], NOW + 100, NOW + 5), 10)
        await commit.rollback()
    assert reply.lost == ["a"]  # its epoch is not the run's: lost, lock or no lock


async def test_a_heartbeat_of_many_leases_is_one_statement(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    leases = await claimed(store, *(f"r{i:03}" for i in range(200)))
    sent: list[str] = []
    statements = store.driver.statements
    real = statements.execute

    async def counted(conn: Any, tx: Any, query: Any) -> Any:
        sent.append(query.name)
        return await real(conn, tx, query)

    monkeypatch.setattr(statements, "execute", counted)
    reply = await store.heartbeat("w1", leases, NOW + 100, NOW + 5)
    assert (reply.lost, reply.cancel, reply.unknown) == ([], [], True)  # w1 never registered
    assert sent == ["extend_leases", "touch_worker"]

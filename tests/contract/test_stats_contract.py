"""The Store contract for `stats()` (what /metrics reads at scrape time), run once per backend.

Same rules as test_store_contract: times are plain floats chosen by each test, nothing sleeps,
and every backend must give the answers the memory store gives.
"""

from __future__ import annotations

from tests.contract.test_approval_contract import approval, decide, running
from tests.contract.test_store_contract import NOW, claim_one, get, lease_of, new

from tether.store.port import RunStatus, Store, StoreStats


async def test_stats_of_an_empty_store_count_zero_for_every_status(store: Store) -> None:
    stats = await store.stats()
    assert stats == StoreStats(
        runs={status: 0 for status in RunStatus},
        pending_approvals=0,
        oldest_pending_approval_at=None,
    )
    assert list(stats.runs) == list(RunStatus)


async def test_stats_count_runs_by_status(store: Store) -> None:
    for run_id in ("p1", "p2", "p3", "s1", "f1", "c1"):
        await store.create_run(new(run_id), NOW)
    # Claims take the oldest first; ties on created_at break by id: c1, f1, p1, p2, p3, s1.
    c1 = await claim_one(store, now=NOW + 1)
    f1 = await claim_one(store, now=NOW + 1)
    await claim_one(store, now=NOW + 1)  # p1 stays running
    await store.finish_run(lease_of(c1), RunStatus.CANCELLED, None, '{"type": "x"}', NOW + 2)
    await store.finish_run(lease_of(f1), RunStatus.FAILED, None, '{"type": "x"}', NOW + 2)
    p2 = await claim_one(store, now=NOW + 3)
    await store.suspend_run(lease_of(p2), NOW + 100, NOW + 3)
    p3 = await claim_one(store, now=NOW + 3)
    await store.fail_execution(lease_of(p3), '{"type": "x"}', 5, None, NOW + 3)  # dead
    await store.create_run(new("done"), NOW + 4, owner="w9", lease_until=NOW + 30)
    done = await get(store, "done")
    await store.finish_run(lease_of(done), RunStatus.SUCCEEDED, "1", None, NOW + 5)
    await store.create_run(new("h1"), NOW + 5, owner="w9", lease_until=NOW + 30)
    await store.hold_run(lease_of(await get(store, "h1")), '{"type": "x"}', 1, NOW + 60, NOW + 5)

    stats = await store.stats()
    assert dict(stats.runs) == {
        RunStatus.PENDING: 1,  # s1
        RunStatus.RUNNING: 1,  # p1
        RunStatus.WAITING: 1,  # p2
        RunStatus.HELD: 1,  # h1
        RunStatus.SUCCEEDED: 1,
        RunStatus.FAILED: 1,
        RunStatus.CANCELLED: 1,
        RunStatus.DEAD: 1,  # p3
    }
    assert sum(stats.runs.values()) == len(await store.list_runs(limit=100)) == 8


async def test_stats_count_pending_approvals_and_the_oldest_creation_time(store: Store) -> None:
    lease = await running(store, "r1")
    await running(store, "r2")
    for approval_id, run_id, at in (("a", "r1", NOW + 7.25), ("b", "r2", NOW + 3.5),
                                    ("c", "r1", NOW + 9.0)):  # fmt: skip
        _, made = await store.create_approval(
            lease if run_id == "r1" else lease_of(await get(store, run_id)),
            approval(approval_id, run_id, created_at=at),
            at,
        )
        assert made
    stats = await store.stats()
    assert (stats.pending_approvals, stats.oldest_pending_approval_at) == (3, NOW + 3.5)

    await store.change_approval("b", decide(), NOW + 10)  # the oldest is decided
    stats = await store.stats()
    assert (stats.pending_approvals, stats.oldest_pending_approval_at) == (2, NOW + 7.25)
    assert stats.runs[RunStatus.RUNNING] == 2

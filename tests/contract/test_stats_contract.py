"""The Store contract for `stats()` (what /metrics reads at scrape time), run once per backend.

Same rules as test_store_contract: times are plain floats chosen by each test, nothing sleeps,
and every backend must give the answers the memory store gives.
"""

from __future__ import annotations

import dataclasses

from tests.contract.test_approval_contract import approval, decide, running
from tests.contract.test_outbox_contract import DELIVERED, record, worker
from tests.contract.test_store_contract import NOW, claim_one, get, lease_of, new

from tether.store.port import RunStatus, Store, StoreStats
from tether.store.port.outbox import OutboxSettlement, OutboxStatus


async def test_stats_of_an_empty_store_count_zero_for_every_status(store: Store) -> None:
    stats = await store.stats(NOW)
    assert stats == StoreStats(
        runs={status: 0 for status in RunStatus},
        pending_approvals=0,
        oldest_pending_approval_at=None,
        due={},
        outbox={"pending": 0, "sending": 0, "failed": 0},
        outbox_in_doubt=0,
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

    stats = await store.stats(NOW + 10)
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
    stats = await store.stats(NOW + 10)
    assert (stats.pending_approvals, stats.oldest_pending_approval_at) == (3, NOW + 3.5)

    await store.change_approval("b", decide(), NOW + 10)  # the oldest is decided
    stats = await store.stats(NOW + 10)
    assert (stats.pending_approvals, stats.oldest_pending_approval_at) == (2, NOW + 7.25)
    assert stats.runs[RunStatus.RUNNING] == 2


async def test_stats_count_the_runs_a_claim_would_take_now_by_queue(store: Store) -> None:
    def queued(run_id: str, queue: str | None, wake_at: float | None = None) -> object:
        return dataclasses.replace(new(run_id), queue=queue, wake_at=wake_at)

    await store.create_run(queued("free", None), NOW)  # due now, outside queues
    await store.create_run(queued("mail1", "mail"), NOW)
    await store.create_run(queued("later", "mail", wake_at=NOW + 50), NOW)  # start_at
    await store.create_run(queued("held", "mail"), NOW, owner="w9", lease_until=NOW + 30)
    await store.create_run(queued("sleeps", "bulk"), NOW, owner="w9", lease_until=NOW + 30)
    await store.suspend_run(lease_of(await get(store, "sleeps")), NOW + 100, NOW)
    await store.create_run(queued("done", "bulk"), NOW, owner="w9", lease_until=NOW + 30)
    await store.finish_run(lease_of(await get(store, "done")), RunStatus.SUCCEEDED, "1", None,
                           NOW)  # fmt: skip

    assert (await store.stats(NOW + 1)).due == {"": 1, "mail": 1}
    # `later` wakes, `held`'s lease expired (a claim adopts it); `sleeps` still waits.
    assert (await store.stats(NOW + 60)).due == {"": 1, "mail": 3}
    assert (await store.stats(NOW + 100)).due == {"": 1, "bulk": 1, "mail": 3}
    await claim_one(store, now=NOW + 100)  # a claim takes what the count said was due
    assert sum((await store.stats(NOW + 100)).due.values()) == 4


async def test_stats_count_the_outbox_backlog_by_status_and_the_messages_in_doubt(
    store: Store,
) -> None:
    await worker(store, "w1")
    await worker(store, "w2")
    lease = await running(store, "r1")
    await record(store, lease, ["m1", "m2", "m3", "m4"])
    first, second, third = await store.claim_outbox("w1", NOW, NOW + 10, 3)
    assert await store.settle_outbox(second.id, second.claim, DELIVERED, NOW + 1)
    failed = OutboxSettlement(OutboxStatus.FAILED, error='{"refused": true}')
    assert await store.settle_outbox(third.id, third.claim, failed, NOW + 1)
    stats = await store.stats(NOW + 2)
    assert (stats.outbox, stats.outbox_in_doubt) == ({"pending": 1, "sending": 1, "failed": 1}, 0)

    # w1's claim expired: w2 takes that message again (in doubt) and the pending one.
    taken = {m.id: m for m in await store.claim_outbox("w2", NOW + 10, NOW + 70, 2)}
    assert {i: m.in_doubt for i, m in taken.items()} == {first.id: True, "m4": False}
    stats = await store.stats(NOW + 11)
    assert (stats.outbox, stats.outbox_in_doubt) == ({"pending": 0, "sending": 2, "failed": 1}, 1)
    assert await store.settle_outbox(first.id, taken[first.id].claim, DELIVERED, NOW + 12)
    stats = await store.stats(NOW + 13)
    assert (stats.outbox, stats.outbox_in_doubt) == ({"pending": 0, "sending": 1, "failed": 1}, 0)

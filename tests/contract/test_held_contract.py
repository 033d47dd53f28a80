"""The Store contract for held runs (replay diverged from the history), run once per backend:
hold_run leaves a run unfinished and claimable again at its backoff, wake_held makes held runs
due when new code comes, and a held run is cancelled, resumed and deduplicated like any other
unfinished run. Also the pages of list_runs and the database's clock.

Same rules as test_store_contract: times are plain floats chosen by each test, nothing sleeps.
"""

from __future__ import annotations

import time

import pytest
from tests.contract.test_approval_contract import approval, created
from tests.contract.test_store_contract import LEASE, NOW, WF, claim_one, get, lease_of, new

from tether.errors import DuplicateRun, LeaseLost
from tether.store.port import Lease, NewRun, RunStatus, Store
from tether.store.port.approvals import PENDING

DIVERGED = '{"type": "tether.errors.NonDeterminismError", "message": "renamed"}'


async def held(store: Store, run_id: str = "r1", wake_at: float = NOW + 60) -> Lease:
    await store.create_run(new(run_id), NOW)
    lease = lease_of(await claim_one(store))
    await store.hold_run(lease, DIVERGED, 1, wake_at, NOW + 1)
    return lease


async def test_hold_run_leaves_the_run_unfinished_with_what_differed(store: Store) -> None:
    await held(store)
    run = await get(store, "r1")
    assert (run.status, run.error, run.failures) == (RunStatus.HELD, DIVERGED, 1)
    assert (run.owner, run.lease_expires_at, run.wake_at, run.finished_at) == (
        None, None, NOW + 60, None,
    )  # fmt: skip
    assert not run.status.terminal


async def test_a_held_run_is_claimed_again_at_its_wake_time_and_not_before(store: Store) -> None:
    await held(store)
    assert await store.claim_runs("w2", [WF], NOW + 59, NOW + 59 + LEASE, 5) == []
    assert await store.next_wake_at([WF]) == NOW + 60
    again = await claim_one(store, "w2", NOW + 60)
    assert (again.id, again.status, again.epoch) == ("r1", RunStatus.RUNNING, 2)


async def test_hold_run_is_fenced_by_the_lease(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    lease = lease_of(await claim_one(store))
    stale = Lease(lease.run_id, lease.worker_id, lease.epoch - 1)
    with pytest.raises(LeaseLost):
        await store.hold_run(stale, DIVERGED, 1, NOW + 60, NOW + 1)
    assert (await get(store, "r1")).status is RunStatus.RUNNING


async def test_a_held_runs_approvals_stay_pending_and_its_parent_is_not_told(
    store: Store,
) -> None:
    await store.create_run(new("parent"), NOW)
    kid = NewRun("kid", WF, "{}", parent_id="parent")
    await store.create_run(kid, NOW + 1, owner="w1", lease_until=NOW + LEASE)
    await created(store, approval("ap-1", "kid"))
    await store.hold_run(Lease("kid", "w1", 1), DIVERGED, 1, NOW + 60, NOW + 2)
    found = await store.get_approval("ap-1")
    assert found is not None
    assert found.status == PENDING
    assert await store.events_after(0) == []  # no end of the child in the parent's mailbox


async def test_wake_held_makes_the_held_runs_of_these_workflows_due_now(store: Store) -> None:
    await held(store, "r1", NOW + 600)
    await store.create_run(NewRun("other", "wf-other", "{}"), NOW)
    lease = lease_of((await store.claim_runs("w1", ["wf-other"], NOW, NOW + LEASE, 1))[0])
    await store.hold_run(lease, DIVERGED, 1, NOW + 600, NOW + 1)
    assert await store.wake_held([WF], NOW + 5) == 1
    assert (await get(store, "r1")).wake_at == NOW + 5
    assert (await get(store, "other")).wake_at == NOW + 600  # another workflow's: left
    assert await store.wake_held([WF], NOW + 6) == 0  # already due


async def test_a_held_run_is_cancelled_at_once(store: Store) -> None:
    await held(store)
    run = await store.cancel_run("r1", '{"type": "Cancelled"}', NOW + 2)
    assert (run.status, run.finished_at) == (RunStatus.CANCELLED, NOW + 2)


async def test_resume_makes_a_held_run_pending_at_once(store: Store) -> None:
    await held(store)
    run = await store.resume_run("r1", NOW + 2, None)
    assert (run.status, run.error, run.wake_at, run.failures) == (RunStatus.PENDING, None, None, 0)


async def test_a_held_run_keeps_its_dedup_key(store: Store) -> None:
    await store.create_run(NewRun("r1", WF, "{}", dedup_key="k"), NOW)
    await store.hold_run(lease_of(await claim_one(store)), DIVERGED, 1, NOW + 60, NOW + 1)
    with pytest.raises(DuplicateRun):
        await store.create_run(NewRun("r2", WF, "{}", dedup_key="k"), NOW + 2)


async def test_held_runs_are_never_dead_lettered_as_unserved(store: Store) -> None:
    await held(store, wake_at=NOW + 1)

    def error(run_id: str, workflow: str) -> str:
        return '{"type": "NoWorker"}'

    assert await store.dead_letter_unserved(NOW + 10_000, error, NOW + 10_001) == []
    assert (await get(store, "r1")).status is RunStatus.HELD


# -- pages and the clock ---------------------------------------------------------------------


async def test_list_runs_pages_newest_first_by_created_at_then_id(store: Store) -> None:
    for i, run_id in enumerate(["a", "b", "c", "d", "e"]):
        await store.create_run(new(run_id), NOW + (i // 2))  # a,b at NOW; c,d at +1; e at +2
    first = await store.list_runs(limit=2)
    assert [r.id for r in first] == ["e", "d"]
    second = await store.list_runs(limit=2, before=(first[-1].created_at, first[-1].id))
    assert [r.id for r in second] == ["c", "b"]
    third = await store.list_runs(limit=2, before=(second[-1].created_at, second[-1].id))
    assert [r.id for r in third] == ["a"]
    held_only = await store.list_runs(statuses=[RunStatus.HELD], limit=5, before=(NOW + 9, ""))
    assert held_only == []


async def test_database_time_is_the_servers_clock_or_none(store: Store) -> None:
    seen = await store.database_time()
    if store.url.startswith("postgres"):
        assert seen is not None
        assert abs(seen - time.time()) < 5.0  # the test server runs on this machine
    else:
        assert seen is None  # one machine's clock is the one clock

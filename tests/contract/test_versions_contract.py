"""The Store contract for versions, run once per backend: a run is pinned to the version of its
first claim (or of the worker that created it claimed), claims and wake times keep to it,
move_version re-pins it, version_counts counts the unfinished runs of each, and a worker's row
keeps its version.

Same rules as test_store_contract: times are plain floats chosen by each test, nothing sleeps.
"""

from __future__ import annotations

import pytest
from tests.contract.test_store_contract import LEASE, NOW, WF, get, lease_of, new

from tether.errors import RunNotFound
from tether.store.port import RunStatus, Store, WorkerInfo


async def claim(store: Store, worker: str, version: str | None, now: float = NOW) -> list[str]:
    claimed = await store.claim_runs(worker, [WF], now, now + LEASE, 10, version=version)
    return sorted(r.id for r in claimed)


async def test_a_first_claim_pins_the_run_to_the_claiming_workers_version(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    assert (await get(store, "r1")).version is None  # created pending: not pinned yet
    [claimed] = await store.claim_runs("w1", [WF], NOW, NOW + LEASE, 1, version="v1")
    assert claimed.version == "v1"
    assert (await get(store, "r1")).version == "v1"


async def test_a_run_pinned_to_a_version_is_claimed_only_by_workers_of_that_version(
    store: Store,
) -> None:
    await store.create_run(new("r1"), NOW)
    assert await claim(store, "w1", "v1") == ["r1"]
    # Its lease runs out (its worker died): a worker of another version still may not take it.
    expired = NOW + LEASE + 1
    assert await claim(store, "w2", "v2", expired) == []
    assert await store.next_wake_at([WF], version="v2") is None
    assert await claim(store, "w3", "v1", expired) == ["r1"]
    assert (await get(store, "r1")).owner == "w3"


async def test_a_claim_without_a_version_takes_any_run_and_pins_none(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    await store.create_run(new("r2"), NOW)
    assert await claim(store, "w1", "v1") == ["r1", "r2"]
    await store.create_run(new("r3"), NOW)
    assert await claim(store, "old", None, NOW + LEASE + 1) == ["r1", "r2", "r3"]
    assert [(await get(store, r)).version for r in ("r1", "r2", "r3")] == ["v1", "v1", None]


async def test_a_run_created_claimed_is_pinned_to_the_version_its_owner_declares(
    store: Store,
) -> None:
    await store.register_worker(WorkerInfo("w1", "h", 1, "a", version="v7"), NOW)
    created, _ = await store.create_run(
        new("r1"), NOW, owner="w1", lease_until=NOW + LEASE, version="v7"
    )
    assert created.version == "v7"
    assert (await get(store, "r1")).version == "v7"
    [worker] = await store.list_workers()
    assert worker.version == "v7"


async def test_next_wake_at_leaves_out_the_runs_of_other_versions(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    [claimed] = await store.claim_runs("w1", [WF], NOW, NOW + LEASE, 1, version="v1")
    await store.suspend_run(lease_of(claimed), NOW + 50, NOW + 1)
    assert await store.next_wake_at([WF], version="v1") == NOW + 50
    assert await store.next_wake_at([WF]) == NOW + 50
    assert await store.next_wake_at([WF], version="v2") is None


async def test_move_version_repins_an_unfinished_run_for_the_next_claim(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    [claimed] = await store.claim_runs("w1", [WF], NOW, NOW + LEASE, 1, version="v1")
    await store.suspend_run(lease_of(claimed), NOW + 5, NOW + 1)
    moved = await store.move_version("r1", "v2", NOW + 2)
    assert (moved.version, moved.status) == ("v2", RunStatus.WAITING)
    assert await claim(store, "w1", "v1", NOW + 5) == []
    assert await claim(store, "w2", "v2", NOW + 5) == ["r1"]
    # Unpinned: the next claim, of whatever version, pins it again.
    await store.move_version("r1", None, NOW + 6)
    assert await claim(store, "w3", "v3", NOW + LEASE + 10) == ["r1"]
    assert (await get(store, "r1")).version == "v3"


async def test_move_version_leaves_a_finished_run_and_refuses_an_unknown_id(
    store: Store,
) -> None:
    await store.create_run(new("r1"), NOW)
    [claimed] = await store.claim_runs("w1", [WF], NOW, NOW + LEASE, 1, version="v1")
    await store.finish_run(lease_of(claimed), RunStatus.SUCCEEDED, "1", None, NOW + 1)
    assert (await store.move_version("r1", "v2", NOW + 2)).version == "v1"
    with pytest.raises(RunNotFound):
        await store.move_version("nope", "v2", NOW + 2)


async def test_version_counts_counts_unfinished_runs_by_version(store: Store) -> None:
    assert await store.version_counts() == {}
    for run_id in ("r1", "r2", "r3", "r4"):
        await store.create_run(new(run_id), NOW)
    first = await store.claim_runs("w1", [WF], NOW, NOW + LEASE, 2, version="v1")
    [other] = await store.claim_runs("w2", [WF], NOW, NOW + LEASE, 1, version="v2")
    await store.finish_run(lease_of(first[0]), RunStatus.SUCCEEDED, "1", None, NOW + 1)
    assert await store.version_counts() == {"v1": 1, "v2": 1, None: 1}
    assert other.version == "v2"


async def test_resume_unpins_a_run_so_the_fixed_code_takes_it(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    [claimed] = await store.claim_runs("w1", [WF], NOW, NOW + LEASE, 1, version="v1")
    await store.finish_run(lease_of(claimed), RunStatus.FAILED, None, '{"type": "E"}', NOW + 1)
    resumed = await store.resume_run("r1", NOW + 2, None)
    assert (resumed.status, resumed.version) == (RunStatus.PENDING, None)
    assert await claim(store, "w2", "v2", NOW + 3) == ["r1"]
    assert (await get(store, "r1")).version == "v2"


async def test_a_run_of_a_version_without_live_workers_is_taken_over_with_live_since(
    store: Store,
) -> None:
    await store.register_worker(WorkerInfo("old", "h", 1, "a", version="v1"), NOW)
    await store.create_run(new("r1"), NOW)
    assert await claim(store, "old", "v1") == ["r1"]
    later = NOW + LEASE + 1  # its lease ran out; was its version's last worker alive since?

    async def take(live_since: float | None) -> list[str]:
        claimed = await store.claim_runs("new", [WF], later, later + LEASE, 10, version="v2",
                                         live_since=live_since)  # fmt: skip
        return [r.id for r in claimed]

    assert await store.next_wake_at([WF], version="v2", live_since=NOW) is None
    assert await take(NOW) == []  # a v1 worker heartbeated at NOW: v1 lives, the run is its own
    assert await take(None) == []  # no handoff asked: it waits for v1 or a move
    assert await store.next_wake_at([WF], version="v2", live_since=NOW + 1) == NOW + LEASE
    assert await take(NOW + 1) == ["r1"]  # v1 went quiet: v2 takes it over, and pins it
    assert (await get(store, "r1")).version == "v2"

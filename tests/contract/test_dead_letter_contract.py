"""The Store contract for poison runs, run once per backend: fail_execution (a failed execution
counted on the run, which waits out a backoff or ends dead), dead_letter_unserved (runs whose
workflow no live worker serves), the workflows of a worker's row, and how dead runs resume.

Same rules as test_store_contract: times are plain floats chosen by each test, nothing sleeps,
and every backend must give the answers the memory store gives.
"""

from __future__ import annotations

import json

import pytest
from tests.contract.test_approval_contract import approval, created, running
from tests.contract.test_store_contract import (
    LEASE,
    NOW,
    WF,
    checkpoint,
    claim_one,
    get,
    lease_of,
    new,
    stored,
    wait_checkpoint,
)

from tether.errors import LeaseLost
from tether.store.keys import child_key
from tether.store.port import Lease, NewRun, RunStatus, Store, WorkerInfo
from tether.store.port.approvals import CANCELLED

ERROR = '{"type": "tether.errors.SerializationError", "message": "cannot load step"}'


def unserved_error(run_id: str, workflow: str) -> str:
    return json.dumps({"type": "NoWorker", "message": f"{run_id} of {workflow}"})


# -- fail_execution ----------------------------------------------------------------------------


async def test_fail_execution_with_retry_at_releases_the_run_waiting_with_its_error_and_count(
    store: Store,
) -> None:
    await store.create_run(new("r1"), NOW)
    claimed = await claim_one(store)
    await store.fail_execution(lease_of(claimed), ERROR, 2, NOW + 10, NOW + 1)
    run = await get(store, "r1")
    assert (run.status, run.owner, run.lease_expires_at) == (RunStatus.WAITING, None, None)
    assert (run.wake_at, run.wake_on, run.finished_at) == (NOW + 10, (), None)
    assert (run.error, run.failures, run.epoch, run.updated_at) == (ERROR, 2, 1, NOW + 1)
    assert await store.claim_runs("w2", [WF], NOW + 9, NOW + 9 + LEASE, 5) == []
    assert await store.next_wake_at([WF]) == NOW + 10
    again = await claim_one(store, "w2", now=NOW + 10)
    assert (again.id, again.epoch, again.failures, again.error) == ("r1", 2, 2, ERROR)
    with pytest.raises(LeaseLost):  # the failed execution's lease is gone
        await store.write_checkpoint(lease_of(claimed), checkpoint(0), NOW + 11)


async def test_fail_execution_is_fenced_by_the_lease(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    claimed = await claim_one(store)
    with pytest.raises(LeaseLost):
        await store.fail_execution(Lease("r1", "w1", 7), ERROR, 1, NOW + 5, NOW + 1)
    with pytest.raises(LeaseLost):
        await store.fail_execution(Lease("r1", "w1", 7), ERROR, 5, None, NOW + 1)
    assert await get(store, "r1") == claimed


async def test_fail_execution_without_retry_at_ends_the_run_dead_and_tells_its_parent(
    store: Store,
) -> None:
    await store.create_run(new("parent"), NOW)
    parent = lease_of(await claim_one(store, "w1"))
    await store.suspend_run(parent, None, NOW, wake_on=[child_key("kid")])
    await store.create_run(NewRun("kid", WF, "{}", parent_id="parent"), NOW, owner="w1",
                           lease_until=NOW + LEASE)  # fmt: skip
    kid = await get(store, "kid")
    await store.fail_execution(lease_of(kid), ERROR, 5, None, NOW + 2)
    dead = await get(store, "kid")
    assert (dead.status, dead.error, dead.failures) == (RunStatus.DEAD, ERROR, 5)
    assert (dead.owner, dead.lease_expires_at, dead.finished_at) == (None, None, NOW + 2)
    assert dead.status.terminal
    assert await store.claim_runs("w2", [WF], NOW + 99, NOW + 99 + LEASE, 5) == [
        await get(store, "parent")  # only the parent, woken by its child's end
    ]
    taken = await store.take_event(Lease("parent", "w2", 2), [child_key("kid")],
                                   wait_checkpoint(0), NOW + 99)  # fmt: skip
    assert taken is not None
    assert json.loads(taken)["value"] == {"status": "dead", "result": None, "error": ERROR}
    before = await store.last_event_id()
    assert (await store.deliver_event("kid", "go", "1", NOW + 100)).status is RunStatus.DEAD
    assert await store.last_event_id() == before  # a dead run takes no events


async def test_a_run_that_ends_dead_cancels_its_pending_approvals(store: Store) -> None:
    lease = await running(store, "r1")
    await created(store, approval("a1", "r1"))
    await store.fail_execution(lease, ERROR, 3, None, NOW + 4)
    stored = await store.get_approval("a1")
    assert stored is not None
    assert stored.status == CANCELLED
    audit = await store.approval_audit("a1")
    assert [e.event for e in audit] == ["created", "cancelled"]
    assert json.loads(audit[-1].detail) == {"reason": "the run ended (dead)"}


async def test_cancelling_a_parent_leaves_its_dead_child_dead(store: Store) -> None:
    await store.create_run(new("parent"), NOW)
    await store.create_run(NewRun("kid", WF, "{}", parent_id="parent"), NOW, owner="w1",
                           lease_until=NOW + LEASE)  # fmt: skip
    await store.fail_execution(lease_of(await get(store, "kid")), ERROR, 5, None, NOW + 1)
    await store.cancel_run("parent", '{"type": "RunCancelled"}', NOW + 2)
    assert (await get(store, "parent")).status is RunStatus.CANCELLED
    kid = await get(store, "kid")
    assert (kid.status, kid.error, kid.finished_at) == (RunStatus.DEAD, ERROR, NOW + 1)


async def test_suspending_after_progress_resets_the_failures_and_their_error(
    store: Store,
) -> None:
    await store.create_run(new("r1"), NOW)
    await store.fail_execution(lease_of(await claim_one(store)), ERROR, 3, NOW + 1, NOW)
    again = await claim_one(store, now=NOW + 1)
    assert again.failures == 3
    await store.suspend_run(lease_of(again), NOW + 50, NOW + 2)
    run = await get(store, "r1")
    assert (run.status, run.failures, run.error, run.wake_at) == (
        RunStatus.WAITING, 0, None, NOW + 50
    )  # fmt: skip


async def test_finish_run_keeps_the_failures_that_came_before(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    await store.fail_execution(lease_of(await claim_one(store)), ERROR, 2, NOW + 1, NOW)
    again = await claim_one(store, now=NOW + 1)
    await store.finish_run(lease_of(again), RunStatus.SUCCEEDED, "7", None, NOW + 2)
    run = await get(store, "r1")
    assert (run.status, run.result, run.error, run.failures) == (
        RunStatus.SUCCEEDED, "7", None, 2
    )  # fmt: skip


# -- resume ------------------------------------------------------------------------------------


async def test_resume_run_makes_a_dead_run_pending_with_no_failures(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    lease = lease_of(await claim_one(store))
    await store.write_checkpoint(lease, checkpoint(0, "fetch"), NOW)
    await store.fail_execution(lease, ERROR, 5, None, NOW + 1)
    resumed = await store.resume_run("r1", NOW + 5, None)
    assert (resumed.status, resumed.error, resumed.failures) == (RunStatus.PENDING, None, 0)
    assert (resumed.finished_at, resumed.owner, resumed.updated_at) == (None, None, NOW + 5)
    assert await store.load_history("r1") == [stored(checkpoint(0, "fetch"), lease)]  # replays
    again = await claim_one(store, now=NOW + 6)
    assert (again.id, again.epoch, again.failures) == ("r1", 2, 0)


# -- workers and unserved runs -----------------------------------------------------------------


async def test_a_worker_row_keeps_the_workflows_it_serves(store: Store) -> None:
    await store.register_worker(WorkerInfo("w1", "h", 1, "a", workflows=("b", "a")), NOW)
    await store.register_worker(WorkerInfo("w2", "h", 2, "b"), NOW)  # an older worker
    await store.register_worker(WorkerInfo("w3", "h", 3, "c", workflows=()), NOW)
    workers = {w.id: w.workflows for w in await store.list_workers()}
    assert workers == {"w1": ("a", "b"), "w2": None, "w3": ()}
    await store.register_worker(WorkerInfo("w1", "h", 1, "a", workflows=("c",)), NOW + 1)
    assert [w.workflows for w in await store.list_workers() if w.id == "w1"] == [("c",)]


async def unserved_world(store: Store) -> None:
    """Live worker w1 serves WF; w-old, which served "gone-too", stopped heartbeating long
    ago. Runs of workflows nobody serves now: due long ago, due lately, not due at all."""
    await store.register_worker(WorkerInfo("w1", "h", 1, "a", workflows=(WF,)), NOW)
    await store.register_worker(WorkerInfo("w-old", "h", 2, "b", workflows=("gone-too",)),
                                NOW - 1000)  # fmt: skip
    await store.create_run(NewRun("sleeping", "gone", "{}"), NOW - 900)
    [sleeping] = await store.claim_runs("w-old", ["gone"], NOW - 900, NOW - 800, 5)
    await store.suspend_run(lease_of(sleeping), NOW + 1000, NOW - 899)
    await store.create_run(NewRun("orphan", "gone", "{}"), NOW - 700)
    await store.create_run(NewRun("fresh", "gone", "{}"), NOW - 100)
    await store.create_run(new("served"), NOW - 700)
    await store.create_run(NewRun("stale-lease", "gone-too", "{}"), NOW - 700, owner="w-old",
                           lease_until=NOW - 650)  # fmt: skip
    await store.create_run(NewRun("done", "gone", "{}"), NOW - 700, owner="w-old",
                           lease_until=NOW - 650)  # fmt: skip
    await store.finish_run(lease_of(await get(store, "done")), RunStatus.SUCCEEDED, "1", None,
                           NOW - 690)  # fmt: skip


async def test_dead_letter_unserved_ends_runs_long_due_whose_workflow_no_live_worker_serves(
    store: Store,
) -> None:
    await unserved_world(store)
    buried = await store.dead_letter_unserved(NOW - 600, unserved_error, NOW)
    assert buried == ["orphan", "stale-lease"]
    for run_id, workflow in (("orphan", "gone"), ("stale-lease", "gone-too")):
        run = await get(store, run_id)
        assert (run.status, run.owner, run.finished_at) == (RunStatus.DEAD, None, NOW), run_id
        assert run.error == unserved_error(run_id, workflow)
    statuses = {r.id: r.status for r in await store.list_runs()}
    assert statuses == {
        "orphan": RunStatus.DEAD, "stale-lease": RunStatus.DEAD,
        "fresh": RunStatus.PENDING,  # due for less than the grace period
        "served": RunStatus.PENDING,  # w1 serves it
        "sleeping": RunStatus.WAITING,  # not due before NOW + 1000
        "done": RunStatus.SUCCEEDED,
    }  # fmt: skip
    assert await store.dead_letter_unserved(NOW - 600, unserved_error, NOW + 1) == []


async def test_dead_letter_unserved_spares_a_workflow_a_worker_alive_since_then_serves(
    store: Store,
) -> None:
    await unserved_world(store)
    await store.register_worker(WorkerInfo("w2", "h", 3, "c", workflows=("gone",)), NOW - 599)
    assert await store.dead_letter_unserved(NOW - 600, unserved_error, NOW) == ["stale-lease"]
    assert (await get(store, "orphan")).status is RunStatus.PENDING


async def test_dead_letter_unserved_does_nothing_while_a_live_worker_serves_unknown_workflows(
    store: Store,
) -> None:
    await unserved_world(store)
    await store.register_worker(WorkerInfo("w-older", "h", 4, "d"), NOW)  # workflows None
    assert await store.dead_letter_unserved(NOW - 600, unserved_error, NOW) == []
    assert (await get(store, "orphan")).status is RunStatus.PENDING

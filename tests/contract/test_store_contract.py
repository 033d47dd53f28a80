"""The Store contract: what every backend must answer, run once per backend (see conftest).

Times are plain floats chosen by each test; nothing sleeps. A backend passes when it gives the
same answers as every other backend to the same sequence of operations.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from tether.errors import DuplicateRun, LeaseLost, RunNotFound
from tether.store.keys import child_key
from tether.store.port import (
    Checkpoint,
    CheckpointStatus,
    Lease,
    NewRun,
    QueueLimits,
    RunRecord,
    RunStatus,
    Store,
    WorkerInfo,
)

NOW = 1000.0
LEASE = 30.0
WF = "wf"


def new(run_id: str, workflow: str = WF, deadline_at: float | None = None) -> NewRun:
    return NewRun(run_id, workflow, '{"args": [], "kwargs": {}}', deadline_at=deadline_at)


def lease_of(run: RunRecord) -> Lease:
    assert run.owner is not None
    return Lease(run_id=run.id, worker_id=run.owner, epoch=run.epoch)


def checkpoint(seq: int, name: str = "step", result: str | None = "1") -> Checkpoint:
    return Checkpoint(
        seq=seq,
        name=name,
        kind="step",
        status=CheckpointStatus.COMPLETED,
        result=result,
        attempts=1,
        started_at=NOW,
        finished_at=NOW + 1,
    )


def stored(cp: Checkpoint, lease: Lease) -> Checkpoint:
    """A checkpoint as load_history gives it back: with its position (that of a row written
    without one is its seq)."""
    return dataclasses.replace(cp, position=cp.at)


async def claim_one(store: Store, worker: str = "w1", now: float = NOW) -> RunRecord:
    claimed = await store.claim_runs(worker, [WF], now, now + LEASE, 1)
    assert len(claimed) == 1
    return claimed[0]


async def get(store: Store, run_id: str) -> RunRecord:
    run = await store.get_run(run_id)
    assert run is not None
    return run


# -- create / get ------------------------------------------------------------------------------


async def test_create_run_stores_a_pending_unowned_run_with_its_fields(store: Store) -> None:
    run, created = await store.create_run(new("r1", deadline_at=NOW + 60), NOW)
    assert created
    assert run.id == "r1"
    assert run.workflow == WF
    assert run.args == '{"args": [], "kwargs": {}}'
    assert run.status is RunStatus.PENDING
    assert (run.owner, run.epoch, run.lease_expires_at, run.wake_at) == (None, 0, None, None)
    assert run.deadline_at == NOW + 60
    assert (run.created_at, run.updated_at, run.finished_at) == (NOW, NOW, None)
    assert (run.result, run.error, run.cancel_requested) == (None, None, False)
    assert await store.get_run("r1") == run


async def test_create_run_is_idempotent_by_id_and_reports_whether_it_created(
    store: Store,
) -> None:
    first, created = await store.create_run(new("r1"), NOW)
    assert created
    again, created_again = await store.create_run(
        NewRun(id="r1", workflow="other", args="[]"), NOW + 5, owner="w9", lease_until=NOW + 99
    )
    assert not created_again
    assert again == first
    assert await get(store, "r1") == first


async def test_create_run_with_an_owner_makes_a_running_run_at_epoch_1(store: Store) -> None:
    run, created = await store.create_run(new("r1"), NOW, owner="w1", lease_until=NOW + LEASE)
    assert created
    assert run.status is RunStatus.RUNNING
    assert (run.owner, run.epoch, run.lease_expires_at) == ("w1", 1, NOW + LEASE)
    assert run.started_at == NOW  # it started: a queue's rate limit counts it
    assert await get(store, "r1") == run
    await store.write_checkpoint(Lease("r1", "w1", 1), checkpoint(0), NOW + 1)
    assert [c.seq for c in await store.load_history("r1")] == [0]


async def test_get_run_of_an_unknown_id_is_none(store: Store) -> None:
    assert await store.get_run("nope") is None


# -- claim -------------------------------------------------------------------------------------


async def test_claim_takes_pending_runs_oldest_first_up_to_the_limit(store: Store) -> None:
    await store.create_run(new("c"), NOW + 2)
    await store.create_run(new("a"), NOW + 1)
    await store.create_run(new("b"), NOW + 3)
    first = await store.claim_runs("w1", [WF], NOW + 10, NOW + 10 + LEASE, 2)
    assert [r.id for r in first] == ["a", "c"]
    rest = await store.claim_runs("w2", [WF], NOW + 10, NOW + 10 + LEASE, 5)
    assert [r.id for r in rest] == ["b"]
    assert await store.claim_runs("w3", [WF], NOW + 10, NOW + 10 + LEASE, 5) == []


async def test_claim_takes_only_runs_of_the_given_workflows(store: Store) -> None:
    await store.create_run(new("a", "alpha"), NOW)
    await store.create_run(new("b", "beta"), NOW + 1)
    await store.create_run(new("g", "gamma"), NOW + 2)
    assert await store.claim_runs("w1", ["nothing"], NOW + 5, NOW + 35, 10) == []
    claimed = await store.claim_runs("w1", ["beta", "gamma"], NOW + 5, NOW + 35, 10)
    assert [r.id for r in claimed] == ["b", "g"]
    assert (await get(store, "a")).status is RunStatus.PENDING


async def test_claim_sets_owner_running_status_lease_and_increments_epoch(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    run = await claim_one(store, "w1", NOW + 1)
    assert run.status is RunStatus.RUNNING
    assert (run.owner, run.epoch, run.lease_expires_at) == ("w1", 1, NOW + 1 + LEASE)
    assert (run.wake_at, run.created_at, run.updated_at) == (None, NOW, NOW + 1)
    assert await get(store, "r1") == run


async def test_a_claimed_run_is_not_claimed_again_while_its_lease_is_live(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    run = await claim_one(store, "w1")
    assert await store.claim_runs("w2", [WF], NOW + 1, NOW + 1 + LEASE, 10) == []
    # A lease that expires exactly now is still live: adoption needs lease_expires_at < now.
    expiry = run.lease_expires_at
    assert expiry is not None
    assert await store.claim_runs("w2", [WF], expiry, expiry + LEASE, 10) == []
    assert await get(store, "r1") == run


async def test_a_run_whose_lease_expired_is_adopted_by_another_worker_with_a_higher_epoch(
    store: Store,
) -> None:
    await store.create_run(new("r1"), NOW)
    old = await claim_one(store, "w1")
    later = NOW + LEASE + 1
    adopted = await claim_one(store, "w2", later)
    assert (adopted.owner, adopted.epoch) == ("w2", old.epoch + 1)
    assert adopted.lease_expires_at == later + LEASE


async def test_the_old_owner_cannot_write_after_its_run_was_adopted(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    old = lease_of(await claim_one(store, "w1"))
    adopted = await claim_one(store, "w2", NOW + LEASE + 1)
    with pytest.raises(LeaseLost) as lost:
        await store.write_checkpoint(old, checkpoint(0), NOW + LEASE + 2)
    message = str(lost.value)
    assert "r1" in message
    assert "w1" in message
    assert str(old.epoch) in message
    with pytest.raises(LeaseLost):
        await store.suspend_run(old, NOW + 500, NOW + LEASE + 2)
    with pytest.raises(LeaseLost):
        await store.finish_run(old, RunStatus.SUCCEEDED, "1", None, NOW + LEASE + 2)
    assert await store.load_history("r1") == []
    assert await get(store, "r1") == adopted


async def test_an_expired_lease_that_nobody_adopted_still_allows_writes(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    lease = lease_of(await claim_one(store, "w1"))
    late = NOW + 10 * LEASE
    await store.write_checkpoint(lease, checkpoint(0), late)
    await store.finish_run(lease, RunStatus.SUCCEEDED, "42", None, late)
    assert (await get(store, "r1")).status is RunStatus.SUCCEEDED


async def test_writes_with_a_wrong_worker_a_wrong_epoch_or_an_unknown_run_raise_lease_lost(
    store: Store,
) -> None:
    await store.create_run(new("r1"), NOW)
    run = await claim_one(store, "w1")
    for bad in (
        Lease("r1", "w2", run.epoch),
        Lease("r1", "w1", run.epoch + 1),
        Lease("r1", "w1", run.epoch - 1),
        Lease("missing", "w1", 1),
    ):
        with pytest.raises(LeaseLost):
            await store.write_checkpoint(bad, checkpoint(0), NOW + 1)
        with pytest.raises(LeaseLost):
            await store.suspend_run(bad, None, NOW + 1)
        with pytest.raises(LeaseLost):
            await store.finish_run(bad, RunStatus.FAILED, None, "{}", NOW + 1)
    assert await get(store, "r1") == run


# -- suspend / waiting / next_wake_at ----------------------------------------------------------


async def test_suspend_run_releases_the_run_as_waiting_until_wake_at(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    lease = lease_of(await claim_one(store, "w1"))
    await store.suspend_run(lease, NOW + 100, NOW + 2)
    run = await get(store, "r1")
    assert run.status is RunStatus.WAITING
    assert (run.owner, run.lease_expires_at, run.wake_at) == (None, None, NOW + 100)
    assert (run.epoch, run.updated_at) == (lease.epoch, NOW + 2)
    with pytest.raises(LeaseLost):
        await store.write_checkpoint(lease, checkpoint(0), NOW + 3)


async def test_waiting_runs_are_claimable_only_once_wake_at_has_come(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    first = await claim_one(store, "w1")
    await store.suspend_run(lease_of(first), NOW + 100, NOW + 1)
    assert await store.claim_runs("w2", [WF], NOW + 99, NOW + 99 + LEASE, 10) == []
    woken = await claim_one(store, "w2", NOW + 100)
    assert (woken.owner, woken.epoch, woken.wake_at) == ("w2", first.epoch + 1, None)
    assert woken.status is RunStatus.RUNNING


async def test_a_waiting_run_without_wake_at_is_never_claimed(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    await store.suspend_run(lease_of(await claim_one(store, "w1")), None, NOW + 1)
    assert await store.claim_runs("w2", [WF], NOW + 1e9, NOW + 2e9, 10) == []
    assert await store.next_wake_at([WF]) is None


async def test_next_wake_at_is_the_earliest_wake_or_lease_expiry_of_these_workflows(
    store: Store,
) -> None:
    assert await store.next_wake_at([WF]) is None
    await store.create_run(new("sleeper"), NOW)
    await store.create_run(new("holder"), NOW + 1)
    await store.create_run(new("other", "elsewhere"), NOW + 2)
    sleeper = await claim_one(store, "w1", NOW + 5)
    await store.suspend_run(lease_of(sleeper), NOW + 500, NOW + 6)
    holder = await claim_one(store, "w1", NOW + 7)
    assert holder.id == "holder"
    assert await store.next_wake_at([WF]) == NOW + 7 + LEASE
    await store.suspend_run(lease_of(holder), NOW + 300, NOW + 8)
    assert await store.next_wake_at([WF]) == NOW + 300
    assert await store.next_wake_at(["unknown"]) is None
    assert await store.next_wake_at(["elsewhere"]) is None  # pending, due now: no wake time
    # A due time in the past is still reported; the worker treats it as now.
    assert await store.next_wake_at([WF, "elsewhere"]) == NOW + 300


async def test_next_wake_at_ignores_finished_runs(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    lease = lease_of(await claim_one(store, "w1"))
    await store.finish_run(lease, RunStatus.SUCCEEDED, "1", None, NOW + 1)
    assert await store.next_wake_at([WF]) is None


# -- checkpoints -------------------------------------------------------------------------------


async def test_write_checkpoint_replaces_at_the_same_seq_and_history_is_ordered_by_seq(
    store: Store,
) -> None:
    await store.create_run(new("r1"), NOW)
    lease = lease_of(await claim_one(store, "w1"))
    claimed_at = (await get(store, "r1")).updated_at
    started = Checkpoint(
        seq=1, name="pay", kind="step", status=CheckpointStatus.STARTED, started_at=NOW + 1
    )
    await store.write_checkpoint(lease, checkpoint(2, "b", '"b"'), NOW + 1)
    await store.write_checkpoint(lease, started, NOW + 1)
    await store.write_checkpoint(lease, checkpoint(0, "a", '"a"'), NOW + 2)
    done = Checkpoint(
        seq=1,
        name="pay",
        kind="step",
        status=CheckpointStatus.COMPLETED,
        result='{"ok": true}',
        attempts=2,
        started_at=NOW + 1,
        finished_at=NOW + 3,
        retry_at=None,
    )
    await store.write_checkpoint(lease, done, NOW + 3)
    history = await store.load_history("r1")
    assert history == [stored(c, lease) for c in (checkpoint(0, "a", '"a"'), done,
                                                  checkpoint(2, "b", '"b"'))]  # fmt: skip
    # The hot path writes one row: checkpoints carry their own times, the run row is untouched.
    assert (await get(store, "r1")).updated_at == claimed_at


async def test_load_histories_gives_each_runs_history_as_load_history_does(store: Store) -> None:
    for run_id in ("a", "b", "empty"):
        await store.create_run(new(run_id), NOW)
    leases = {r.id: lease_of(r) for r in await store.claim_runs("w1", [WF], NOW, NOW + LEASE, 3)}
    for seq in (2, 0, 1):  # written out of order: read back by seq
        await store.write_checkpoint(leases["a"], checkpoint(seq, f"a{seq}"), NOW + 1)
    await store.write_checkpoint(leases["b"], checkpoint(0, "b0", '{"big": "' + "x" * 5000 + '"}'),
                                 NOW + 1)  # fmt: skip
    histories = await store.load_histories(["a", "b", "empty", "unknown"])
    assert histories == {"a": await store.load_history("a"), "b": await store.load_history("b")}
    assert [c.seq for c in histories["a"]] == [0, 1, 2]
    assert await store.load_histories([]) == {}
    # Ids are values, never SQL.
    assert await store.load_histories(["a'); DROP TABLE tether_runs; --", "é ✓"]) == {}


async def test_checkpoints_keep_every_field_including_errors_and_retry_time(
    store: Store,
) -> None:
    await store.create_run(new("r1"), NOW)
    lease = lease_of(await claim_one(store, "w1"))
    retrying = Checkpoint(
        seq=0,
        name="fetch#2",
        kind="step",
        status=CheckpointStatus.RETRYING,
        error='{"type": "OSError", "message": "boom", "traceback": ""}',
        attempts=3,
        started_at=NOW + 1.5,
        finished_at=NOW + 1.75,
        retry_at=NOW + 9.25,
        position="2/0/5",
        args='{"args":["x"],"kwargs":{}}',
    )
    await store.write_checkpoint(lease, retrying, NOW + 2)
    [back] = await store.load_history("r1")
    assert back == retrying


async def test_a_checkpoint_written_without_a_position_reads_back_at_its_seq(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    lease = lease_of(await claim_one(store, "w1"))
    await store.write_checkpoint(lease, checkpoint(7, "old"), NOW + 1)
    [back] = await store.load_history("r1")
    assert back.position == "7"  # rows recorded before positions: the workflow's own task


async def test_history_belongs_to_one_run_and_is_empty_for_an_unknown_run(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    await store.create_run(new("r2"), NOW + 1)
    first, second = await store.claim_runs("w1", [WF], NOW + 2, NOW + 2 + LEASE, 2)
    await store.write_checkpoint(lease_of(first), checkpoint(0, "one"), NOW + 3)
    await store.write_checkpoint(lease_of(second), checkpoint(0, "two"), NOW + 3)
    assert [c.name for c in await store.load_history("r1")] == ["one"]
    assert [c.name for c in await store.load_history("r2")] == ["two"]
    assert await store.load_history("unknown") == []


# -- finish ------------------------------------------------------------------------------------


async def test_finish_run_stores_the_result_and_terminal_status_and_releases_the_lease(
    store: Store,
) -> None:
    await store.create_run(new("r1"), NOW)
    lease = lease_of(await claim_one(store, "w1"))
    await store.finish_run(lease, RunStatus.SUCCEEDED, '{"answer": 42}', None, NOW + 5)
    run = await get(store, "r1")
    assert run.status is RunStatus.SUCCEEDED
    assert (run.result, run.error) == ('{"answer": 42}', None)
    assert (run.owner, run.lease_expires_at, run.cancel_requested) == (None, None, False)
    assert (run.finished_at, run.updated_at) == (NOW + 5, NOW + 5)
    assert await store.claim_runs("w2", [WF], NOW + 1e6, NOW + 2e6, 10) == []
    with pytest.raises(LeaseLost):
        await store.finish_run(lease, RunStatus.FAILED, None, "{}", NOW + 6)
    assert (await get(store, "r1")).status is RunStatus.SUCCEEDED


@pytest.mark.parametrize("status", [RunStatus.FAILED, RunStatus.CANCELLED])
async def test_finish_run_stores_the_error_of_a_failed_or_cancelled_run(
    store: Store, status: RunStatus
) -> None:
    await store.create_run(new("r1"), NOW)
    lease = lease_of(await claim_one(store, "w1"))
    error = '{"type": "ValueError", "message": "bad", "traceback": "..."}'
    await store.finish_run(lease, status, None, error, NOW + 5)
    run = await get(store, "r1")
    assert (run.status, run.result, run.error, run.finished_at) == (status, None, error, NOW + 5)


@pytest.mark.parametrize("status", [RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING])
async def test_finish_run_rejects_a_status_that_is_not_terminal(
    store: Store, status: RunStatus
) -> None:
    await store.create_run(new("r1"), NOW)
    run = await claim_one(store, "w1")
    with pytest.raises(ValueError, match="terminal"):
        await store.finish_run(lease_of(run), status, None, None, NOW + 1)
    assert await get(store, "r1") == run


# -- heartbeat ---------------------------------------------------------------------------------


async def test_heartbeat_extends_held_leases_and_reports_lost_ones(store: Store) -> None:
    await store.create_run(new("kept"), NOW)
    await store.create_run(new("taken"), NOW + 1)
    kept, taken = await store.claim_runs("w1", [WF], NOW + 2, NOW + 2 + LEASE, 2)
    await claim_one(store, "w2", NOW + 2 + LEASE + 1)  # adopts one expired run: "kept" (oldest)
    # w1 heartbeats late: "kept" was adopted, "taken" was not, so it is still held.
    reply = await store.heartbeat(
        "w1", [lease_of(kept), lease_of(taken), Lease("ghost", "w1", 1)], NOW + 500, NOW + 40
    )
    assert sorted(reply.lost) == ["ghost", "kept"]
    assert reply.cancel == []
    assert (await get(store, "taken")).lease_expires_at == NOW + 500
    assert (await get(store, "kept")).owner == "w2"
    assert (await get(store, "kept")).lease_expires_at == NOW + 2 + LEASE + 1 + LEASE


async def test_heartbeat_keeps_a_held_lease_from_being_adopted(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    run = await claim_one(store, "w1")
    reply = await store.heartbeat("w1", [lease_of(run)], NOW + 100, NOW + 20)
    assert (reply.lost, reply.cancel) == ([], [])
    assert await store.claim_runs("w2", [WF], NOW + 90, NOW + 90 + LEASE, 10) == []
    assert (await claim_one(store, "w2", NOW + 101)).epoch == run.epoch + 1


async def test_heartbeat_reports_cancel_requests_for_runs_it_holds(store: Store) -> None:
    await store.create_run(new("calm"), NOW)
    await store.create_run(new("doomed"), NOW + 1)
    calm, doomed = await store.claim_runs("w1", [WF], NOW + 2, NOW + 2 + LEASE, 2)
    await store.cancel_run("doomed", '{"type": "Cancelled"}', NOW + 3)
    reply = await store.heartbeat("w1", [lease_of(calm), lease_of(doomed)], NOW + 60, NOW + 4)
    assert (reply.lost, reply.cancel) == ([], ["doomed"])
    assert (await get(store, "doomed")).lease_expires_at == NOW + 60


async def test_heartbeat_refreshes_the_worker_row(store: Store) -> None:
    await store.register_worker(WorkerInfo(id="w1", host="h", pid=1, pid_token="t"), NOW)
    reply = await store.heartbeat("w1", [], NOW + 60, NOW + 10)
    (worker,) = await store.list_workers()
    assert (worker.started_at, worker.heartbeat_at) == (NOW, NOW + 10)
    assert reply.unknown is False


async def test_heartbeat_of_a_worker_whose_row_is_gone_says_so(store: Store) -> None:
    await store.register_worker(WorkerInfo(id="w1", host="h", pid=1, pid_token="t"), NOW)
    await store.release_worker("w1", NOW + 1)  # someone took it for dead
    reply = await store.heartbeat("w1", [], NOW + 60, NOW + 10)
    assert reply.unknown is True
    assert await store.list_workers() == []  # nothing written for it: it registers again


async def test_a_worker_row_keeps_where_its_process_lives(store: Store) -> None:
    info = WorkerInfo(id="w1", host="h", pid=7, pid_token="t", workflows=("a",),
                      boot_id="boot-1", pid_ns="pid:[4026531836]")  # fmt: skip
    await store.register_worker(info, NOW)
    await store.register_worker(WorkerInfo(id="w2", host="h", pid=8, pid_token="u"), NOW)
    w1, w2 = await store.list_workers("h")
    assert (w1.boot_id, w1.pid_ns, w1.workflows) == ("boot-1", "pid:[4026531836]", ("a",))
    assert (w2.boot_id, w2.pid_ns) == ("", "")  # unknown: an older worker, or no /proc


# -- cancel ------------------------------------------------------------------------------------


async def test_cancel_run_ends_a_pending_run_cancelled_at_once(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    run = await store.cancel_run("r1", '{"type": "Cancelled"}', NOW + 1)
    assert run.status is RunStatus.CANCELLED
    assert (run.error, run.finished_at, run.owner) == ('{"type": "Cancelled"}', NOW + 1, None)
    assert run.cancel_requested is False
    assert await get(store, "r1") == run
    assert await store.claim_runs("w1", [WF], NOW + 2, NOW + 2 + LEASE, 10) == []


async def test_cancel_run_ends_a_waiting_run_cancelled_and_it_never_wakes(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    await store.suspend_run(lease_of(await claim_one(store, "w1")), NOW + 50, NOW + 1)
    run = await store.cancel_run("r1", "{}", NOW + 2)
    assert (run.status, run.owner, run.finished_at) == (RunStatus.CANCELLED, None, NOW + 2)
    assert await store.claim_runs("w1", [WF], NOW + 100, NOW + 100 + LEASE, 10) == []
    assert await store.next_wake_at([WF]) is None


async def test_cancel_run_on_a_running_run_only_flags_it_for_its_worker(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    claimed = await claim_one(store, "w1")
    run = await store.cancel_run("r1", '{"type": "Cancelled"}', NOW + 1)
    assert run.status is RunStatus.RUNNING
    assert run.cancel_requested is True
    assert (run.owner, run.epoch, run.error, run.finished_at) == ("w1", claimed.epoch, None, None)
    assert await get(store, "r1") == run
    await store.finish_run(lease_of(claimed), RunStatus.CANCELLED, None, '"stop"', NOW + 2)
    done = await get(store, "r1")
    assert (done.status, done.cancel_requested) == (RunStatus.CANCELLED, False)


async def test_cancel_run_leaves_a_finished_run_as_it_is(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    await store.finish_run(
        lease_of(await claim_one(store, "w1")), RunStatus.SUCCEEDED, "1", None, NOW + 1
    )
    before = await get(store, "r1")
    after = await store.cancel_run("r1", "{}", NOW + 2)
    assert after == before
    assert await get(store, "r1") == before


async def test_cancel_run_of_an_unknown_id_raises_run_not_found(store: Store) -> None:
    with pytest.raises(RunNotFound, match="no-such-run"):
        await store.cancel_run("no-such-run", "{}", NOW)


# -- workers -----------------------------------------------------------------------------------


async def test_release_worker_makes_its_runs_claimable_at_once_and_fences_the_dead_owner(
    store: Store,
) -> None:
    await store.register_worker(WorkerInfo(id="dead", host="h", pid=1, pid_token="t"), NOW)
    await store.create_run(new("a"), NOW)
    await store.create_run(new("b"), NOW + 1)
    await store.create_run(new("c"), NOW + 2)
    a, b = await store.claim_runs("dead", [WF], NOW + 3, NOW + 3 + LEASE, 2)
    c = await claim_one(store, "alive", NOW + 3)
    released = await store.release_worker("dead", NOW + 4)
    assert sorted(released) == ["a", "b"]
    assert await store.list_workers() == []
    for run_id, epoch in (("a", a.epoch), ("b", b.epoch)):
        run = await get(store, run_id)
        assert run.status is RunStatus.PENDING
        assert (run.owner, run.lease_expires_at, run.epoch) == (None, None, epoch)
    assert await get(store, "c") == c
    # Claimable now, long before the dead worker's lease would have expired.
    adopted = await store.claim_runs("heir", [WF], NOW + 5, NOW + 5 + LEASE, 10)
    assert [r.id for r in adopted] == ["a", "b"]
    assert [r.epoch for r in adopted] == [a.epoch + 1, b.epoch + 1]
    with pytest.raises(LeaseLost):
        await store.write_checkpoint(lease_of(a), checkpoint(0), NOW + 6)
    with pytest.raises(LeaseLost):
        await store.finish_run(lease_of(b), RunStatus.SUCCEEDED, "1", None, NOW + 6)


async def test_release_worker_of_a_worker_without_runs_releases_nothing(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    run = await claim_one(store, "w1")
    assert await store.release_worker("w2", NOW + 1) == []
    assert await get(store, "r1") == run


async def test_register_worker_upserts_by_id_and_keeps_the_first_started_at(
    store: Store,
) -> None:
    await store.register_worker(WorkerInfo(id="w1", host="h1", pid=10, pid_token="a"), NOW)
    await store.register_worker(WorkerInfo(id="w1", host="h1", pid=11, pid_token="b"), NOW + 7)
    (worker,) = await store.list_workers()
    assert (worker.id, worker.host, worker.pid, worker.pid_token) == ("w1", "h1", 11, "b")
    assert (worker.started_at, worker.heartbeat_at) == (NOW, NOW + 7)


async def test_list_workers_filters_by_host(store: Store) -> None:
    await store.register_worker(WorkerInfo(id="w1", host="h1", pid=1, pid_token="a"), NOW)
    await store.register_worker(WorkerInfo(id="w2", host="h2", pid=2, pid_token="b"), NOW)
    await store.register_worker(WorkerInfo(id="w3", host="h1", pid=3, pid_token="c"), NOW)
    assert sorted(w.id for w in await store.list_workers()) == ["w1", "w2", "w3"]
    assert sorted(w.id for w in await store.list_workers("h1")) == ["w1", "w3"]
    assert [w.id for w in await store.list_workers(host="h2")] == ["w2"]
    assert await store.list_workers("nowhere") == []


# -- list_runs ---------------------------------------------------------------------------------


async def test_list_runs_is_newest_first_with_ties_broken_by_id_descending(store: Store) -> None:
    await store.create_run(new("old"), NOW)
    await store.create_run(new("tie-a"), NOW + 1)
    await store.create_run(new("tie-b"), NOW + 1)
    await store.create_run(new("new"), NOW + 2)
    assert [r.id for r in await store.list_runs()] == ["new", "tie-b", "tie-a", "old"]


async def test_list_runs_filters_by_status_and_workflow_and_respects_the_limit(
    store: Store,
) -> None:
    for i in range(5):
        await store.create_run(new(f"p{i}"), NOW + i)
    await store.create_run(new("x", "other"), NOW + 10)
    await store.claim_runs("w1", [WF], NOW + 20, NOW + 20 + LEASE, 2)  # p0, p1 now running
    assert [r.id for r in await store.list_runs(limit=3)] == ["x", "p4", "p3"]
    assert [r.id for r in await store.list_runs(workflow="other")] == ["x"]
    running = await store.list_runs(statuses=[RunStatus.RUNNING])
    assert [r.id for r in running] == ["p1", "p0"]
    pending_wf = await store.list_runs(statuses=[RunStatus.PENDING], workflow=WF)
    assert [r.id for r in pending_wf] == ["p4", "p3", "p2"]
    both = await store.list_runs(statuses=[RunStatus.PENDING, RunStatus.RUNNING], limit=4)
    assert [r.id for r in both] == ["x", "p4", "p3", "p2"]
    assert await store.list_runs(statuses=[RunStatus.FAILED]) == []
    assert await store.list_runs(workflow="unknown") == []


# -- mailboxes, waits and children --------------------------------------------------------------


def wait_checkpoint(seq: int, name: str = "event:go") -> Checkpoint:
    return Checkpoint(seq=seq, name=name, kind="event", status=CheckpointStatus.COMPLETED)


async def test_events_are_taken_once_each_in_order_per_key(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    lease = lease_of(await claim_one(store))
    for payload in ('"a"', '"b"'):
        await store.deliver_event("r1", "go", payload, NOW)
    await store.deliver_event("r1", "other", '"x"', NOW)
    first = await store.take_event(lease, ["go"], wait_checkpoint(0), NOW)
    assert first == '{"key":"go","value":"a"}'
    assert await store.take_event(lease, ["go"], wait_checkpoint(1, "event:go#2"), NOW)
    assert await store.take_event(lease, ["go"], wait_checkpoint(2, "event:go#3"), NOW) is None
    history = await store.load_history("r1")
    assert [c.result for c in history] == ['{"key":"go","value":"a"}', '{"key":"go","value":"b"}']
    taken = await store.take_event(lease, ["go", "other"], wait_checkpoint(2), NOW)
    assert taken == '{"key":"other","value":"x"}'


async def test_an_event_sent_before_the_wait_waits_in_the_mailbox(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    await store.deliver_event("r1", "early", "42", NOW)
    lease = lease_of(await claim_one(store))
    assert await store.take_event(lease, ["early"], wait_checkpoint(0, "event:early"), NOW)
    assert (await store.load_history("r1"))[0].result == '{"key":"early","value":42}'


async def test_taking_an_event_is_fenced_by_the_lease(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    old = lease_of(await claim_one(store, "w1"))
    await store.release_worker("w1", NOW)
    await claim_one(store, "w2")
    await store.deliver_event("r1", "go", "1", NOW)
    with pytest.raises(LeaseLost):
        await store.take_event(old, ["go"], wait_checkpoint(0), NOW)
    assert await store.load_history("r1") == []


async def test_an_event_for_a_key_a_suspended_run_waits_on_makes_it_due(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    lease = lease_of(await claim_one(store))
    await store.suspend_run(lease, NOW + 3600, NOW, wake_on=["go"])
    run = await get(store, "r1")
    assert (run.status, run.wake_at, run.wake_on) == (RunStatus.WAITING, NOW + 3600, ("go",))
    await store.deliver_event("r1", "unrelated", "1", NOW + 1)
    assert (await get(store, "r1")).wake_at == NOW + 3600
    await store.deliver_event("r1", "go", "1", NOW + 2)
    assert (await get(store, "r1")).wake_at == NOW + 2
    [claimed] = await store.claim_runs("w2", [WF], NOW + 2, NOW + 2 + LEASE, 5)
    assert claimed.id == "r1"


async def test_suspending_when_the_event_already_arrived_leaves_the_run_due(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    lease = lease_of(await claim_one(store))
    await store.deliver_event("r1", "go", "1", NOW)
    await store.suspend_run(lease, None, NOW + 1, wake_on=["go"])
    assert (await get(store, "r1")).wake_at == NOW + 1


async def test_events_for_unknown_runs_raise_and_for_finished_runs_are_not_stored(
    store: Store,
) -> None:
    with pytest.raises(RunNotFound, match="ghost"):
        await store.deliver_event("ghost", "go", "1", NOW)
    await store.create_run(new("r1"), NOW)
    lease = lease_of(await claim_one(store))
    await store.finish_run(lease, RunStatus.SUCCEEDED, "1", None, NOW)
    before = await store.last_event_id()
    record = await store.deliver_event("r1", "go", "1", NOW)
    assert record.status is RunStatus.SUCCEEDED
    assert await store.last_event_id() == before


async def test_events_after_lists_new_events_oldest_first(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    start = await store.last_event_id()
    await store.deliver_event("r1", "a", "1", NOW)
    await store.deliver_event("r1", "b", "2", NOW)
    refs = await store.events_after(start)
    assert [(r.run_id, r.key) for r in refs] == [("r1", "a"), ("r1", "b")]
    assert refs[0].id < refs[1].id == await store.last_event_id()
    assert await store.events_after(refs[1].id) == []


async def test_a_finished_child_tells_its_parent_through_the_mailbox(store: Store) -> None:
    await store.create_run(new("parent"), NOW)
    parent = lease_of(await claim_one(store, "w1"))
    await store.suspend_run(parent, None, NOW, wake_on=[child_key("kid")])
    await store.create_run(NewRun("kid", WF, "{}", parent_id="parent"), NOW, owner="w1",
                           lease_until=NOW + LEASE)  # fmt: skip
    kid = await get(store, "kid")
    assert kid.parent_id == "parent"
    await store.finish_run(lease_of(kid), RunStatus.SUCCEEDED, "7", None, NOW + 1)
    assert (await get(store, "parent")).wake_at == NOW + 1
    [claimed] = await store.claim_runs("w1", [WF], NOW + 1, NOW + LEASE, 5)
    taken = await store.take_event(lease_of(claimed), [child_key("kid")], wait_checkpoint(0),
                                   NOW + 1)  # fmt: skip
    assert taken is not None
    assert json.loads(taken) == {
        "key": child_key("kid"),
        "value": {"status": "succeeded", "result": "7", "error": None},
    }


async def test_cancelling_a_parent_cancels_its_unfinished_children(store: Store) -> None:
    await store.create_run(new("parent"), NOW)
    await store.create_run(NewRun("kid", WF, "{}", parent_id="parent"), NOW)
    await store.create_run(NewRun("grandkid", WF, "{}", parent_id="kid"), NOW)
    await store.create_run(NewRun("done", WF, "{}", parent_id="parent"), NOW, owner="w9",
                           lease_until=NOW + LEASE)  # fmt: skip
    await store.finish_run(lease_of(await get(store, "done")), RunStatus.SUCCEEDED, "1", None,
                           NOW)  # fmt: skip
    await store.cancel_run("parent", '{"type": "RunCancelled"}', NOW + 1)
    for run_id in ("parent", "kid", "grandkid"):
        assert (await get(store, run_id)).status is RunStatus.CANCELLED, run_id
    assert (await get(store, "done")).status is RunStatus.SUCCEEDED


async def test_suspending_a_run_with_a_pending_cancel_request_leaves_it_due(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    lease = lease_of(await claim_one(store))
    await store.cancel_run("r1", "{}", NOW)  # held by a worker: only flagged
    await store.suspend_run(lease, NOW + 3600, NOW + 1, wake_on=["go"])
    run = await get(store, "r1")
    assert (run.status, run.wake_at, run.cancel_requested) == (RunStatus.WAITING, NOW + 1, True)


# -- queues --------------------------------------------------------------------------------------


def queued(run_id: str, queue: str | None = "q", priority: int = 0, dedup: str | None = None,
           workflow: str = WF) -> NewRun:  # fmt: skip
    return NewRun(run_id, workflow, "{}", queue=queue, priority=priority, dedup_key=dedup)


async def test_a_dedup_key_admits_one_unfinished_run_per_queue(store: Store) -> None:
    await store.create_run(queued("a", dedup="user-1"), NOW)
    with pytest.raises(DuplicateRun, match="user-1") as info:
        await store.create_run(queued("b", dedup="user-1"), NOW)
    assert info.value.run_id == "a"
    await store.create_run(queued("c", queue="other", dedup="user-1"), NOW)  # another queue
    await store.create_run(queued("d", queue=None, dedup="user-1"), NOW)
    with pytest.raises(DuplicateRun):
        await store.create_run(queued("e", queue=None, dedup="user-1"), NOW)
    assert (await store.create_run(queued("a", dedup="user-1"), NOW))[1] is False  # same id
    [claimed] = await store.claim_runs("w1", [WF], NOW, NOW + LEASE, 1, {"q": QueueLimits()})
    assert claimed.id == "a"
    await store.finish_run(lease_of(claimed), RunStatus.SUCCEEDED, "1", None, NOW)
    _, created = await store.create_run(queued("b", dedup="user-1"), NOW)  # "a" ended
    assert created


async def test_higher_priority_runs_are_claimed_first(store: Store) -> None:
    await store.create_run(queued("low", queue=None, priority=0), NOW)
    await store.create_run(queued("high", queue=None, priority=5), NOW + 1)
    await store.create_run(queued("mid", queue=None, priority=2), NOW + 2)
    claimed = await store.claim_runs("w1", [WF], NOW + 3, NOW + LEASE, 3)
    assert [r.id for r in claimed] == ["high", "mid", "low"]


async def test_a_queue_concurrency_limit_holds_across_workers(store: Store) -> None:
    limits = {"q": QueueLimits(concurrency=2)}
    for i in range(5):
        await store.create_run(queued(f"r{i}"), NOW + i)
    await store.create_run(queued("free", queue=None), NOW + 9)
    first = await store.claim_runs("w1", [WF], NOW + 10, NOW + LEASE, 10, limits)
    assert sorted(r.id for r in first) == ["free", "r0", "r1"]
    assert await store.claim_runs("w2", [WF], NOW + 10, NOW + LEASE, 10, limits) == []
    await store.finish_run(lease_of(first[1]), RunStatus.SUCCEEDED, "1", None, NOW + 11)
    [more] = await store.claim_runs("w2", [WF], NOW + 12, NOW + LEASE, 10, limits)
    assert more.id == "r2"


async def test_a_per_worker_limit_leaves_the_rest_to_other_workers(store: Store) -> None:
    limits = {"q": QueueLimits(worker_concurrency=1)}
    for i in range(3):
        await store.create_run(queued(f"r{i}"), NOW + i)
    assert [r.id for r in await store.claim_runs("w1", [WF], NOW, NOW + LEASE, 5, limits)] == ["r0"]
    assert [r.id for r in await store.claim_runs("w2", [WF], NOW, NOW + LEASE, 5, limits)] == ["r1"]
    assert await store.claim_runs("w1", [WF], NOW, NOW + LEASE, 5, limits) == []


async def test_a_rate_limit_counts_first_claims_in_its_period(store: Store) -> None:
    limits = {"q": QueueLimits(rate=2, period=60)}
    for i in range(4):
        await store.create_run(queued(f"r{i}"), NOW + i)
    claimed = await store.claim_runs("w1", [WF], NOW + 10, NOW + 11, 5, limits)
    assert [r.id for r in claimed] == ["r0", "r1"]
    assert all(r.started_at == NOW + 10 for r in claimed)
    # r0's lease expires and another worker adopts it: not a new start, no new budget used.
    [adopted] = await store.claim_runs("w2", [WF], NOW + 20, NOW + 40, 1, {})
    assert (adopted.id, adopted.started_at) == ("r0", NOW + 10)
    assert await store.claim_runs("w1", [WF], NOW + 30, NOW + 90, 5, limits) == []
    await store.finish_run(lease_of(adopted), RunStatus.SUCCEEDED, "1", None, NOW + 31)
    await store.finish_run(lease_of(claimed[1]), RunStatus.SUCCEEDED, "1", None, NOW + 31)
    later = await store.claim_runs("w1", [WF], NOW + 71, NOW + 90, 5, limits)
    assert [r.id for r in later] == ["r2", "r3"]


# -- resume -----------------------------------------------------------------------------------


async def test_resume_run_makes_a_failed_run_pending_and_its_failed_steps_due_again(
    store: Store,
) -> None:
    await store.create_run(new("r-resume"), NOW)
    lease = lease_of(await claim_one(store))
    failed = dataclasses.replace(checkpoint(1, "publish", None), status=CheckpointStatus.FAILED,
                                 error='{"type": "ValueError"}', attempts=3)  # fmt: skip
    caught = dataclasses.replace(failed, seq=2, name="lookup", attempts=1)
    await store.write_checkpoint(lease, checkpoint(0, "fetch"), NOW)
    await store.write_checkpoint(lease, failed, NOW)
    await store.write_checkpoint(lease, caught, NOW)  # a failure the workflow handled
    await store.finish_run(lease, RunStatus.FAILED, None, '{"type": "ValueError"}', NOW + 1)
    resumed = await store.resume_run("r-resume", NOW + 5, NOW + 65, retry="1")
    assert (resumed.status, resumed.error, resumed.finished_at) == (RunStatus.PENDING, None, None)
    assert resumed.deadline_at == NOW + 65  # the workflow's timeout counts from the resume
    assert resumed.owner is None
    [kept, due, still] = await store.load_history("r-resume")
    assert kept == stored(checkpoint(0, "fetch"), lease)
    assert (due.status, due.retry_at, due.attempts) == (CheckpointStatus.RETRYING, NOW + 5, 3)
    assert still == stored(caught, lease)  # only the failure that ended the run is retried
    again = await claim_one(store, now=NOW + 6)
    assert (again.id, again.epoch) == ("r-resume", 2)


async def test_resume_run_leaves_other_runs_as_they_are_and_refuses_unknown_ids(
    store: Store,
) -> None:
    await store.create_run(new("r-ok"), NOW)
    lease = lease_of(await claim_one(store))
    await store.finish_run(lease, RunStatus.SUCCEEDED, "1", None, NOW + 1)
    same = await store.resume_run("r-ok", NOW + 2, None)
    assert (same.status, same.result) == (RunStatus.SUCCEEDED, "1")
    with pytest.raises(RunNotFound):
        await store.resume_run("missing", NOW, None)


async def test_resume_run_refuses_a_dedup_key_that_an_unfinished_run_now_holds(
    store: Store,
) -> None:
    keyed = dataclasses.replace(new("r-first"), queue="q", dedup_key="k")
    await store.create_run(keyed, NOW)
    lease = lease_of(await claim_one(store))
    await store.finish_run(lease, RunStatus.FAILED, None, '{"type": "ValueError"}', NOW + 1)
    await store.create_run(dataclasses.replace(keyed, id="r-second"), NOW + 2)
    with pytest.raises(DuplicateRun, match="r-second"):
        await store.resume_run("r-first", NOW + 3, None)
    still = await store.get_run("r-first")
    assert still is not None
    assert still.status is RunStatus.FAILED  # nothing changed

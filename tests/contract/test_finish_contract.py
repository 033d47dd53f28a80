"""A run's end carrying the checkpoints its execution completed last (finish_run's
`checkpoints`): written in the end's commit on every path an end takes (PostgreSQL: the one
statement of a plain run, the transaction of a run with approvals to cancel or a parent to
tell), and nothing at all under a lease that is no longer held."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from typing import Any

import psycopg
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
    stored,
    wait_checkpoint,
)
from tests.postgres_server import execute_in, with_schema

from tether import faults
from tether.errors import LeaseLost, StoreUnavailable
from tether.store.keys import child_key
from tether.store.port import Checkpoint, CheckpointStatus, Lease, NewRun, RunStatus, Store
from tether.store.postgres import PostgresStore
from tether.store.query import Query


async def test_the_checkpoints_an_end_carries_are_written_with_it(store: Store) -> None:
    lease = await running(store, "r1")
    first = checkpoint(0, "one", "1")
    await store.write_checkpoint(lease, first, NOW)
    # Text that JSON must escape (PostgreSQL carries them as one JSON array), and a long one.
    hostile = json.dumps({"q": 'a "quote", a \\ back\nslash, \u2028, é ☃ 🚀', "pad": "x" * 70_000})
    last = [
        checkpoint(1, "two", '{"x": [1, 2]}'),
        checkpoint(2, "three", None),
        checkpoint(3, 'four "4"', hostile),
    ]
    await store.finish_run(lease, RunStatus.SUCCEEDED, '"done"', None, NOW + 2, checkpoints=last)
    assert await store.load_history("r1") == [stored(c, lease) for c in [first, *last]]
    run = await get(store, "r1")
    assert (run.status, run.result, run.owner) == (RunStatus.SUCCEEDED, '"done"', None)


async def test_an_end_carrying_one_seq_twice_keeps_the_last(store: Store) -> None:
    lease = await running(store, "r1")
    first, again = checkpoint(0, "one", '"first"'), checkpoint(0, "one", '"again"')
    await store.finish_run(lease, RunStatus.SUCCEEDED, '"done"', None, NOW + 1,
                           checkpoints=[first, again])  # fmt: skip
    assert await store.load_history("r1") == [stored(again, lease)]
    assert (await get(store, "r1")).status is RunStatus.SUCCEEDED


async def test_an_end_carrying_text_that_cannot_be_stored_fails_as_a_write_of_it_fails(
    store: Store,
) -> None:
    """A surrogate pair held as two code points (a `tether.patched()` id can be any str) is no
    text a database stores: a checkpoint write of it fails, and so does an end carrying it, with
    the same error and nothing written. (JSON's escapes would have joined the pair into one
    character on PostgreSQL, storing a name the code never gave.)"""
    lease = await running(store, "r1")
    bad = checkpoint(1, "patch:\ud83d\ude00", "1")
    with pytest.raises(Exception) as alone:
        await store.write_checkpoint(lease, bad, NOW)
    with pytest.raises(type(alone.value)):
        await store.finish_run(lease, RunStatus.SUCCEEDED, '"done"', None, NOW + 2,
                               checkpoints=[bad])  # fmt: skip
    assert (await get(store, "r1")).status is RunStatus.RUNNING
    assert await store.load_history("r1") == []


async def test_an_end_carrying_non_finite_times_stores_them_as_a_write_does(store: Store) -> None:
    """NaN and infinities (a custom clock's) come back from an end that carried them as they
    come back from a checkpoint write on the same backend, not turned into NULL by JSON."""
    times = dataclasses.replace(checkpoint(1, "now", "1"), started_at=float("nan"),
                                finished_at=float("inf"), retry_at=float("-inf"))  # fmt: skip
    written, carried = await running(store, "written"), await running(store, "carried")
    await store.write_checkpoint(written, times, NOW)
    await store.finish_run(carried, RunStatus.SUCCEEDED, '"done"', None, NOW + 2,
                           checkpoints=[times])  # fmt: skip

    def stored_times(history: list[Checkpoint]) -> list[str]:
        return [repr((c.started_at, c.finished_at, c.retry_at)) for c in history]

    expected = stored_times(await store.load_history("written"))
    assert expected[0].endswith(", inf, -inf)")  # as written, whatever NaN becomes
    assert stored_times(await store.load_history("carried")) == expected


async def test_a_carried_checkpoint_takes_the_place_of_its_started_marker(store: Store) -> None:
    lease = await running(store, "r1")
    marker = dataclasses.replace(checkpoint(0, "pay", None), status=CheckpointStatus.STARTED)
    await store.write_checkpoint(lease, marker, NOW)
    done = checkpoint(0, "pay", '"paid"')
    await store.finish_run(lease, RunStatus.FAILED, None, '{"type": "E"}', NOW + 1,
                           checkpoints=[done])  # fmt: skip
    assert await store.load_history("r1") == [stored(done, lease)]
    assert (await get(store, "r1")).status is RunStatus.FAILED


async def test_an_end_that_cancels_approvals_writes_its_checkpoints_too(store: Store) -> None:
    lease = await running(store, "r1")
    await created(store, approval("p1", "r1"), NOW + 1)
    last = checkpoint(0, "one", "5")
    await store.finish_run(lease, RunStatus.SUCCEEDED, "5", None, NOW + 2, checkpoints=[last])
    assert await store.load_history("r1") == [stored(last, lease)]
    pending = await store.get_approval("p1")
    assert pending is not None
    assert pending.status == "cancelled"
    assert (await get(store, "r1")).status is RunStatus.SUCCEEDED


async def a_waiting_parents_kid(store: Store) -> Lease:
    """Run "parent" waiting for its child "kid", which w1 holds: the kid's lease."""
    await store.create_run(NewRun("parent", WF, "{}"), NOW)
    parent = lease_of(await claim_one(store, "w1"))
    await store.suspend_run(parent, None, NOW, wake_on=[child_key("kid")])
    await store.create_run(NewRun("kid", WF, "{}", parent_id="parent"), NOW, owner="w1",
                           lease_until=NOW + LEASE)  # fmt: skip
    return lease_of(await get(store, "kid"))


async def test_a_childs_end_writes_its_checkpoints_and_tells_its_parent(store: Store) -> None:
    kid = await a_waiting_parents_kid(store)
    last = checkpoint(0, "one", "7")
    await store.finish_run(kid, RunStatus.SUCCEEDED, "7", None, NOW + 1, checkpoints=[last])
    assert await store.load_history("kid") == [stored(last, kid)]
    assert (await get(store, "parent")).wake_at == NOW + 1
    [claimed] = await store.claim_runs("w1", [WF], NOW + 1, NOW + LEASE, 5)
    taken = await store.take_event(lease_of(claimed), [child_key("kid")], wait_checkpoint(0),
                                   NOW + 1)  # fmt: skip
    assert taken is not None
    assert json.loads(taken)["value"]["result"] == "7"


@pytest.mark.parametrize("approvals", [False, True], ids=["plain", "with-approvals"])
async def test_an_end_under_a_lost_lease_writes_none_of_its_checkpoints(
    store: Store, approvals: bool
) -> None:
    lease = await running(store, "r1")
    if approvals:
        await created(store, approval("p1", "r1"), NOW + 1)
    first = checkpoint(0, "one", "1")
    await store.write_checkpoint(lease, first, NOW)
    # The lease runs out and another worker claims the run (epoch 2).
    [taken] = await store.claim_runs("w2", [WF], NOW + LEASE + 1, NOW + 2 * LEASE, 1)
    assert taken.epoch == lease.epoch + 1
    with pytest.raises(LeaseLost):
        await store.finish_run(lease, RunStatus.SUCCEEDED, "1", None, NOW + LEASE + 2,
                               checkpoints=[checkpoint(1, "two", "2")])  # fmt: skip
    assert await store.load_history("r1") == [stored(first, lease)]
    run = await get(store, "r1")
    assert (run.status, run.owner, run.epoch) == (RunStatus.RUNNING, "w2", 2)
    if approvals:
        kept = await store.get_approval("p1")
        assert kept is not None
        assert kept.status == "pending"
    # The new holder's own end is untouched by the stale one.
    await store.finish_run(Lease("r1", "w2", 2), RunStatus.SUCCEEDED, "2", None,
                           NOW + LEASE + 3, checkpoints=[checkpoint(1, "two", "2")])  # fmt: skip
    assert [c.name for c in await store.load_history("r1")] == ["one", "two"]


async def test_a_full_end_on_postgresql_goes_on_from_its_one_statement(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the one statement answers that the run has more to do (approvals to cancel), the
    transaction takes the operation up from there: the statement is not run a second time."""
    store = PostgresStore(with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}"))
    await store.open()
    try:
        lease = await running(store, "r1")
        await created(store, approval("p1", "r1"), NOW + 1)
        names: list[str] = []
        statements = store.driver.statements
        execute = statements.execute

        async def recorded(conn: Any, tx: Any, query: Query) -> Any:
            names.append(query.name)
            return await execute(conn, tx, query)

        monkeypatch.setattr(statements, "execute", recorded)
        last = checkpoint(0, "one", "5")
        await store.finish_run(lease, RunStatus.SUCCEEDED, "5", None, NOW + 2,
                               checkpoints=[last])  # fmt: skip
        assert names.count("finish_alone_carrying") == 1
        assert "finish_alone" not in names
        assert names.index("finish_run") > names.index("finish_alone_carrying")
        assert names.count("upsert_checkpoint") == 1  # carried by the statement, then repeated
        assert await store.load_history("r1") == [stored(last, lease)]
        cancelled = await store.get_approval("p1")
        assert cancelled is not None
        assert cancelled.status == "cancelled"
    finally:
        await store.close()


async def test_ends_sharing_one_commit_on_postgresql_each_end_as_alone(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ends queued together share a transaction: their one statements go in one round, and
    only those with more to do (approvals to cancel, a parent to tell, a lease no longer
    held) go on, each in its savepoint, exactly as each would alone."""
    store = PostgresStore(with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}"))
    await store.open()
    try:
        plain = [await running(store, f"plain{i}") for i in range(5)]
        asking = [await running(store, f"asking{i}") for i in range(2)]
        for i, lease in enumerate(asking):
            await created(store, approval(f"ap{i}", lease.run_id), NOW + 1)
        kid = await a_waiting_parents_kid(store)
        await running(store, "stale")
        stale = Lease("stale", "w-gone", 1)  # never this run's holder
        ends = [*plain, *asking, kid]

        rounds: list[list[str]] = []
        alone_round = store.driver.commits._alone_round

        async def spied(conn: Any, writes: Any) -> Any:
            rounds.append([w.label for w in writes])
            return await alone_round(conn, writes)

        monkeypatch.setattr(store.driver.commits, "_alone_round", spied)
        last = checkpoint(0, "one", "9")
        outcomes = await asyncio.gather(
            *(store.finish_run(lease, RunStatus.SUCCEEDED, f'"{lease.run_id}"', None, NOW + 2,
                               checkpoints=[last]) for lease in [*ends, stale]),
            return_exceptions=True,
        )  # fmt: skip
        assert [len(labels) for labels in rounds] == [len(ends) + 1]  # one shared transaction
        assert outcomes[:-1] == [None] * len(ends)
        assert isinstance(outcomes[-1], LeaseLost)
        for lease in ends:
            run = await get(store, lease.run_id)
            assert (run.status, run.result, run.owner) == (
                RunStatus.SUCCEEDED, f'"{lease.run_id}"', None
            )  # fmt: skip
            assert await store.load_history(lease.run_id) == [stored(last, lease)]
        for i in range(len(asking)):
            cancelled = await store.get_approval(f"ap{i}")
            assert cancelled is not None
            assert cancelled.status == "cancelled"
        assert (await get(store, "parent")).wake_at == NOW + 2
        untouched = await get(store, "stale")
        assert (untouched.status, untouched.owner) == (RunStatus.RUNNING, "w1")
        assert await store.load_history("stale") == []
    finally:
        await store.close()


async def test_of_two_ends_of_one_run_sharing_a_commit_the_failed_one_leaves_nothing(
    postgres_url: str,
) -> None:
    """The end that lost the race (the run had ended by the other) writes none of the
    checkpoints it carried, though its statements went in the same round as the winner's."""
    store = PostgresStore(with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}"))
    await store.open()
    try:
        lease = await running(store, "r1")
        first, second = checkpoint(0, "one", '"A"'), checkpoint(0, "one", '"B"')
        outcomes = await asyncio.gather(
            store.finish_run(lease, RunStatus.SUCCEEDED, '"A"', None, NOW + 1, checkpoints=[first]),
            store.finish_run(lease, RunStatus.SUCCEEDED, '"B"', None, NOW + 1,
                             checkpoints=[second]),
            return_exceptions=True,
        )  # fmt: skip
        assert outcomes[0] is None
        assert isinstance(outcomes[1], LeaseLost)
        assert (await get(store, "r1")).result == '"A"'
        assert await store.load_history("r1") == [stored(first, lease)]
    finally:
        await store.close()


@pytest.mark.parametrize("company", [0, 3], ids=["alone", "sharing-a-commit"])
async def test_an_end_that_cannot_be_sent_writes_none_of_what_it_carries(
    postgres_url: str, company: int
) -> None:
    """A parameter the driver cannot send (a NUL byte in text) fails the end on the client,
    after its carried checkpoint was queued: nothing of it may commit; ends beside it do."""
    store = PostgresStore(with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}"))
    await store.open()
    try:
        others = [await running(store, f"ok{i}") for i in range(company)]
        bad = await running(store, "bad")
        outcomes = await asyncio.gather(
            *(store.finish_run(lease, RunStatus.SUCCEEDED, '"ok"', None, NOW + 2,
                               checkpoints=[checkpoint(0)]) for lease in others),
            store.finish_run(bad, RunStatus.FAILED, None, '{"nul": "\x00"}', NOW + 2,
                             checkpoints=[checkpoint(0, "x", "1")]),
            return_exceptions=True,
        )  # fmt: skip
        assert outcomes[:company] == [None] * company
        assert isinstance(outcomes[company], Exception)
        for lease in others:
            assert (await get(store, lease.run_id)).status is RunStatus.SUCCEEDED
            assert await store.load_history(lease.run_id) == [stored(checkpoint(0), lease)]
        assert (await get(store, "bad")).status is RunStatus.RUNNING
        assert await store.load_history("bad") == []
    finally:
        await store.close()


async def test_a_fault_raised_in_a_shared_commit_fails_its_writes_and_never_hangs_them(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PostgresStore(with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}"))
    await store.open()
    try:
        leases = [await running(store, f"r{i}") for i in range(3)]
        monkeypatch.setattr(faults, "_RULES", faults._parse("store.before_commit@finish*=raise"))
        monkeypatch.setattr(faults, "ENABLED", True)
        outcomes = await asyncio.wait_for(
            asyncio.gather(
                *(store.finish_run(lease, RunStatus.SUCCEEDED, '"x"', None, NOW + 1)
                  for lease in leases),
                return_exceptions=True,
            ),
            timeout=20,
        )  # fmt: skip
        assert [type(o).__name__ for o in outcomes] == ["InjectedFault"] * 3
        monkeypatch.setattr(faults, "ENABLED", False)
        for lease in leases:  # nothing committed: each end is there to be made again
            assert (await get(store, lease.run_id)).status is RunStatus.RUNNING
            await store.finish_run(lease, RunStatus.SUCCEEDED, '"x"', None, NOW + 1)
            assert (await get(store, lease.run_id)).status is RunStatus.SUCCEEDED
    finally:
        await store.close()


@pytest.mark.parametrize("carried_by", ["both", "the-loser"])
async def test_two_ends_of_a_run_with_more_to_do_sharing_a_commit_leave_the_winners_only(
    postgres_url: str, carried_by: str
) -> None:
    """Neither end is settled by its one statement (an approval to cancel): what the losing
    end carried must go with it, as when the two come one after the other."""
    store = PostgresStore(with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}"))
    await store.open()
    try:
        lease = await running(store, "r1")
        await created(store, approval("p1", "r1"), NOW + 1)
        a, b = checkpoint(0, "one", '"A"'), checkpoint(1, "two", '"B"')
        outcomes = await asyncio.gather(
            store.finish_run(lease, RunStatus.SUCCEEDED, '"A"', None, NOW + 2,
                             checkpoints=[a] if carried_by == "both" else []),
            store.finish_run(lease, RunStatus.SUCCEEDED, '"B"', None, NOW + 2, checkpoints=[b]),
            return_exceptions=True,
        )  # fmt: skip
        winner = 0 if outcomes[0] is None else 1
        assert isinstance(outcomes[1 - winner], LeaseLost)
        won = [[stored(a, lease)] if carried_by == "both" else [], [stored(b, lease)]][winner]
        assert await store.load_history("r1") == won
        assert (await get(store, "r1")).result == ['"A"', '"B"'][winner]
    finally:
        await store.close()


async def test_a_fault_in_the_one_by_one_retry_fails_that_write_only(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database error fails the shared transaction and each write is committed alone: a
    fault in one of those fails it alone; the others keep their own outcomes."""
    store = PostgresStore(with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}"))
    await store.open()
    try:
        leases = [await running(store, run_id) for run_id in ("r0", "r1", "nul")]
        rules = faults._parse("store.before_commit@finish_run:r1=raise")
        monkeypatch.setattr(faults, "_RULES", rules)
        monkeypatch.setattr(faults, "ENABLED", True)
        outcomes = await asyncio.wait_for(
            asyncio.gather(
                *(store.finish_run(lease, RunStatus.SUCCEEDED,
                                   '"\x00"' if lease.run_id == "nul" else '"x"', None, NOW + 1)
                  for lease in leases),
                return_exceptions=True,
            ),
            timeout=20,
        )  # fmt: skip
        monkeypatch.setattr(faults, "ENABLED", False)
        assert outcomes[0] is None
        assert type(outcomes[1]).__name__ == "InjectedFault"
        assert isinstance(outcomes[2], psycopg.DataError)
        statuses = [(await get(store, lease.run_id)).status for lease in leases]
        assert statuses == [RunStatus.SUCCEEDED, RunStatus.RUNNING, RunStatus.RUNNING]
    finally:
        await store.close()


async def test_a_close_cut_short_strands_no_write(postgres_url: str) -> None:
    """close() under a timeout while both committers are busy and more ends are queued: the
    committers go on (their callers were not cancelled), every write gets its answer, and
    the answers are the database's."""
    url = with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}")
    store = PostgresStore(url + "&pool_max=4")
    await store.open()
    execute_in(
        url,
        "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_sleep(0.5); RETURN NEW; END $$",
        "CREATE TRIGGER slow BEFORE UPDATE ON tether_runs FOR EACH ROW "
        "WHEN (NEW.id LIKE 'slow%' AND NEW.finished_at IS NOT NULL) EXECUTE FUNCTION slow()",
    )
    names = ["slow0", "slow1", "q0", "q1", "q2"]
    leases = [await running(store, name) for name in names]
    tasks = []
    for lease in leases:
        tasks.append(asyncio.create_task(
            store.finish_run(lease, RunStatus.SUCCEEDED, '"x"', None, NOW + 1)
        ))  # fmt: skip
        await asyncio.sleep(0.05)  # slow0 and slow1 each taken by a committer; the rest queue
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(store.close(), 0.2)
    await store.close()
    _, pending = await asyncio.wait(tasks, timeout=10)
    assert not pending
    other = PostgresStore(url)
    await other.open()
    try:
        for name, task in zip(names, tasks, strict=True):
            status = (await get(other, name)).status
            if task.exception() is None:
                assert status is RunStatus.SUCCEEDED
            else:
                assert isinstance(task.exception(), StoreUnavailable)
    finally:
        await other.close()

"""The Store contract for published values and forks, run once per backend (see conftest).

set_value numbers the versions of each (run, key) from 1 and writes its checkpoint in the same
transaction, fenced by the lease; get_value and list_values read the latest versions; fork_run
makes a run from a source's history, values and untaken events in one go, idempotent by id,
and get_fork and list_forks read its link. Same rules as test_store_contract: plain float
times, nothing sleeps, exact answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from tests.contract.test_store_contract import LEASE, NOW, WF, claim_one, get, new

from tether.errors import LeaseLost
from tether.store.port import Checkpoint, CheckpointStatus, Lease, NewRun, RunStatus, Store
from tether.store.port.values import ForkRecord, ValueRecord


def done(seq: int, name: str, kind: str = "step", result: str | None = None) -> Checkpoint:
    return Checkpoint(
        seq=seq,
        name=name,
        kind=kind,
        status=CheckpointStatus.COMPLETED,
        result=result,
        attempts=1,
        started_at=NOW,
        finished_at=NOW,
    )


def value_step(seq: int, key: str = "k") -> Checkpoint:
    """A set_value's checkpoint as the engine writes it (the store sets its result)."""
    return done(seq, f"value:{key}" if seq == 0 else f"value:{key}#{seq}", "value")


async def running(store: Store, run_id: str = "r1", worker: str = "w1") -> Lease:
    """A run held by `worker` at epoch 1."""
    await store.create_run(new(run_id), NOW, owner=worker, lease_until=NOW + LEASE)
    return Lease(run_id, worker, 1)


async def taken(store: Store, lease: Lease, keys: list[str], seq: int) -> list[str]:
    """Every event of the run's mailbox among `keys`, oldest first, consumed (by checkpoints
    from `seq` on): what the run's mailbox holds."""
    payloads = []
    while result := await store.take_event(lease, keys, done(seq, f"ev{seq}", "event"), NOW):
        payloads.append(f"{json.loads(result)['key']}={json.loads(result)['value']}")
        seq += 1
    return payloads


# -- set_value, get_value, list_values ---------------------------------------------------------


async def test_set_value_numbers_versions_from_1_per_key_and_writes_its_checkpoint_with_them(
    store: Store,
) -> None:
    lease = await running(store)
    assert await store.set_value(lease, "k", '"first"', value_step(0), NOW + 1) == 1
    assert await store.set_value(lease, "k", '"second"', value_step(1), NOW + 2) == 2
    assert await store.set_value(lease, "other", "[1, 2]", value_step(2, "other"), NOW + 3) == 1
    other_run = await running(store, "r2")
    assert await store.set_value(other_run, "k", "null", value_step(0), NOW + 4) == 1
    history = await store.load_history("r1")
    assert [json.loads(c.result or "") for c in history] == [
        {"key": "k", "version": 1},
        {"key": "k", "version": 2},
        {"key": "other", "version": 1},
    ]
    expected = [value_step(0), value_step(1), value_step(2, "other")]
    assert history == [dataclasses.replace(cp, result=c.result, position=cp.at)
                       for cp, c in zip(expected, history, strict=True)]  # fmt: skip
    assert await store.get_value("r1", "k") == ValueRecord("r1", "k", 2, '"second"', 1, NOW + 2)
    assert await store.get_value("r2", "k") == ValueRecord("r2", "k", 1, "null", 0, NOW + 4)


async def test_concurrent_set_values_of_one_key_get_every_version_once(store: Store) -> None:
    lease = await running(store)
    other = store.another() or store
    if other is not store:
        await other.open()
    try:
        versions = await asyncio.gather(*(
            (store if i % 2 else other).set_value(lease, "k", str(i), value_step(i), NOW)
            for i in range(10)
        ))  # fmt: skip
    finally:
        if other is not store:
            await other.close()
    assert sorted(versions) == list(range(1, 11))
    latest = await store.get_value("r1", "k")
    assert latest is not None
    assert latest.version == 10
    assert latest.value == str(versions.index(10))  # the value of the set that got version 10
    for seq, version in enumerate(versions):  # each checkpoint names its own version
        (cp,) = [c for c in await store.load_history("r1") if c.seq == seq]
        assert json.loads(cp.result or "") == {"key": "k", "version": version}


async def test_set_value_with_a_lost_lease_writes_nothing_and_raises_lease_lost(
    store: Store,
) -> None:
    stale = await running(store)
    await store.set_value(stale, "k", '"mine"', value_step(0), NOW + 1)
    await store.claim_runs("w2", [WF], NOW + LEASE + 1, NOW + 2 * LEASE, 1)  # adopted: epoch 2
    with pytest.raises(LeaseLost):
        await store.set_value(stale, "k", '"stale"', value_step(1), NOW + LEASE + 2)
    with pytest.raises(LeaseLost):
        await store.set_value(stale, "new", '"stale"', value_step(2, "new"), NOW + LEASE + 2)
    assert await store.get_value("r1", "k") == ValueRecord("r1", "k", 1, '"mine"', 0, NOW + 1)
    assert await store.get_value("r1", "new") is None
    assert [c.seq for c in await store.load_history("r1")] == [0]
    fresh = Lease("r1", "w2", 2)
    assert await store.set_value(fresh, "k", '"theirs"', value_step(1), NOW + LEASE + 3) == 2
    await store.finish_run(fresh, RunStatus.SUCCEEDED, "null", None, NOW + LEASE + 4)
    with pytest.raises(LeaseLost):  # an ended run takes no more values
        await store.set_value(fresh, "k", '"late"', value_step(2), NOW + LEASE + 5)
    assert (await store.get_value("r1", "k")) == ValueRecord(
        "r1", "k", 2, '"theirs"', 1, NOW + LEASE + 3
    )


async def test_get_value_is_the_latest_version_or_none(store: Store) -> None:
    assert await store.get_value("nope", "k") is None
    lease = await running(store)
    assert await store.get_value("r1", "k") is None
    for seq in range(3):
        await store.set_value(lease, "k", json.dumps(seq), value_step(seq), NOW + seq)
        assert await store.get_value("r1", "k") == ValueRecord(
            "r1", "k", seq + 1, json.dumps(seq), seq, NOW + seq
        )
    assert await store.get_value("r1", "K") is None  # keys are exact


async def test_list_values_gives_the_latest_version_of_each_key_by_key(store: Store) -> None:
    assert await store.list_values("r1") == []
    lease = await running(store)
    other = await running(store, "r2")
    await store.set_value(other, "a", '"not r1"', value_step(0, "a"), NOW)
    writes = [("b", '"b1"'), ("a", '"a1"'), ("c", '"c1"'), ("b", '"b2"'), ("a", '"a2"')]
    for seq, (key, value) in enumerate(writes):
        await store.set_value(
            lease, key, value, done(seq, f"value:{key}@{seq}", "value"), NOW + seq
        )
    assert await store.list_values("r1") == [
        ValueRecord("r1", "a", 2, '"a2"', 4, NOW + 4),
        ValueRecord("r1", "b", 2, '"b2"', 3, NOW + 3),
        ValueRecord("r1", "c", 1, '"c1"', 2, NOW + 2),
    ]
    assert await store.list_values("r2") == [ValueRecord("r2", "a", 1, '"not r1"', 0, NOW)]


# -- fork_run, get_fork, list_forks ------------------------------------------------------------


async def source(store: Store) -> tuple[Lease, list[Checkpoint]]:
    """Run "src", running: events e=one, e=two, x=three and a tether: one in its mailbox; then
    checkpoints 0 "a" (a step), 1 a value k=first, 2 "take" consuming e=one, 3 a value
    k=second, 4 a value j=only."""
    lease = await running(store, "src")
    for key, payload in (("e", '"one"'), ("e", '"two"'), ("x", '"three"'),
                         ("tether:child:c", '"theirs"')):  # fmt: skip
        await store.deliver_event("src", key, payload, NOW)
    await store.write_checkpoint(lease, done(0, "a", result="1"), NOW + 1)
    await store.set_value(lease, "k", '"first"', done(1, "value:k", "value"), NOW + 1)
    assert await store.take_event(lease, ["e"], done(2, "take", "event"), NOW + 2)
    await store.set_value(lease, "k", '"second"', done(3, "value:k#2", "value"), NOW + 3)
    await store.set_value(lease, "j", '"only"', done(4, "value:j", "value"), NOW + 4)
    return lease, await store.load_history("src")


async def test_fork_run_copies_the_given_history_its_values_and_the_untaken_events(
    store: Store,
) -> None:
    src_lease, history = await source(store)
    link = ForkRecord("f1", "src", "value:k#2", 3, NOW + 10)
    fork = NewRun("f1", WF, '{"args": [1]}', priority=3, started_by="ann", queue="q")
    record, created = await store.fork_run(
        fork, link, history[:3], [("extra", '"four"'), ("tether:child:c", '"mine"')], NOW + 10
    )
    assert created
    assert record.status is RunStatus.PENDING
    assert await get(store, "f1") == record
    assert await store.load_history("f1") == history[:3]
    # The versions those checkpoints set (k=first at seq 1), not the later ones.
    assert await store.list_values("f1") == [ValueRecord("f1", "k", 1, '"first"', 1, NOW + 1)]
    assert await store.get_fork("f1") == link
    # Its mailbox: the source's events that no copied checkpoint took, in order, without
    # Tether's own keys, then the given events.
    assert (await claim_one(store, "w2", NOW + 11)).id == "f1"
    # The run was made as create_run without owner makes one.
    twin, _ = await store.create_run(dataclasses.replace(fork, id="twin"), NOW + 10)
    assert record == dataclasses.replace(twin, id="f1")
    keys = ["e", "x", "extra", "tether:child:c"]
    assert await taken(store, Lease("f1", "w2", 1), keys, 10) == [
        "e=two", "x=three", "extra=four", "tether:child:c=mine",
    ]  # fmt: skip
    # The source is left as it was.
    assert await store.load_history("src") == history
    assert await taken(store, src_lease, ["e", "x", "extra"], 10) == ["e=two", "x=three"]
    assert [v.key for v in await store.list_values("src")] == ["j", "k"]


async def test_a_fork_without_the_checkpoint_that_took_an_event_gets_that_event_again(
    store: Store,
) -> None:
    _, history = await source(store)
    link = ForkRecord("f2", "src", "take", 2, NOW + 10)
    await store.fork_run(NewRun("f2", WF, "[]"), link, history[:2], [], NOW + 10)
    assert await store.load_history("f2") == history[:2]
    assert await store.list_values("f2") == [ValueRecord("f2", "k", 1, '"first"', 1, NOW + 1)]
    await claim_one(store, "w2", NOW + 11)
    assert await taken(store, Lease("f2", "w2", 1), ["e", "x"], 10) == [
        "e=one", "e=two", "x=three",
    ]  # fmt: skip
    # From the very start: no history, no values.
    start = ForkRecord("f3", "src", "a", 0, NOW + 12)
    await store.fork_run(NewRun("f3", WF, "[]"), start, [], [], NOW + 12)
    assert await store.load_history("f3") == []
    assert await store.list_values("f3") == []


async def test_fork_run_of_an_existing_id_writes_nothing_and_returns_that_run(
    store: Store,
) -> None:
    _, history = await source(store)
    link = ForkRecord("f1", "src", "value:k#2", 3, NOW + 10)
    first, created = await store.fork_run(NewRun("f1", WF, "[]"), link, history[:3],
                                          [("extra", '"four"')], NOW + 10)  # fmt: skip
    assert created
    other_link = ForkRecord("f1", "src", "a", 0, NOW + 20)
    again, created_again = await store.fork_run(
        NewRun("f1", "other", "[9]", priority=9), other_link, history, [("more", "1")], NOW + 20
    )
    assert (again, created_again) == (first, False)
    assert await store.load_history("f1") == history[:3]
    assert await store.list_values("f1") == [ValueRecord("f1", "k", 1, '"first"', 1, NOW + 1)]
    assert await store.get_fork("f1") == link
    assert await store.list_forks("src") == [link]
    await claim_one(store, "w2", NOW + 21)
    assert await taken(store, Lease("f1", "w2", 1), ["e", "x", "extra", "more"], 10) == [
        "e=two", "x=three", "extra=four",
    ]  # fmt: skip
    # A run that was not made by fork_run: returned as it is, and it stays no fork.
    plain, _ = await store.create_run(new("plain"), NOW)
    assert await store.fork_run(new("plain"), ForkRecord("plain", "src", "a", 0, NOW + 30),
                                history, [], NOW + 30) == (plain, False)  # fmt: skip
    assert await store.get_fork("plain") is None
    assert await store.load_history("plain") == []


async def test_get_fork_and_list_forks_read_the_links_oldest_first(store: Store) -> None:
    _, history = await source(store)
    await store.create_run(new("other-src"), NOW)
    links = [
        ForkRecord("f-b", "src", "a", 0, NOW + 10),
        ForkRecord("f-a", "src", "take", 2, NOW + 20),
        ForkRecord("f-c", "other-src", "a", 0, NOW + 15),
    ]
    for link in links:
        await store.fork_run(NewRun(link.run_id, WF, "[]"), link, history[: link.from_seq], [],
                             link.created_at)  # fmt: skip
    chained = ForkRecord("f-d", "f-b", "a", 0, NOW + 30)  # a fork of a fork
    await store.fork_run(NewRun("f-d", WF, "[]"), chained, [], [], NOW + 30)
    assert await store.list_forks("src") == [links[0], links[1]]
    assert await store.list_forks("other-src") == [links[2]]
    assert await store.list_forks("f-b") == [chained]
    assert await store.list_forks("f-a") == []
    assert await store.list_forks("nope") == []
    assert [await store.get_fork(i) for i in ("f-a", "f-b", "f-c", "f-d")] == [
        links[1], links[0], links[2], chained,
    ]  # fmt: skip
    assert await store.get_fork("src") is None
    assert await store.get_fork("nope") is None

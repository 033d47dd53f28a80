"""The Store contract for schedules, run once per backend (see conftest).

put_schedule inserts a schedule with its cursor at `now`, or stores a new definition and keeps
the cursor; advance_schedule is a compare-and-set of the cursor that inserts the slot's runs
with it, so one worker wins each slot; list_schedules orders by name. Same rules as
test_store_contract: plain float times, nothing sleeps, exact answers.
"""

from __future__ import annotations

import asyncio

from tests.contract.test_store_contract import LEASE, NOW, WF, get, new

from tether.store.port import NewRun, RunStatus, Store
from tether.store.port.schedules import ScheduleRecord, ScheduleSpec

HOURLY = ScheduleSpec("hourly", WF, "0 * * * *", "UTC", "latest")


def record(
    spec: ScheduleSpec, last_slot: float, created_at: float, updated_at: float
) -> ScheduleRecord:
    return ScheduleRecord(
        spec.name, spec.workflow, spec.cron, spec.tz, spec.catch_up, last_slot, created_at,
        updated_at,
    )  # fmt: skip


def slot_run(run_id: str) -> NewRun:
    return NewRun(run_id, WF, '{"args": [], "kwargs": {"scheduled_at": 1}}', priority=2)


async def test_put_schedule_inserts_a_schedule_with_its_cursor_at_now(store: Store) -> None:
    stored = await store.put_schedule(HOURLY, NOW + 0.5)
    assert stored == record(HOURLY, NOW + 0.5, NOW + 0.5, NOW + 0.5)
    assert stored.spec == HOURLY
    assert await store.list_schedules() == [stored]


async def test_put_schedule_of_a_known_name_stores_its_definition_and_keeps_its_cursor(
    store: Store,
) -> None:
    await store.put_schedule(HOURLY, NOW)
    assert await store.advance_schedule("hourly", NOW, NOW + 3600, [], NOW + 3601)
    changed = ScheduleSpec("hourly", "other_wf", "*/5 * * * *", "Europe/Paris", "all")
    stored = await store.put_schedule(changed, NOW + 7200)
    assert stored == record(changed, NOW + 3600, NOW, NOW + 7200)
    assert await store.list_schedules() == [stored]
    # The same definition again changes nothing.
    assert await store.put_schedule(changed, NOW + 9000) == stored
    assert await store.list_schedules() == [stored]


async def test_advance_schedule_moves_the_cursor_and_inserts_the_slots_runs_pending(
    store: Store,
) -> None:
    await store.put_schedule(HOURLY, NOW)
    moved = await store.advance_schedule(
        "hourly", NOW, NOW + 3600, [slot_run("s1"), slot_run("s2")], NOW + 3601
    )
    assert moved is True
    assert await store.list_schedules() == [record(HOURLY, NOW + 3600, NOW, NOW + 3601)]
    for run_id in ("s1", "s2"):
        run = await get(store, run_id)
        assert (run.status, run.owner, run.epoch, run.wake_at) == (RunStatus.PENDING, None, 0, None)
        assert (run.workflow, run.args, run.priority) == (WF, slot_run(run_id).args, 2)
        assert (run.created_at, run.updated_at) == (NOW + 3601, NOW + 3601)
    claimed = await store.claim_runs("w1", [WF], NOW + 3602, NOW + 3602 + LEASE, 10)
    assert sorted(r.id for r in claimed) == ["s1", "s2"]
    # With no runs (a slot skipped for good) the cursor moves all the same.
    assert await store.advance_schedule("hourly", NOW + 3600, NOW + 7200, [], NOW + 7201)
    assert (await store.list_schedules())[0].last_slot == NOW + 7200


async def test_advance_schedule_with_a_stale_cursor_writes_nothing_and_returns_false(
    store: Store,
) -> None:
    await store.put_schedule(HOURLY, NOW)
    assert await store.advance_schedule("hourly", NOW, NOW + 3600, [slot_run("won")], NOW + 1)
    lost = await store.advance_schedule("hourly", NOW, NOW + 3600, [slot_run("lost")], NOW + 2)
    assert lost is False
    assert await store.get_run("lost") is None
    assert await store.list_schedules() == [record(HOURLY, NOW + 3600, NOW, NOW + 1)]
    # An unknown schedule: nothing either.
    assert not await store.advance_schedule("nope", NOW, NOW + 60, [slot_run("x")], NOW + 3)
    assert await store.get_run("x") is None
    assert [s.name for s in await store.list_schedules()] == ["hourly"]


async def test_advance_schedule_skips_a_run_whose_id_exists(store: Store) -> None:
    await store.put_schedule(HOURLY, NOW)
    existing, _ = await store.create_run(new("s1"), NOW, owner="w1", lease_until=NOW + LEASE)
    assert await store.advance_schedule(
        "hourly", NOW, NOW + 60, [slot_run("s1"), slot_run("s2")], NOW + 61
    )
    assert await get(store, "s1") == existing
    assert (await get(store, "s2")).status is RunStatus.PENDING


async def test_two_workers_advancing_one_slot_at_once_start_it_once(store: Store) -> None:
    await store.put_schedule(HOURLY, NOW)
    other = store.another() or store
    if other is not store:
        await other.open()
    try:
        results = await asyncio.gather(*(
            (store if i % 2 else other).advance_schedule(
                "hourly", NOW, NOW + 3600, [slot_run(f"s-{i}")], NOW + 3601
            )
            for i in range(6)
        ))  # fmt: skip
    finally:
        if other is not store:
            await other.close()
    assert sorted(results) == [False] * 5 + [True]
    winner = results.index(True)
    assert [r.id for r in await store.list_runs()] == [f"s-{winner}"]
    assert (await store.list_schedules())[0].last_slot == NOW + 3600


async def test_list_schedules_gives_every_schedule_by_name(store: Store) -> None:
    assert await store.list_schedules() == []
    specs = {n: ScheduleSpec(n, WF, "@daily", "UTC", "skip") for n in ("nightly", "b", "a-1")}
    for i, spec in enumerate(specs.values()):
        await store.put_schedule(spec, NOW + i)
    assert await store.list_schedules() == [
        record(specs["a-1"], NOW + 2, NOW + 2, NOW + 2),
        record(specs["b"], NOW + 1, NOW + 1, NOW + 1),
        record(specs["nightly"], NOW, NOW, NOW),
    ]

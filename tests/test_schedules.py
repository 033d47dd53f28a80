"""Schedules and runs started later, on every backend (memory, a real SQLite file, a real
PostgreSQL) with a fake clock: one run per slot with two workers on one database, catch-up
after downtime (skip, latest, all), time zones across DST, definition-time errors, and
`app.start_at` (waiting until its time, idempotent, cancellable before it starts)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner

import tether
from tether import schedules
from tether.cli import cli
from tether.clock import Clock, SystemClock
from tether.schedules import Cron, Schedule, slot_run_id, tick
from tether.store.port import NewRun, RunStatus, Store
from tether.store.port.schedules import ScheduleSpec
from tether.testing import FakeClock

PARIS = ZoneInfo("Europe/Paris")
# 30 s after a slot of "*/5 * * * *" (and of every hour): the first registration's "now".
START = datetime(2026, 1, 5, 12, 0, 30, tzinfo=UTC)

MakeApp = Callable[..., tether.App]


@pytest.fixture(
    params=[("memory", False), ("sqlite", False), ("postgres", False)],
    ids=["memory", "sqlite", "postgres"],
)
def mode(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """Every backend once: schedules do not depend on replay (it is covered elsewhere)."""
    return request.param  # type: ignore[no-any-return]


def define(app: tether.App, *, cron: str = "*/5 * * * *", **options: object) -> None:
    """The same scheduled workflow, as each worker process would define it."""

    @app.schedule(cron, **options)  # type: ignore[arg-type]
    @app.workflow()
    async def report(scheduled_at: datetime) -> str:
        return scheduled_at.isoformat()


def app_on(make_app: MakeApp, clock: FakeClock, **options: object) -> tether.App:
    # Long leases: heartbeats (real seconds) never fire during a test, and fake-clock jumps
    # never expire a lease under a running run.
    app = make_app(clock=clock, lease_duration=timedelta(hours=12))
    define(app, **options)
    return app


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.01)


async def scheduled_runs(app: tether.App) -> dict[str, RunStatus]:
    return {r.id: r.status for r in await app.list_runs(workflow="report", limit=10_000)}


async def all_done(app: tether.App, count: int) -> bool:
    runs = await scheduled_runs(app)
    return len(runs) >= count and all(s is RunStatus.SUCCEEDED for s in runs.values())


async def registered(app: tether.App) -> bool:
    return any(i.registered for i in await app.list_schedules())


def slot_ids(*moments: datetime) -> set[str]:
    return {slot_run_id("report", m.timestamp()) for m in moments}


# -- definition-time errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr", ["", "*/5 * * *", "61 * * * *", "* * * * * *", "every day", "0 0 30 2 *"]
)
def test_an_invalid_cron_expression_is_refused_when_the_schedule_is_defined(expr: str) -> None:
    app = tether.App("memory://")
    with pytest.raises(tether.ConfigurationError, match="cron expression") as caught:
        app.schedule(expr)
    assert "five fields" in str(caught.value) or "non-empty" in str(caught.value)


def test_a_schedule_on_something_other_than_a_workflow_of_this_app_says_what_to_do() -> None:
    app, other = tether.App("memory://"), tether.App("memory://")

    async def plain(scheduled_at: datetime) -> None:
        pass

    with pytest.raises(tether.ConfigurationError, match=r"above @app.workflow\(\)"):
        app.schedule("* * * * *")(plain)  # type: ignore[type-var]
    with pytest.raises(tether.ConfigurationError, match=r"above @app.workflow\(\)"):
        app.schedule("* * * * *")(other.workflow()(plain))


def test_a_scheduled_workflow_must_accept_scheduled_at() -> None:
    app = tether.App("memory://")

    @app.workflow()
    async def nightly(day: str) -> None:
        pass

    with pytest.raises(tether.ConfigurationError, match="scheduled_at: datetime"):
        app.schedule("0 3 * * *")(nightly)


def test_bad_time_zone_catch_up_or_duplicate_name_is_refused() -> None:
    app = tether.App("memory://")
    with pytest.raises(tether.ConfigurationError, match="unknown time zone 'Mars/Olympus'"):
        app.schedule("* * * * *", tz="Mars/Olympus")
    with pytest.raises(tether.ConfigurationError, match="catch_up must be one of"):
        app.schedule("* * * * *", catch_up="some")
    define(app)
    with pytest.raises(tether.ConfigurationError, match="two schedules are named 'report'"):
        app.schedule("0 * * * *")(app.engine.workflows["report"])


async def test_a_schedule_defined_while_the_worker_runs_is_refused() -> None:
    app = tether.App("memory://")

    @app.workflow()
    async def late(scheduled_at: datetime) -> None:
        pass

    async with app:
        with pytest.raises(tether.ConfigurationError, match="before `async with app:`"):
            app.schedule("* * * * *")(late)


# -- slots in time zones ----------------------------------------------------------------------


def slots(cron: Cron, after: datetime, count: int) -> list[datetime]:
    found, moment = [], after.timestamp()
    for _ in range(count):
        following = cron.next_after(moment)
        assert following is not None
        found.append(cron.local(following))
        moment = following
    return found


def test_a_daily_slot_in_the_hour_dst_skips_runs_once_when_the_gap_ends() -> None:
    cron = Cron("30 2 * * *", "Europe/Paris")  # 2026-03-29: 02:00 jumps to 03:00
    got = slots(cron, datetime(2026, 3, 27, 12, tzinfo=PARIS), 4)
    assert [m.isoformat() for m in got] == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]


def test_a_daily_slot_in_the_hour_dst_repeats_runs_once() -> None:
    cron = Cron("30 2 * * *", "Europe/Paris")  # 2026-10-25: 03:00 goes back to 02:00
    got = slots(cron, datetime(2026, 10, 24, 12, tzinfo=PARIS), 2)
    assert [m.isoformat() for m in got] == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]


def test_an_hourly_schedule_follows_elapsed_time_across_both_dst_changes() -> None:
    cron = Cron("0 * * * *", "Europe/Paris")
    spring = slots(cron, datetime(2026, 3, 29, 0, 30, tzinfo=PARIS), 3)
    assert [m.isoformat() for m in spring] == [
        "2026-03-29T01:00:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T04:00:00+02:00",
    ]  # fmt: skip
    autumn = slots(cron, datetime(2026, 10, 25, 1, 30, tzinfo=PARIS), 3)
    assert [m.isoformat() for m in autumn] == [
        "2026-10-25T02:00:00+02:00", "2026-10-25T02:00:00+01:00", "2026-10-25T03:00:00+01:00",
    ]  # fmt: skip
    ids = {slot_run_id("h", m.timestamp()) for m in autumn}  # the repeated 02:00: two slots
    assert ids == {f"schedule:h:2026-10-25T{h}:00:00Z" for h in ("00", "01", "02")}


def test_due_slots_are_found_during_the_second_pass_of_a_repeated_hour() -> None:
    cron = Cron("30 2 * * *", "Europe/Paris")
    first_pass_0230 = datetime(2026, 10, 25, 2, 30, tzinfo=PARIS).timestamp()  # 00:30 UTC
    cursor = datetime(2026, 10, 25, 0, 0, tzinfo=UTC).timestamp()
    now = datetime(2026, 10, 25, 1, 15, tzinfo=UTC).timestamp()  # 02:15 local, second pass
    assert cron.due(cursor, now, 10) == ([first_pass_0230], False)
    assert cron.next_after(now) == datetime(2026, 10, 26, 2, 30, tzinfo=PARIS).timestamp()


def test_cron_macros_and_utc() -> None:
    cron = Cron("@daily")
    assert cron.tz == "UTC"
    got = slots(cron, datetime(2026, 1, 1, 12, tzinfo=UTC), 2)
    assert [m.isoformat() for m in got] == [
        "2026-01-02T00:00:00+00:00",
        "2026-01-03T00:00:00+00:00",
    ]


# -- one run per slot, with two workers and after downtime ------------------------------------


async def test_each_slot_starts_exactly_one_run_with_two_workers(make_app: MakeApp) -> None:
    clock = FakeClock(START)
    a, b = app_on(make_app, clock), app_on(make_app, clock)
    async with a, b:
        await until(lambda: registered(a))
        for n in range(1, 5):
            clock.advance(timedelta(minutes=5))  # each slot is 30 s old when both tick
            await until(lambda n=n: all_done(a, n))  # type: ignore[misc]
        runs = await scheduled_runs(b)
    expected = [START.replace(second=0) + timedelta(minutes=5 * n) for n in range(1, 5)]
    assert set(runs) == slot_ids(*expected)
    for moment in expected:
        handle = await a.get(slot_run_id("report", moment.timestamp()))
        assert datetime.fromisoformat(await handle.result()) == moment


async def test_two_workers_ticking_at_once_decide_each_slot_once(make_app: MakeApp) -> None:
    clock = FakeClock(START)
    a, b = app_on(make_app, clock, catch_up="all"), app_on(make_app, clock, catch_up="all")
    mine = [list(app._schedules.values()) for app in (a, b)]
    await a.open()
    await b.open()
    await tick(a.engine, mine[0])  # registers the schedule: its cursor is now
    started: list[str] = []
    for minutes in (5, 20, 25):
        clock.advance(timedelta(minutes=minutes))
        both = await asyncio.gather(tick(a.engine, mine[0]), tick(b.engine, mine[1]))
        assert [] in [r.started for r in both]  # the loser of the compare-and-set wrote nothing
        started += both[0].started + both[1].started
    slots_started = [START.replace(second=0) + timedelta(minutes=5 * n) for n in range(1, 11)]
    assert sorted(started) == sorted(slot_ids(*slots_started))
    assert set(await scheduled_runs(a)) == slot_ids(*slots_started)
    assert all(s is RunStatus.PENDING for s in (await scheduled_runs(a)).values())


@pytest.mark.parametrize(
    ("catch_up", "late", "expected_minutes"),
    [
        ("latest", 0, [60]),
        ("latest", 150, [60]),
        ("all", 150, list(range(5, 61, 5))),
        ("skip", 150, []),  # the latest missed slot is 2.5 min late: beyond the grace
        ("skip", 30, [60]),  # 30 s late: within the grace, it still starts
    ],
)
async def test_downtime_with_two_workers_is_caught_up_by_the_policy(
    make_app: MakeApp,
    caplog: pytest.LogCaptureFixture,
    catch_up: str,
    late: int,
    expected_minutes: list[int],
) -> None:
    caplog.set_level(logging.INFO, logger="tether.schedules")
    clock = FakeClock(START.replace(second=0))
    a, b = app_on(make_app, clock, catch_up=catch_up), app_on(make_app, clock, catch_up=catch_up)
    async with a, b:
        await until(lambda: registered(a))
        # The slot at the first registration itself is not started: no backfill.
    clock.advance(timedelta(minutes=60, seconds=late))  # both workers are down for an hour
    a, b = app_on(make_app, clock, catch_up=catch_up), app_on(make_app, clock, catch_up=catch_up)
    async with a, b:
        await until(lambda: all_done(a, len(expected_minutes)))
        await until(lambda: last_slot_is(a, START.replace(second=0) + timedelta(minutes=60)))
        runs = await scheduled_runs(b)
        # Back to normal: the next slot starts on time.
        clock.set((START.replace(second=0) + timedelta(minutes=65)).timestamp())
        await until(lambda: all_done(a, len(expected_minutes) + 1))
        after = await scheduled_runs(b)
    base = START.replace(second=0)
    assert set(runs) == slot_ids(*(base + timedelta(minutes=m) for m in expected_minutes))
    assert set(after) - set(runs) == slot_ids(base + timedelta(minutes=65))
    logged = [r.getMessage() for r in caplog.records if r.name == "tether.schedules"]
    if catch_up == "all":  # every missed slot started: nothing to report
        assert logged == []
    else:  # the skipped slots are reported once (by the worker that decided), not as a bound
        assert len(logged) == 1
        assert "missed slots since 2026-01-05T12:00:00+00:00" in logged[0]


async def last_slot_is(app: tether.App, moment: datetime) -> bool:
    infos = await app.list_schedules()
    return infos[0].last_slot == moment


async def test_catch_up_all_is_bounded_and_says_so(
    make_app: MakeApp, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(schedules, "MAX_CATCH_UP", 3)
    clock = FakeClock(START)
    app = app_on(make_app, clock, catch_up="all")
    async with app:
        await until(lambda: registered(app))
    clock.advance(timedelta(minutes=30))
    app = app_on(make_app, clock, catch_up="all")
    with caplog.at_level(logging.WARNING, logger="tether.schedules"):
        async with app:
            await until(lambda: all_done(app, 3))
            runs = await scheduled_runs(app)
    base = START.replace(second=0)
    assert set(runs) == slot_ids(*(base + timedelta(minutes=m) for m in (20, 25, 30)))
    assert "missed more than 3 slots" in caplog.text


async def test_scheduled_at_is_the_slot_in_the_schedule_time_zone(make_app: MakeApp) -> None:
    clock = FakeClock(datetime(2026, 3, 28, 23, 0, 30, tzinfo=PARIS))
    app = app_on(make_app, clock, cron="30 2 * * *", tz="Europe/Paris")
    async with app:
        await until(lambda: registered(app))
        clock.advance(timedelta(hours=4))  # past 02:30, which this night does not have
        await until(lambda: all_done(app, 1))
        (run_id,) = await scheduled_runs(app)
        result = await (await app.get(run_id)).result()
    assert run_id == "schedule:report:2026-03-29T01:00:00Z"
    assert result == "2026-03-29T03:00:00+02:00"


async def test_a_changed_definition_keeps_the_cursor(make_app: MakeApp) -> None:
    clock = FakeClock(START)
    app = app_on(make_app, clock)
    async with app:
        await until(lambda: registered(app))
    clock.advance(timedelta(minutes=1))
    app = app_on(make_app, clock, cron="0 * * * *", catch_up="all")
    await app.open()
    (row,) = await app.engine.store.list_schedules()
    assert (row.cron, row.catch_up, row.last_slot) == ("*/5 * * * *", "latest", START.timestamp())
    await tick(app.engine, list(app._schedules.values()))
    (row,) = await app.engine.store.list_schedules()
    assert (row.cron, row.catch_up, row.last_slot) == ("0 * * * *", "all", START.timestamp())
    (info,) = await app.list_schedules()
    assert (info.defined, info.last_slot) == (True, START)
    assert info.next_slot == START.replace(minute=0, second=0) + timedelta(hours=1)


async def test_the_cursor_moves_by_compare_and_set_with_its_runs(
    make_store: Callable[[], Store],
) -> None:
    stores = [make_store(), make_store()]
    for store in stores:
        await store.open()
    try:
        spec = ScheduleSpec("s", "report", "* * * * *", "UTC", "all")
        row = await stores[0].put_schedule(spec, 100.0)
        assert (row.last_slot, row.created_at) == (100.0, 100.0)
        again = await stores[1].put_schedule(spec, 200.0)  # registered again: cursor kept
        assert again == row
        runs = [NewRun(f"schedule:s:{n}", "report", '{"args": [], "kwargs": {}}') for n in (1, 2)]
        moved = await asyncio.gather(
            *(store.advance_schedule("s", 100.0, 160.0, runs, 170.0) for store in stores)
        )
        assert sorted(moved) == [False, True]
        assert not await stores[0].advance_schedule("s", 100.0, 220.0, runs[:1], 230.0)
        assert not await stores[0].advance_schedule("unknown", 100.0, 220.0, runs, 230.0)
        (stored,) = await stores[1].list_schedules()
        assert (stored.last_slot, stored.updated_at) == (160.0, 170.0)
        created = await stores[0].list_runs(workflow="report")
        assert sorted(r.id for r in created) == ["schedule:s:1", "schedule:s:2"]
        assert all(r.status is RunStatus.PENDING and r.created_at == 170.0 for r in created)
        # A slot's run that exists already (inserted by a cursor move) is left as it is.
        assert await stores[0].advance_schedule("s", 160.0, 220.0, runs, 230.0)
        assert len(await stores[0].list_runs(workflow="report")) == 2
    finally:
        for store in stores:
            await store.close()


async def test_a_worker_that_does_not_serve_the_workflow_starts_no_slot(
    make_app: MakeApp,
) -> None:
    clock = FakeClock(START)
    app = make_app(clock=clock, lease_duration=timedelta(hours=12))

    @app.schedule("* * * * *")
    @app.workflow(queue="elsewhere")
    async def report(scheduled_at: datetime) -> str:
        return "x"

    app.engine.settings = dataclasses.replace(app.engine.settings, queues=("default",))
    async with app:
        await asyncio.sleep(0.1)
        assert not await registered(app)


def test_the_cli_lists_schedules_with_their_slots(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"

    async def setup() -> None:
        clock = FakeClock(START)
        app = tether.App(url, clock=clock)
        define(app, tz="Europe/Paris")
        await app.open()
        await tick(app.engine, list(app._schedules.values()))
        await app.close()

    asyncio.run(setup())
    result = CliRunner().invoke(cli, ["schedules", "--database", url, "list", "--json"])
    assert result.exit_code == 0, result.output
    (doc,) = json.loads(result.output)
    assert (doc["name"], doc["tz"]) == ("report", "Europe/Paris")
    assert doc["last_slot"] == START.isoformat()
    assert (doc["registered"], doc["defined"]) == (True, False)
    table = CliRunner().invoke(
        cli, ["schedules", "--database", url, "list"], env={"COLUMNS": "200"}
    )
    assert "report" in table.output
    assert "*/5 * * * *" in table.output


# -- start_at ---------------------------------------------------------------------------------


def later_app(make_app: MakeApp, clock: Clock) -> tuple[tether.App, list[str]]:
    app = make_app(clock=clock, lease_duration=timedelta(hours=12))
    executed: list[str] = []

    @app.workflow()
    async def remind(text: str) -> str:
        executed.append(text)
        return text.upper()

    return app, executed


async def test_start_at_runs_at_its_time_and_not_before(make_app: MakeApp) -> None:
    clock = FakeClock(START)
    app, executed = later_app(make_app, clock)
    async with app:
        handle = await app.start_at(START + timedelta(hours=1), "remind", "hi", id="r1")
        assert await handle.status() is RunStatus.WAITING
        clock.advance(timedelta(minutes=59))
        app.engine.worker.notify()  # type: ignore[union-attr]
        await asyncio.sleep(0.2)
        assert (await handle.status(), executed) == (RunStatus.WAITING, [])
        clock.advance(timedelta(minutes=1))
        assert await handle.result(timeout=10) == "HI"
        run = await app.engine.store.get_run("r1")
    assert run is not None
    assert run.started_at == (START + timedelta(hours=1)).timestamp()


async def test_start_at_in_the_past_or_with_a_timedelta(make_app: MakeApp) -> None:
    clock = FakeClock(START)
    app, executed = later_app(make_app, clock)
    async with app:
        past = await app.start_at(START - timedelta(days=1), "remind", "past")
        assert await past.result(timeout=10) == "PAST"
        soon = await app.start_at(timedelta(seconds=90), "remind", "soon")
        assert await soon.status() is RunStatus.WAITING
        clock.advance(timedelta(seconds=90))
        assert await soon.result(timeout=10) == "SOON"
    assert executed == ["past", "soon"]


async def test_start_at_with_the_same_id_is_the_same_run(make_app: MakeApp) -> None:
    clock = FakeClock(START)
    app, _ = later_app(make_app, clock)
    await app.open()
    first = await app.start_at(timedelta(hours=1), "remind", "x", id="once")
    again = await app.start_at(timedelta(hours=2), "remind", "x", id="once")
    assert again.id == first.id
    assert len(await app.list_runs()) == 1
    with pytest.raises(tether.IdempotencyConflict, match="once"):
        await app.start_at(timedelta(hours=1), "remind", "other", id="once")


async def test_a_run_started_later_is_cancelled_before_it_starts(make_app: MakeApp) -> None:
    clock = FakeClock(START)
    app, executed = later_app(make_app, clock)
    async with app:
        handle = await app.start_at(timedelta(minutes=10), "remind", "never")
        await handle.cancel()
        assert await handle.status() is RunStatus.CANCELLED
        clock.advance(timedelta(hours=1))
        app.engine.worker.notify()  # type: ignore[union-attr]
        await asyncio.sleep(0.2)
        with pytest.raises(tether.RunCancelled):
            await handle.result(timeout=1)
    assert executed == []


async def test_start_at_refuses_a_naive_datetime() -> None:
    app = tether.App("memory://")

    @app.workflow()
    async def remind(text: str) -> str:
        return text

    with pytest.raises(tether.ConfigurationError, match="aware datetime"):
        await app.start_at(datetime(2030, 1, 1, 9, 0), remind, "x")


async def test_a_worker_wakes_for_a_run_another_process_started_later(
    make_app: MakeApp, mode: tuple[str, bool]
) -> None:
    if mode[0] == "memory":
        pytest.skip("one process per memory store: nothing to learn from another process")
    # The real clock, and a poll interval far beyond the test's timeout: only the worker's
    # next wake-up time (learned from the database) can start the run in time.
    worker, executed = later_app(make_app, SystemClock())
    worker.engine.settings = dataclasses.replace(worker.engine.settings, poll_interval=600.0)
    caller, _ = later_app(make_app, SystemClock())
    async with worker:
        await asyncio.sleep(0.05)  # the worker is idle, waiting on its poll
        handle = await caller.start_at(timedelta(seconds=0.5), "remind", "cross")
        assert await handle.result(timeout=30) == "CROSS"
    assert executed == ["cross"]


def test_slot_run_ids_name_the_schedule_and_the_slot_in_utc() -> None:
    moment = datetime(2026, 7, 1, 9, 30, tzinfo=PARIS)
    assert slot_run_id("nightly", moment.timestamp()) == "schedule:nightly:2026-07-01T07:30:00Z"


def test_a_schedule_takes_its_name_and_time_zone_from_the_decorator() -> None:
    app = tether.App("memory://")
    define(app, tz=PARIS, name="paris")
    (schedule,) = app._schedules.values()
    assert isinstance(schedule, Schedule)
    assert (schedule.spec.name, schedule.spec.tz, schedule.spec.workflow) == (
        "paris", "Europe/Paris", "report",
    )  # fmt: skip

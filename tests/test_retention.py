"""Retention on every backend: what ended long ago goes with all its rows, what must stay stays
(unfinished runs, young runs, the family of an unfinished run, audit trails of deleted runs,
undelivered outbox messages), a dry run counts exactly what a gc deletes, big runs go over
several transactions, the worker's service deletes in the background, and on SQLite the file
shrinks and a WAL grown under a long reader is cut back. A fake clock makes runs old."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sqlite3
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from tests.postgres_server import with_schema

import tether
from tether import retention as retention_module
from tether.retention import Retention
from tether.store.drivers.sqlite import JOURNAL_SIZE_LIMIT
from tether.store.port import Checkpoint, CheckpointStatus, Lease, NewRun, RunStatus
from tether.store.port.retention import START
from tether.testing import FakeClock

DAY = timedelta(days=1)
BACKENDS = ["memory", "sqlite", "postgres"]


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/retention.db"
    return with_schema(request.getfixturevalue("postgres_url"), f"t_{uuid.uuid4().hex[:12]}")


@dataclasses.dataclass
class Flows:
    app: tether.App
    clock: FakeClock
    steps: tether.Workflow[[int], int]
    waits: tether.Workflow[[], object]
    parent: tether.Workflow[[], object]
    leaves_child: tether.Workflow[[], str]
    asks: tether.Workflow[[], bool]


def build(url: str, **options: object) -> Flows:
    clock = FakeClock()
    # Leases outlast the clock's jumps: a run held in memory is not taken over meanwhile.
    options.setdefault("lease_duration", 1000 * DAY)
    app = tether.App(url, clock=clock, **options)  # type: ignore[arg-type]
    app.engine.settings = dataclasses.replace(app.engine.settings, poll_interval=0.05)

    @app.step()
    async def work(x: int) -> int:
        return x + 1

    @app.workflow()
    async def steps(n: int) -> int:
        x = 0
        for _ in range(n):
            x = await work(x)
        await tether.stream("out").write(x)
        return x

    @app.workflow()
    async def waits() -> object:
        return await tether.wait_for_event("go")

    @app.workflow()
    async def parent() -> object:
        await tether.start_child(steps, 2, id="kid")  # its end lands in this run's mailbox
        await (await tether.start_child(steps, 1, id="kid-joined"))
        return await tether.wait_for_event("go")

    @app.workflow()
    async def leaves_child() -> str:
        await tether.start_child(waits, id="orphan")
        return "done"

    @app.workflow()
    async def asks() -> bool:
        decision = await tether.approval("Ship it?", reviewers=["alice"])
        return decision.approved

    return Flows(app, clock, steps, waits, parent, leaves_child, asks)


async def finish(f: Flows, n: int, run_id: str) -> None:
    assert await (await f.app.start(f.steps, n, id=run_id)).result(timeout=10) == n


async def until(check: Callable[[], object], what: str) -> None:
    async with asyncio.timeout(10):
        while not await check():  # type: ignore[misc]
            await asyncio.sleep(0.01)


async def gone(f: Flows, run_id: str) -> bool:
    store = f.app.engine.store
    return (
        await store.get_run(run_id) is None
        and await store.load_history(run_id) == []
        and await store.read_stream(run_id, "out", 0, 10) == []
    )


async def test_gc_deletes_runs_that_ended_long_ago_with_their_rows_and_keeps_the_rest(
    url: str,
) -> None:
    f = build(url)
    async with f.app:
        await finish(f, 3, "old")
        event_run = await f.app.start(f.waits, id="old-event")
        await f.app.send("old-event", "go", 1)
        assert await event_run.result(timeout=10) == 1
        await f.app.start(f.waits, id="unfinished")
        f.clock.advance(31 * DAY)
        await finish(f, 2, "young")
        store = f.app.engine.store
        recorded = len(await store.load_history("old")) + len(await store.load_history("old-event"))
        report = await f.app.gc()
        assert await gone(f, "old")
        assert await gone(f, "old-event")
        assert report.deleted["tether_runs"] == 2
        assert report.deleted["tether_checkpoints"] == recorded
        assert report.deleted["tether_stream_entries"] == 1
        assert report.deleted["tether_events"] == 1  # the event old-event took
        young = await store.load_history("young")
        assert [c.name for c in young][:2] == ["work", "work#2"]
        assert (await store.get_run("unfinished")) is not None
        await f.app.send("unfinished", "go", "late")  # still alive, and still finishes
        assert await (await f.app.get("unfinished")).result(timeout=10) == "late"
        assert (await f.app.gc()).total == 0  # nothing more is old


async def test_a_dry_run_counts_exactly_what_gc_then_deletes(url: str) -> None:
    f = build(url)
    async with f.app:
        for i in range(7):
            await finish(f, i % 3 + 1, f"r{i}")
        f.clock.advance(31 * DAY)
        before = await f.app.engine.store.stats(0.0)
        dry = await f.app.gc(retention=Retention(batch=5), dry_run=True)
        assert (await f.app.engine.store.stats(0.0)) == before  # nothing deleted
        done = await f.app.gc(retention=Retention(batch=5))
    assert dry.dry_run
    assert not done.dry_run
    assert dict(dry.deleted) == dict(done.deleted)
    assert done.deleted["tether_runs"] == 7
    assert done.batches > 3  # five rows a batch


async def test_a_child_stays_while_its_parent_is_unfinished_and_goes_after(url: str) -> None:
    f = build(url)
    async with f.app:
        parent = await f.app.start(f.parent, id="parent")
        await until(lambda: child_done(f, "kid-joined"), "the joined child ended")
        await until(lambda: child_done(f, "kid"), "the other child ended")
        f.clock.advance(31 * DAY)
        report = await f.app.gc()
        assert "tether_runs" not in report.deleted  # both children kept: parent unfinished
        await f.app.send("parent", "go", "now")
        assert await parent.result(timeout=10) == "now"
        await f.app.gc()  # the parent ended just now; its children ended long ago
        assert await gone(f, "kid")
        assert await gone(f, "kid-joined")
        assert await f.app.engine.store.get_run("parent") is not None


async def child_done(f: Flows, run_id: str) -> bool:
    run = await f.app.engine.store.get_run(run_id)
    return run is not None and run.status is RunStatus.SUCCEEDED


async def test_a_parent_that_ended_stays_while_a_child_it_left_is_unfinished(url: str) -> None:
    f = build(url)
    async with f.app:
        assert await (await f.app.start(f.leaves_child, id="left")).result(timeout=10) == "done"
        f.clock.advance(31 * DAY)
        await f.app.gc()
        assert await f.app.engine.store.get_run("left") is not None
        await f.app.send("orphan", "go", 1)
        await (await f.app.get("orphan")).result(timeout=10)
        f.clock.advance(31 * DAY)
        report = await f.app.gc()
    assert report.deleted["tether_runs"] == 2


async def test_an_approval_and_its_audit_outlive_their_run_until_the_audit_period(
    url: str,
) -> None:
    f = build(url)
    async with f.app:
        handle = await f.app.start(f.asks, id="asked")
        await until(f.app.list_approvals, "the approval is asked")
        (pending,) = await f.app.list_approvals()
        await f.app.decide(pending.id, "approve", reviewer="alice",
                           operation_digest=pending.operation_digest)  # fmt: skip
        assert await handle.result(timeout=10) is True
        trail = await f.app.approval_history(pending.id)
        f.clock.advance(31 * DAY)
        report = await f.app.gc()
        assert report.deleted["tether_runs"] == 1
        assert await gone(f, "asked")
        assert "tether_approvals" not in report.deleted
        assert await f.app.approval_history(pending.id) == trail  # kept whole
        assert await f.app.verify_approvals(pending.id) == {pending.id: []}  # chain intact
        f.clock.advance(300 * DAY)  # 331 days: still inside the 365 of the audit
        assert (await f.app.gc()).total == 0
        f.clock.advance(40 * DAY)
        report = await f.app.gc()
        assert report.deleted == {"tether_approvals": 1, "tether_approval_audit": len(trail)}
        assert await f.app.engine.store.get_approval(pending.id) is None
        assert await f.app.engine.store.approval_audit(pending.id) == []


async def test_streams_kept_shorter_than_runs_go_first_and_the_run_stays(url: str) -> None:
    f = build(url)
    policy = Retention(runs=30 * DAY, streams=7 * DAY)
    async with f.app:
        await finish(f, 2, "talky")
        f.clock.advance(8 * DAY)
        await finish(f, 2, "recent")
        report = await f.app.gc(retention=policy)
        store = f.app.engine.store
        assert report.deleted["tether_stream_entries"] == 1
        assert "tether_runs" not in report.deleted
        assert "tether_checkpoints" not in report.deleted
        assert await store.read_stream("talky", "out", 0, 10) == []
        assert len(await store.load_history("talky")) == 3  # two steps and the write
        assert len(await store.read_stream("recent", "out", 0, 10)) == 1
        f.clock.advance(31 * DAY)
        report = await f.app.gc(retention=policy)
        assert report.deleted["tether_runs"] == 2
        assert report.deleted["tether_stream_entries"] == 1  # recent's, with its run


async def test_the_worker_service_deletes_in_the_background(url: str) -> None:
    f = build(url, retention=Retention(runs=DAY, interval=timedelta(milliseconds=20)))
    assert set(f.app.engine.services) >= {"tether-retention", "tether-wal"}
    async with f.app:
        await finish(f, 2, "soon-gone")
        await f.app.start(f.waits, id="stays")
        f.clock.advance(2 * DAY)
        await until(lambda: gone(f, "soon-gone"), "the service deleted the run")
        assert await f.app.engine.store.get_run("stays") is not None


def test_without_retention_no_deleting_service_is_registered() -> None:
    app = tether.App("memory://")
    assert "tether-retention" not in app.engine.services
    assert "tether-wal" in app.engine.services  # the WAL is looked after all the same
    assert app.retention is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"runs": 30 * DAY, "audit": 7 * DAY}, "audit trail is kept longest"),
        ({"runs": 7 * DAY, "streams": 30 * DAY}, "give streams <= runs"),
        ({"runs": timedelta(0)}, "positive timedelta"),
        ({"interval": -DAY}, "positive timedelta"),
        ({"audit": 365}, "positive timedelta"),
        ({"batch": 0}, "int >= 1"),
    ],
)
def test_a_retention_that_makes_no_sense_is_refused_with_what_to_do(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(tether.ConfigurationError, match=message):
        Retention(**options)  # type: ignore[arg-type]


def test_app_refuses_a_retention_that_is_not_one() -> None:
    with pytest.raises(tether.ConfigurationError, match=r"takes a tether\.Retention"):
        tether.App("memory://", retention=timedelta(days=3))  # type: ignore[arg-type]


async def test_gc_refuses_a_naive_now() -> None:
    app = tether.App("memory://")
    with pytest.raises(tether.ConfigurationError, match="timezone-aware"):
        await app.gc(now=datetime(2030, 1, 1))
    report = await app.gc(now=datetime(2030, 1, 1, tzinfo=UTC), dry_run=True)
    assert report.runs_before == datetime(2030, 1, 1, tzinfo=UTC) - 30 * DAY


# -- the store: big runs go over several transactions -------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_run_with_more_rows_than_a_batch_goes_over_several_its_row_last(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = (
        f"sqlite:///{tmp_path}/big.db"
        if backend == "sqlite"
        else with_schema(request.getfixturevalue("postgres_url"), f"t_{uuid.uuid4().hex[:12]}")
    )
    store = tether.App(url).engine.store
    await store.open()
    try:
        await store.create_run(NewRun("big", "wf", "{}"), 1.0, owner="w", lease_until=99.0)
        await store.create_run(NewRun("next", "wf", "{}"), 1.0, owner="w", lease_until=99.0)
        for seq in range(25):
            done = Checkpoint(seq, f"s#{seq}", "step", CheckpointStatus.COMPLETED, "1")
            await store.write_checkpoint(Lease("big", "w", 1), done, 2.0)
        await store.finish_run(Lease("big", "w", 1), RunStatus.SUCCEEDED, "1", None, 3.0)
        await store.finish_run(Lease("next", "w", 1), RunStatus.SUCCEEDED, "1", None, 4.0)
        first = await store.purge_runs(10.0, 10)
        assert dict(first.rows) == {"tether_checkpoints": 10}
        assert first.after == START  # the same run again next time
        assert len(await store.load_history("big")) == 15
        assert await store.get_run("big") is not None
        second = await store.purge_runs(10.0, 10, first.after)
        assert dict(second.rows) == {"tether_checkpoints": 10}
        third = await store.purge_runs(10.0, 10, second.after)
        assert dict(third.rows) == {"tether_checkpoints": 5, "tether_runs": 2}
        assert third.after is not None  # it looked at as many runs as it could: maybe more
        last = await store.purge_runs(10.0, 10, third.after)
        assert dict(last.rows) == {}
        assert last.after is None
        assert await store.get_run("big") is None
        assert await store.get_run("next") is None
    finally:
        await store.close()


# -- SQLite: the file shrinks, the WAL stays bounded --------------------------------------


async def fill(f: Flows, runs: int, size: int) -> None:
    @f.app.step()
    async def blob(i: int) -> str:
        return "x" * size

    @f.app.workflow()
    async def heavy(n: int) -> int:
        for i in range(n):
            await blob(i)
        return n

    handles = [await f.app.start(heavy, 5, id=f"heavy-{i}") for i in range(runs)]
    for handle in handles:
        await handle.result(timeout=30)


def sizes(path: Path) -> tuple[int, int]:
    wal = Path(f"{path}-wal")
    return path.stat().st_size, wal.stat().st_size if wal.exists() else 0


async def test_the_sqlite_file_shrinks_after_gc(tmp_path: Path) -> None:
    path = tmp_path / "shrink.db"
    f = build(f"sqlite:///{path}")
    async with f.app:
        await fill(f, 60, 8000)  # 300 steps of 8 kB
        await f.app.engine.store.checkpoint_wal()
        before = sizes(path)[0]
        assert before > 2_400_000
        f.clock.advance(31 * DAY)
        report = await f.app.gc()
        after = sizes(path)[0]
        status = await f.app.storage_status()
    assert report.deleted["tether_checkpoints"] == 300
    assert report.bytes_freed is not None
    assert report.bytes_freed > 2_000_000
    assert after < before / 4, (before, after)
    assert status.sizes.auto_vacuum == "incremental"
    rows = {t.name: t.rows for t in status.sizes.tables}
    assert rows["tether_checkpoints"] == 0
    assert rows["tether_runs"] == 0


async def test_gc_vacuum_shrinks_a_database_made_without_auto_vacuum(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # WAL written first: auto_vacuum can no longer be set
        conn.execute("PRAGMA journal_mode=WAL")
    f = build(f"sqlite:///{path}")
    async with f.app:
        assert (await f.app.storage_status()).sizes.auto_vacuum == "none"
        await fill(f, 40, 8000)
        await f.app.engine.store.checkpoint_wal()
        before = sizes(path)[0]
        f.clock.advance(31 * DAY)
        plain = await f.app.gc()
        assert plain.bytes_freed == 0
        assert sizes(path)[0] == before
        assert (await f.app.storage_status()).sizes.free_bytes > 1_000_000  # type: ignore[operator]
        vacuumed = await f.app.gc(vacuum=True)
        status = await f.app.storage_status()
    assert vacuumed.vacuumed
    assert vacuumed.bytes_freed is not None
    assert vacuumed.bytes_freed > 1_000_000
    assert sizes(path)[0] < before / 4
    assert status.sizes.auto_vacuum == "incremental"  # shrinks by itself from now on


async def test_the_wal_grows_under_a_long_reader_and_is_cut_back_once_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention_module, "WAL_INTERVAL", 0.02)
    path = tmp_path / "wal.db"
    f = build(f"sqlite:///{path}")
    async with f.app:
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM tether_runs").fetchone()  # holds its snapshot
        await fill(f, 40, 100_000)  # 20 MB of checkpoints
        await asyncio.sleep(0.1)  # the WAL service had its go: it cannot cut the log back
        grown = sizes(path)[1]
        assert grown > JOURNAL_SIZE_LIMIT, grown
        state = await f.app.engine.store.checkpoint_wal()
        assert state is not None
        assert state.copied < state.frames
        reader.execute("COMMIT")
        reader.close()

        async def cut_back() -> bool:
            return sizes(path)[1] <= JOURNAL_SIZE_LIMIT

        await until(cut_back, "the WAL service truncated the log")
    assert sizes(path)[1] == 0


async def test_tethers_own_connections_hold_no_read_transaction_open(tmp_path: Path) -> None:
    """With runs done, a waiting run, and a reader following its live stream, an outside
    TRUNCATE checkpoint (which needs every reader off the log) still succeeds."""
    path = tmp_path / "readers.db"
    f = build(f"sqlite:///{path}")
    async with f.app:
        await fill(f, 10, 50_000)
        await finish(f, 2, "streamed")
        await f.app.start(f.waits, id="waiting")
        follower = asyncio.create_task(drain(f.app.read_stream("waiting", "out")))
        await asyncio.sleep(0.05)
        outside = sqlite3.connect(path, isolation_level=None, timeout=5)
        busy, frames, copied = outside.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        outside.close()
        assert (busy, frames, copied) == (0, 0, 0)
        assert sizes(path)[1] == 0
        follower.cancel()
        await f.app.send("waiting", "go", 1)


async def drain(entries: object) -> None:
    async for _ in entries:  # type: ignore[attr-defined]
        pass


async def test_storage_status_reports_sizes_runs_by_status_and_the_retention(url: str) -> None:
    policy = Retention(runs=10 * DAY, audit=100 * DAY)
    f = build(url, retention=policy)
    async with f.app:
        await finish(f, 3, "done")
        await f.app.start(f.waits, id="open")
        status = await f.app.storage_status()
        # The file's size at the same moment: closing checkpoints the WAL into it.
        size = os.path.getsize(url.removeprefix("sqlite:///")) if url.startswith("sqlite") else 0
    tables = {t.name: t for t in status.sizes.tables}
    assert tables["tether_checkpoints"].rows == 4  # three steps and the stream write
    assert tables["tether_runs"].rows == 2
    assert status.runs["succeeded"] == 1
    assert status.retention is policy
    doc = status.to_json()
    assert doc["backend"] == url.split(":", maxsplit=1)[0].replace("postgresql", "postgres")
    if url.startswith("sqlite"):
        assert status.sizes.database_bytes == size
        assert status.sizes.wal_bytes is not None
        assert tables["tether_checkpoints"].bytes
    if url.startswith("postgres"):
        assert status.sizes.database_bytes
        assert tables["tether_runs"].bytes


# -- other parts' rows: outbox messages, values, fork links ---------------------------------


class Gated(tether.Sender):
    """Accepts a message once the test opens the gate; until then the send hangs."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def send(self, message: tether.OutboxMessage) -> None:
        await self.gate.wait()


async def test_an_undelivered_outbox_message_keeps_its_run_until_it_is_delivered(
    url: str,
) -> None:
    gated = Gated()
    f = build(url, senders={"gated": gated})

    @f.app.workflow()
    async def notify() -> str:
        await tether.outbox("gated", {"hello": 1})
        return "sent"

    async with f.app:
        assert await (await f.app.start(notify, id="notifier")).result(timeout=10) == "sent"
        f.clock.advance(31 * DAY)
        report = await f.app.gc()
        assert "tether_runs" not in report.deleted
        assert "tether_outbox" not in report.deleted
        (message,) = await f.app.list_outbox(run_id="notifier")
        assert message.status != "delivered"
        gated.gate.set()

        async def delivered() -> bool:
            return [m.status for m in await f.app.list_outbox(run_id="notifier")] == ["delivered"]

        await until(delivered, "the message was delivered")
        report = await f.app.gc()
        assert report.deleted["tether_runs"] == 1
        assert report.deleted["tether_outbox"] == 1
        assert await f.app.list_outbox(run_id="notifier") == []


async def test_values_go_with_their_run_and_a_forks_link_outlives_its_source(url: str) -> None:
    f = build(url)

    @f.app.workflow()
    async def publishes(n: int) -> int:
        for i in range(n):
            await tether.set_value("progress", i)
        return n

    async with f.app:
        assert await (await f.app.start(publishes, 3, id="source")).result(timeout=10) == 3
        f.clock.advance(31 * DAY)
        fork = await f.app.fork("source", "value:progress#3", id="forked")
        assert await fork.result(timeout=10) == 3
        report = await f.app.gc()
        assert report.deleted["tether_runs"] == 1
        assert report.deleted["tether_values"] == 3
        assert await gone(f, "source")
        assert await f.app.get_value("forked", "progress") == 2  # the fork's own copy
        link = await f.app.engine.store.get_fork("forked")
        assert link is not None
        assert link.source_run_id == "source"
        f.clock.advance(31 * DAY)
        report = await f.app.gc()
        assert report.deleted["tether_runs"] == 1
        assert report.deleted["tether_forks"] == 1
        assert await f.app.engine.store.get_fork("forked") is None

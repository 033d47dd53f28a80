"""The Store contract for retention and upkeep, run once per backend (see conftest).

purge_runs deletes runs that ended before a time with every row of theirs, a bounded number of
rows per call, keeping families with an unfinished member and runs with unsent messages;
purge_streams deletes stream entries of ended runs; purge_approvals deletes decided approvals
whose run is gone; dry runs count and delete nothing; cursors page until None. compact,
vacuum, checkpoint_wal and storage_sizes look after the database and report on it. Same rules
as test_store_contract: plain float times, nothing sleeps, exact answers.
"""

from __future__ import annotations

import json

from tests.contract.test_approval_contract import approval, decide
from tests.contract.test_store_contract import NOW, WF, get

from tether.store.memory import MemoryStore
from tether.store.port import (
    Checkpoint,
    CheckpointStatus,
    Lease,
    NewRun,
    RunStatus,
    Store,
    WorkerInfo,
)
from tether.store.port.maintenance import WalState
from tether.store.port.outbox import (
    NewOutboxMessage,
    OutboxSettlement,
    OutboxStatus,
    TransactionOutcome,
)
from tether.store.port.retention import START, Purge
from tether.store.port.schedules import ScheduleSpec
from tether.store.port.streams import StreamAppend, StreamKind
from tether.store.port.users import UserRecord
from tether.store.port.values import ForkRecord
from tether.store.postgres import PostgresStore

FOREVER = NOW + 1e9  # leases that no claim takes over during a test
# The tables every backend keeps the port's rows in.
TABLES = {
    "tether_runs", "tether_checkpoints", "tether_events", "tether_workers", "tether_approvals",
    "tether_approval_audit", "tether_users", "tether_stream_entries", "tether_outbox",
    "tether_schedules", "tether_values", "tether_forks",
}  # fmt: skip


def backend(store: Store) -> str:
    """The store's kind as storage_sizes names it (a MemoryStore is a private SQLite file,
    named by its URL's kind)."""
    if isinstance(store, MemoryStore):
        return "memory"
    return "postgres" if isinstance(store, PostgresStore) else "sqlite"


def stream_rows(store: Store, entries: int, streams: int) -> dict[str, int]:
    """The rows of `entries` stream entries in `streams` streams: PostgreSQL also keeps a
    counter row per stream (tether_streams)."""
    rows = {"tether_stream_entries": entries}
    return rows | {"tether_streams": streams} if isinstance(store, PostgresStore) else rows


def done(seq: int, name: str | None = None, kind: str = "step") -> Checkpoint:
    return Checkpoint(
        seq=seq,
        name=name or f"s{seq}",
        kind=kind,
        status=CheckpointStatus.COMPLETED,
        result='"ok"',
        attempts=1,
        started_at=NOW,
        finished_at=NOW,
    )


async def running(
    store: Store, run_id: str, *, parent_id: str | None = None, steps: int = 0, events: int = 0,
    values: int = 0, chunks: int = 0,
) -> Lease:  # fmt: skip
    """A run held by w1 with `steps` checkpoints, `events` events in its mailbox, `values`
    values (each with its checkpoint) and `chunks` entries of its stream "out"."""
    await store.create_run(NewRun(run_id, WF, "[]", parent_id=parent_id), NOW, owner="w1",
                           lease_until=FOREVER)  # fmt: skip
    lease = Lease(run_id, "w1", 1)
    for seq in range(steps):
        await store.write_checkpoint(lease, done(seq), NOW)
    for i in range(events):
        await store.deliver_event(run_id, "e", json.dumps(i), NOW)
    for i in range(values):
        await store.set_value(lease, "k", json.dumps(i), done(steps + i, kind="value"), NOW)
    if chunks:
        chunk = StreamAppend(StreamKind.CHUNK, '"c"', "s0", 1)
        await store.append_stream(lease, "out", [chunk] * chunks, NOW)
    return lease


async def ended(
    store: Store,
    run_id: str,
    at: float,
    status: RunStatus = RunStatus.SUCCEEDED,
    parent_id: str | None = None,
    **rows: int,
) -> Lease:
    """A run with those rows (see `running`) that ended with `status` at `at`."""
    lease = await running(store, run_id, parent_id=parent_id, **rows)
    if status is RunStatus.DEAD:
        await store.fail_execution(lease, '{"type": "X"}', 3, None, at)
    else:
        error = None if status is RunStatus.SUCCEEDED else '{"type": "X"}'
        await store.finish_run(lease, status, '"done"' if error is None else None, error, at)
    return lease


async def record_messages(store: Store, lease: Lease, ids: list[str], seq: int) -> None:
    messages = tuple(NewOutboxMessage(i, "https://example.invalid", i, "{}") for i in ids)
    tx = done(seq, f"tx{seq}", "transaction")
    await store.run_transaction(lease, lambda conn: TransactionOutcome("1", messages), tx, NOW)


async def gone(store: Store, run_id: str) -> bool:
    return (
        await store.get_run(run_id) is None
        and await store.load_history(run_id) == []
        and await store.list_values(run_id) == []
        and await store.read_stream(run_id, "out", 0, 100) == []
        and await store.get_fork(run_id) is None
        and await store.list_outbox(run_id=run_id) == []
    )


async def purge_all(
    store: Store, before: float, limit: int, *, dry_run: bool = False
) -> list[Purge]:
    """purge_runs from the start, each call after the cursor of the one before, until None."""
    calls, after = [], START
    for _ in range(50):
        purge = await store.purge_runs(before, limit, after, dry_run=dry_run)
        calls.append(purge)
        if purge.after is None:
            return calls
        after = purge.after
    raise AssertionError(f"purge_runs did not end its paging: {calls}")


def totals(calls: list[Purge]) -> dict[str, int]:
    summed: dict[str, int] = {}
    for purge in calls:
        for table, count in purge.rows.items():
            summed[table] = summed.get(table, 0) + count
    return summed


# -- purge_runs --------------------------------------------------------------------------------


async def test_purge_runs_deletes_the_runs_that_ended_before_the_time_with_all_their_rows(
    store: Store,
) -> None:
    await ended(store, "ok", NOW + 10, steps=2, events=1, values=1, chunks=3)
    await ended(store, "failed", NOW + 20, RunStatus.FAILED, steps=1)
    await ended(store, "dead", NOW + 30, RunStatus.DEAD)
    await ended(store, "cancelled", NOW + 40, RunStatus.CANCELLED, events=2)
    await ended(store, "edge", NOW + 50, steps=1)  # ended at `before`: not before it
    await ended(store, "young", NOW + 60, steps=1)
    await running(store, "live", steps=1, chunks=1)
    kept = {i: await get(store, i) for i in ("edge", "young", "live")}
    purge = await store.purge_runs(NOW + 50, 1000)
    assert purge == Purge(
        {"tether_checkpoints": 4, "tether_events": 3, "tether_values": 1, "tether_runs": 4}
        | stream_rows(store, 3, 1),
        None,
    )
    for run_id in ("ok", "failed", "dead", "cancelled"):
        assert await gone(store, run_id), run_id
    for run_id, run in kept.items():
        assert await store.get_run(run_id) == run
        assert len(await store.load_history(run_id)) == 1
    assert len(await store.read_stream("live", "out", 0, 100)) == 1
    assert await store.purge_runs(NOW + 50, 1000) == Purge({}, None)


async def test_purge_runs_keeps_a_family_while_one_of_it_is_unfinished(store: Store) -> None:
    parent = await running(store, "parent")
    await ended(store, "kid", NOW + 10, parent_id="parent")  # its end lands in the mailbox
    await ended(store, "elder", NOW + 10)
    orphan = await running(store, "orphan", parent_id="elder")
    assert await store.purge_runs(NOW + 50, 1000) == Purge({}, None)
    assert sorted(r.id for r in await store.list_runs()) == ["elder", "kid", "orphan", "parent"]
    await store.finish_run(orphan, RunStatus.SUCCEEDED, "1", None, NOW + 20)  # tells elder
    assert await store.purge_runs(NOW + 50, 1000) == Purge(
        {"tether_events": 1, "tether_runs": 2}, None
    )
    assert await gone(store, "elder")
    assert await gone(store, "orphan")
    await store.finish_run(parent, RunStatus.SUCCEEDED, "1", None, NOW + 30)
    assert await store.purge_runs(NOW + 50, 1000) == Purge(
        {"tether_events": 1, "tether_runs": 2}, None
    )
    assert await store.list_runs() == []


async def test_purge_runs_keeps_a_run_with_a_message_not_yet_delivered_or_failed(
    store: Store,
) -> None:
    await store.register_worker(WorkerInfo("w1", "host", 1, "token"), NOW)
    sent = await running(store, "sent")
    await record_messages(store, sent, ["d", "f"], 0)
    unsent = await running(store, "unsent")
    await record_messages(store, unsent, ["u"], 0)
    claimed = {m.id: m for m in await store.claim_outbox("w1", NOW, NOW + 60, 10)}
    delivered = OutboxSettlement(OutboxStatus.DELIVERED)
    await store.settle_outbox("d", claimed["d"].claim, delivered, NOW + 1)
    await store.settle_outbox("f", claimed["f"].claim, OutboxSettlement(OutboxStatus.FAILED),
                              NOW + 1)  # fmt: skip
    for lease in (sent, unsent):
        await store.finish_run(lease, RunStatus.SUCCEEDED, "1", None, NOW + 2)
    assert await store.purge_runs(NOW + 50, 1000) == Purge(
        {"tether_checkpoints": 1, "tether_outbox": 2, "tether_runs": 1}, None
    )
    assert await gone(store, "sent")
    assert [m.id for m in await store.list_outbox(run_id="unsent")] == ["u"]  # still sending
    assert len(await store.load_history("unsent")) == 1
    await store.settle_outbox("u", claimed["u"].claim, delivered, NOW + 3)
    assert await store.purge_runs(NOW + 50, 1000) == Purge(
        {"tether_checkpoints": 1, "tether_outbox": 1, "tether_runs": 1}, None
    )
    assert await gone(store, "unsent")


async def test_purge_runs_deletes_a_forks_link_but_not_the_links_naming_it_as_source(
    store: Store,
) -> None:
    await ended(store, "src", NOW + 10, steps=1)
    link = ForkRecord("fork", "src", "s0", 0, NOW + 11)
    await store.fork_run(NewRun("fork", WF, "[]"), link, [], [], NOW + 11)
    assert await store.purge_runs(NOW + 50, 1000) == Purge(
        {"tether_checkpoints": 1, "tether_runs": 1}, None
    )
    assert await store.get_fork("fork") == link  # the source is gone, the link stays
    (claimed,) = await store.claim_runs("w1", [WF], NOW + 12, FOREVER, 1)
    await store.finish_run(Lease("fork", "w1", claimed.epoch), RunStatus.SUCCEEDED, "1", None,
                           NOW + 13)  # fmt: skip
    assert await store.purge_runs(NOW + 50, 1000) == Purge(
        {"tether_forks": 1, "tether_runs": 1}, None
    )
    assert await gone(store, "fork")


async def test_a_dry_run_deletes_nothing_and_counts_whole_runs(store: Store) -> None:
    await ended(store, "big", NOW + 10, steps=5, events=1)
    await ended(store, "small", NOW + 20, steps=1)
    history = await store.load_history("big")
    dry = await purge_all(store, NOW + 50, 3, dry_run=True)
    assert dry[0].rows == {"tether_checkpoints": 5, "tether_events": 1, "tether_runs": 1}
    assert totals(dry) == {"tether_checkpoints": 6, "tether_events": 1, "tether_runs": 2}
    assert await store.load_history("big") == history  # nothing deleted
    assert len(await store.list_runs()) == 2
    assert totals(await purge_all(store, NOW + 50, 3)) == totals(dry)
    assert await gone(store, "big")
    assert await gone(store, "small")


async def test_a_run_with_more_rows_than_the_limit_goes_over_several_calls_its_row_last(
    store: Store,
) -> None:
    await ended(store, "big", NOW + 10, steps=10)
    calls = await purge_all(store, NOW + 50, 4)
    with_rows = [c for c in calls if c.rows]
    assert len(with_rows) >= 3  # 11 rows, at most about 4 a call
    assert [c.rows.get("tether_runs", 0) for c in with_rows] == [0] * (len(with_rows) - 1) + [1]
    assert totals(calls) == {"tether_checkpoints": 10, "tether_runs": 1}
    assert await gone(store, "big")


async def test_purge_runs_pages_with_its_cursor_until_none(store: Store) -> None:
    for i in range(1, 7):
        await ended(store, f"r{i}", NOW + i, steps=1)
    calls = await purge_all(store, NOW + 50, 4)
    assert len([c for c in calls if c.rows]) >= 3  # 12 rows, two whole runs fit in a call
    assert all(c.total <= 4 for c in calls)
    cursors = [c.after for c in calls[:-1]]
    assert cursors == sorted(cursors)  # type: ignore[type-var]
    assert len(set(cursors)) == len(cursors)  # the cursor moves on at every call
    assert totals(calls) == {"tether_checkpoints": 6, "tether_runs": 6}
    assert await store.list_runs() == []


async def test_purge_runs_starts_after_its_cursor(store: Store) -> None:
    for i in range(1, 5):
        await ended(store, f"r{i}", NOW + i, steps=1)
    purge = await store.purge_runs(NOW + 50, 1000, (NOW + 2, "r2"))
    assert purge == Purge({"tether_checkpoints": 2, "tether_runs": 2}, None)
    assert [r.id for r in await store.list_runs()] == ["r2", "r1"]


# -- purge_streams -----------------------------------------------------------------------------


async def test_purge_streams_deletes_the_stream_entries_of_runs_that_ended_only(
    store: Store,
) -> None:
    await ended(store, "old", NOW + 10, steps=1, chunks=3)
    await ended(store, "old-no-stream", NOW + 15, steps=1)
    other = await running(store, "old2", chunks=1)
    await store.append_stream(other, "b", [StreamAppend(StreamKind.CHUNK, "1", "s0", 1)], NOW)
    await store.finish_run(other, RunStatus.FAILED, None, '{"type": "X"}', NOW + 20)
    await ended(store, "young", NOW + 60, chunks=1)
    await running(store, "live", chunks=2)
    runs = await store.list_runs()
    dry = await store.purge_streams(NOW + 50, 1000, dry_run=True)
    assert dry == Purge(stream_rows(store, 5, 3), None)
    assert len(await store.read_stream("old", "out", 0, 100)) == 3  # nothing deleted
    assert await store.purge_streams(NOW + 50, 1000) == dry
    assert await store.read_stream("old", "out", 0, 100) == []
    assert await store.read_stream("old2", "out", 0, 100) == []
    assert await store.read_stream("old2", "b", 0, 100) == []
    assert await store.list_runs() == runs  # the runs themselves stay
    assert len(await store.load_history("old")) == 1
    assert len(await store.read_stream("young", "out", 0, 100)) == 1
    assert len(await store.read_stream("live", "out", 0, 100)) == 2
    assert await store.purge_streams(NOW + 50, 1000) == Purge({}, None)


async def test_purge_streams_pages_with_its_cursor_until_none(store: Store) -> None:
    for i in range(1, 6):
        await ended(store, f"r{i}", NOW + i, chunks=2)
    calls, after = [], START
    for _ in range(50):
        purge = await store.purge_streams(NOW + 50, 3, after)
        calls.append(purge)
        if purge.after is None:
            break
        after = purge.after
    assert calls[-1].after is None
    assert len([c for c in calls if c.rows]) >= 3  # 10 entries, about 3 a call
    assert totals(calls) == stream_rows(store, 10, 5)
    for i in range(1, 6):
        assert await store.read_stream(f"r{i}", "out", 0, 100) == []
        assert (await get(store, f"r{i}")).status is RunStatus.SUCCEEDED


# -- purge_approvals ---------------------------------------------------------------------------


async def test_purge_approvals_deletes_only_decided_approvals_whose_run_is_gone(
    store: Store,
) -> None:
    for run_id, ends_at in (("gone", NOW + 10), ("late", NOW + 40)):
        lease = await running(store, run_id)
        await store.create_approval(lease, approval(f"a-{run_id}", run_id), NOW)
        await store.finish_run(lease, RunStatus.SUCCEEDED, "1", None, ends_at)  # cancels it
    kept = await running(store, "kept")
    await store.create_approval(kept, approval("a-kept", "kept"), NOW)
    await store.change_approval("a-kept", decide(), NOW + 5)  # decided, its run still there
    await running(store, "asking")
    await store.create_approval(Lease("asking", "w1", 1), approval("a-pending", "asking"), NOW)
    assert (await store.purge_runs(NOW + 50, 1000)).rows["tether_runs"] == 2  # gone, late
    audit = await store.approval_audit("a-gone")
    assert len(audit) == 2  # created, cancelled
    before = {a.id: a for a in await store.list_approvals()}
    dry = await store.purge_approvals(NOW + 30, 1000, dry_run=True)
    assert dry == Purge({"tether_approval_audit": 2, "tether_approvals": 1}, None)
    assert await store.approval_audit("a-gone") == audit  # nothing deleted
    assert await store.purge_approvals(NOW + 30, 1000) == dry
    assert await store.get_approval("a-gone") is None
    assert await store.approval_audit("a-gone") == []
    assert {a.id: a for a in await store.list_approvals()} == {
        i: before[i] for i in ("a-late", "a-kept", "a-pending")
    }
    # a-late was last changed at NOW + 40: it goes with a later time.
    assert await store.purge_approvals(NOW + 41, 1000) == dry
    assert sorted(a.id for a in await store.list_approvals()) == ["a-kept", "a-pending"]


async def test_purge_approvals_pages_with_its_cursor_until_none(store: Store) -> None:
    for i in range(4):
        lease = await running(store, f"r{i}")
        await store.create_approval(lease, approval(f"a{i}", f"r{i}"), NOW)
        await store.finish_run(lease, RunStatus.SUCCEEDED, "1", None, NOW + 1 + i)
    await store.purge_runs(NOW + 50, 1000)
    calls, after = [], START
    for _ in range(50):
        purge = await store.purge_approvals(NOW + 50, 3, after)
        calls.append(purge)
        if purge.after is None:
            break
        after = purge.after
    assert calls[-1].after is None
    assert len([c for c in calls if c.rows]) >= 2  # 12 rows, about 3 a call
    assert totals(calls) == {"tether_approval_audit": 8, "tether_approvals": 4}
    assert await store.list_approvals() == []


# -- compact, vacuum, checkpoint_wal, storage_sizes --------------------------------------------


async def freed(store: Store) -> None:
    """Free space inside the database: a run of big checkpoints written, then purged; run
    "kept" stays."""
    lease = await running(store, "big")
    for seq in range(40):
        await store.write_checkpoint(lease, Checkpoint(seq, f"s{seq}", "step",
                                     CheckpointStatus.COMPLETED, result=json.dumps("x" * 5000)),
                                     NOW)  # fmt: skip
    await store.finish_run(lease, RunStatus.SUCCEEDED, "1", None, NOW + 1)
    await running(store, "kept", steps=1)
    assert (await store.purge_runs(NOW + 50, 1000)).rows == {
        "tether_checkpoints": 40, "tether_runs": 1,
    }  # fmt: skip


async def test_compact_gives_back_up_to_max_pages_free_pages(store: Store) -> None:
    await freed(store)
    assert await store.compact(0) == 0
    if backend(store) == "postgres":  # left to PostgreSQL's autovacuum
        assert await store.compact(10) == 0
        assert await store.compact(10**6) == 0
        return
    free = (await store.storage_sizes()).free_bytes
    assert free is not None
    page = await store.compact(1)
    assert page > 0
    assert await store.compact(2) == 2 * page
    assert await store.compact(10**6) == free - 3 * page  # the rest
    assert await store.compact(10) == 0  # nothing left to give
    assert (await store.storage_sizes()).free_bytes == 0
    assert len(await store.load_history("kept")) == 1


async def test_vacuum_rebuilds_the_database_and_keeps_its_data(store: Store) -> None:
    await freed(store)
    kept = await get(store, "kept")
    shrank = await store.vacuum()
    assert shrank is None or isinstance(shrank, int)
    if isinstance(store, PostgresStore):
        assert isinstance(shrank, int)  # its tables' sizes are known
    else:  # SQLite: the file loses the free pages, and auto_vacuum becomes incremental
        assert shrank is not None
        assert shrank > 0
        sizes = await store.storage_sizes()
        assert (sizes.free_bytes, sizes.auto_vacuum) == (0, "incremental")
    assert await store.get_run("kept") == kept
    assert len(await store.load_history("kept")) == 1
    await running(store, "after", steps=1)  # and it takes writes again
    assert len(await store.load_history("after")) == 1


async def test_checkpoint_wal_copies_sqlites_log_and_is_none_elsewhere(store: Store) -> None:
    await running(store, "r1", steps=3)
    state = await store.checkpoint_wal()
    if backend(store) == "postgres":  # no such log to look after
        assert state is None
        return
    assert isinstance(state, WalState)
    assert not state.busy  # nobody is reading or writing
    assert state.frames == state.copied  # all of it copied
    assert state.frames > 0
    assert state.wal_bytes >= 0
    assert len(await store.load_history("r1")) == 3


async def test_storage_sizes_lists_tethers_tables_by_name_with_exact_row_counts(
    store: Store,
) -> None:
    await store.register_worker(WorkerInfo("w1", "host", 1, "token"), NOW)
    await store.put_user(UserRecord("ann", (), "h" * 64, NOW))
    await store.put_schedule(ScheduleSpec("s", WF, "@daily", "UTC", "skip"), NOW)
    await ended(store, "old", NOW + 10, steps=2, events=1, values=1, chunks=2)
    await running(store, "live", steps=1)
    sizes = await store.storage_sizes()
    assert sizes.backend == backend(store)
    names = [t.name for t in sizes.tables]
    assert names == sorted(names)
    assert set(names) >= TABLES
    assert all(n.startswith("tether_") for n in names)
    rows = {t.name: t.rows for t in sizes.tables}
    assert rows.pop("tether_migrations", 1) > 0  # the schema's versions, where kept as rows
    expected = dict.fromkeys(rows, 0) | {
        "tether_runs": 2, "tether_checkpoints": 4, "tether_events": 1, "tether_values": 1,
        "tether_workers": 1, "tether_users": 1, "tether_schedules": 1,
    } | stream_rows(store, 2, 1)  # fmt: skip
    assert rows == expected
    assert sizes.database_bytes is not None
    assert sizes.database_bytes > 0
    await store.purge_runs(NOW + 50, 1000)
    after = {t.name: t.rows for t in (await store.storage_sizes()).tables}
    after.pop("tether_migrations", None)
    assert after == expected | {
        "tether_runs": 1, "tether_checkpoints": 1, "tether_events": 0, "tether_values": 0,
    } | stream_rows(store, 0, 0)  # fmt: skip

"""The Store contract for approvals and run starters, run once per backend (see conftest).

Same rules as test_store_contract: times are plain floats chosen by each test, nothing sleeps,
and every backend must give the answers the memory store gives. Some times are not integers on
purpose: the audit hash covers them, so a backend that rounds a time breaks the chain.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from dataclasses import replace

import psycopg
import pytest
from tests.contract.test_store_contract import (
    LEASE,
    NOW,
    WF,
    claim_one,
    get,
    lease_of,
    new,
    wait_checkpoint,
)

from tether.errors import ApprovalNotFound, LeaseLost
from tether.store.audit import audit_hash, created_note, fixed_digest, verify_chain, verify_record
from tether.store.keys import approval_key
from tether.store.port import Checkpoint, CheckpointStatus, Lease, NewRun, RunStatus, Store
from tether.store.port.approvals import (
    APPROVED,
    CANCELLED,
    GENESIS,
    PENDING,
    ApprovalChange,
    ApprovalRecord,
    AuditEntry,
    ChangeFn,
    Eligible,
    Note,
)
from tether.store.postgres import PostgresStore, parse_postgres_url
from tether.store.sqlite import SqliteStore

TITLE = "Pay invoice 42"


def approval(
    approval_id: str = "a1", run_id: str = "r1", created_at: float = NOW
) -> ApprovalRecord:
    return ApprovalRecord(
        id=approval_id,
        run_id=run_id,
        step="approve",
        title=TITLE,
        description="Pay 120 EUR to ACME",
        options='[{"id": "approve", "label": "Approve"}, {"id": "reject", "label": "Reject"}]',
        operation='{"amount": 120, "to": "ACME"}',
        operation_digest="d" * 64,
        reviewers='["alice", "group:finance"]',
        required=1,
        separate_duties=True,
        starter="bob",
        context='{"invoice": 42}',
        response_schema=None,
        created_at=created_at,
        expires_at=created_at + 3600.5,
    )


async def running(store: Store, run_id: str = "r1", now: float = NOW) -> Lease:
    """A run held by worker w1 at epoch 1."""
    await store.create_run(new(run_id), now, owner="w1", lease_until=now + LEASE)
    return Lease(run_id, "w1", 1)


async def created(store: Store, record: ApprovalRecord, now: float = NOW) -> ApprovalRecord:
    """The approval, created under its run's lease (the run must be running, held by w1)."""
    run = await get(store, record.run_id)
    stored, made = await store.create_approval(lease_of(run), record, now)
    assert made
    return stored


def decide(option: str = "approve", reviewer: str = "alice", event: str | None = None) -> ChangeFn:
    """A change that decides the approval with two audit notes, and tells the run."""
    payload = event if event is not None else json.dumps({"option": option})

    def change(record: ApprovalRecord, run_status: str | None, now: float) -> ApprovalChange:
        decision = json.dumps({"option": option, "reviewer": reviewer, "at": now})
        return ApprovalChange(
            record=replace(
                record,
                status=APPROVED if option == "approve" else option,
                decision=decision,
                votes=json.dumps([reviewer]),
            ),
            notes=(
                Note("voted", reviewer, {"option": option}),
                Note("decided", reviewer, {"option": option, "run": run_status}),
            ),
            event=payload,
        )

    return change


def expected_entry(
    approval_id: str, seq: int, at: float, event: str, actor: str | None, detail: str, prev: str
) -> AuditEntry:
    digest = audit_hash(prev, approval_id, seq, at, event, actor, detail)
    return AuditEntry(approval_id, seq, at, event, actor, detail, prev, digest)


# -- started_by ---------------------------------------------------------------------------------


async def test_started_by_round_trips_through_create_run_and_get_run(store: Store) -> None:
    run, made = await store.create_run(NewRun("r1", WF, "{}", started_by="alice"), NOW)
    assert made
    assert run.started_by == "alice"
    assert await get(store, "r1") == run
    held, _ = await store.create_run(
        NewRun("r2", WF, "{}", started_by="bob"), NOW + 1, owner="w1", lease_until=NOW + LEASE
    )
    assert held.started_by == "bob"
    assert await get(store, "r2") == held
    plain, _ = await store.create_run(new("r3"), NOW + 2)
    assert plain.started_by is None
    assert (await get(store, "r3")).started_by is None
    claimed = await claim_one(store, "w2", NOW + 3)
    assert (claimed.id, claimed.started_by) == ("r1", "alice")
    assert [(r.id, r.started_by) for r in await store.list_runs()] == [
        ("r3", None),
        ("r2", "bob"),
        ("r1", "alice"),
    ]


# -- create / get / list ------------------------------------------------------------------------


async def test_create_approval_stores_it_with_one_created_audit_entry(store: Store) -> None:
    lease = await running(store)
    at = NOW + 1.1
    stored, made = await store.create_approval(lease, approval(), at)
    assert made
    detail = json.dumps(created_note(approval()).detail, sort_keys=True)
    entry = expected_entry("a1", 1, at, "created", None, detail, GENESIS)
    # The first entry commits to the fixed fields of the row as stored.
    assert json.loads(detail)["covers"] == fixed_digest(stored)
    assert json.loads(detail)["fixed"]["reviewers"] == ["alice", "group:finance"]
    assert stored == replace(approval(), audit_count=1, audit_head=entry.hash, updated_at=at)
    assert await store.get_approval("a1") == stored
    trail = await store.approval_audit("a1")
    assert trail == [entry]
    assert verify_chain(stored, trail) == []
    assert verify_record(stored, trail) == []


async def test_database_secret_keeps_the_first_value_offered_for_a_name(store: Store) -> None:
    first = await store.database_secret("approvals.digest", "ab" * 32, NOW)
    assert first == "ab" * 32
    assert await store.database_secret("approvals.digest", "cd" * 32, NOW + 1) == "ab" * 32
    assert await store.database_secret("other", "ef" * 32, NOW + 2) == "ef" * 32


async def test_a_reviewers_list_finds_theirs_behind_thousands_asked_of_others(
    store: Store,
) -> None:
    lease = await running(store)
    others = replace(approval(), reviewers='["bob", "group:finance"]')
    for n in range(2500):
        await store.create_approval(lease, replace(others, id=f"o{n:04}"), NOW + n / 1000)
    mine = replace(approval("mine"), reviewers='["bob", "alice"]', created_at=NOW + 3)
    await store.create_approval(lease, mine, NOW + 3)
    alice = Eligible("alice", ("*", "alice", "group:sre"))
    found = await store.list_approvals(status=PENDING, limit=100, reviewer=alice)
    assert [a.id for a in found] == ["mine"]
    # The old call still answers the oldest, whoever they are asked of.
    assert len(await store.list_approvals(status=PENDING, limit=100)) == 100
    finance = Eligible("carol", ("*", "carol", "group:finance"))
    first = await store.list_approvals(limit=3, reviewer=finance)
    assert [a.id for a in first] == ["o0000", "o0001", "o0002"]
    after = replace(finance, after=(first[-1].created_at, first[-1].id))
    assert [a.id for a in await store.list_approvals(limit=2, reviewer=after)] == ["o0003", "o0004"]


async def test_a_reviewers_list_leaves_out_what_separation_of_duties_denies_them(
    store: Store,
) -> None:
    lease = await running(store)
    anyone = replace(approval(), reviewers='["*"]')
    await store.create_approval(lease, replace(anyone, id="by-bob"), NOW)  # starter bob
    await store.create_approval(lease, replace(anyone, id="unknown", starter=None), NOW + 1)
    await store.create_approval(lease, replace(anyone, id="plain", starter=None,
                                               separate_duties=False), NOW + 2)  # fmt: skip
    for name, expected in (("bob", ["plain"]), ("alice", ["by-bob", "plain"])):
        found = await store.list_approvals(reviewer=Eligible(name, ("*", name)))
        assert [a.id for a in found] == expected, name


async def test_approval_steps_name_the_checkpoints_that_created_approvals(store: Store) -> None:
    for run_id in ("r1", "r2"):
        lease = await running(store, run_id)
        for seq, (name, kind) in enumerate(
            (("fetch", "step"), ("approval", "approval"), ("approval:wait", "approval-wait"),
             ("approval#2", "approval")), start=1):  # fmt: skip
            checkpoint = Checkpoint(seq, name, kind, CheckpointStatus.COMPLETED, result="null",
                                    attempts=1)  # fmt: skip
            await store.write_checkpoint(lease, checkpoint, NOW)
    everything = [("r1", 2, "approval"), ("r1", 4, "approval#2"), ("r2", 2, "approval"),
                  ("r2", 4, "approval#2")]  # fmt: skip
    assert await store.approval_steps() == everything
    assert await store.approval_steps(("r1", 2), limit=2) == everything[1:3]
    assert await store.approval_steps(("r2", 4)) == []


async def test_create_approval_is_idempotent_by_id(store: Store) -> None:
    lease = await running(store)
    first, made = await store.create_approval(lease, approval(), NOW + 1)
    assert made
    other = replace(approval(), title="Something else", required=3)
    again, made_again = await store.create_approval(lease, other, NOW + 2)
    assert not made_again
    assert again == first
    assert await store.get_approval("a1") == first
    assert [e.seq for e in await store.approval_audit("a1")] == [1]


async def test_create_approval_is_fenced_by_the_lease(store: Store) -> None:
    lease = await running(store)
    for bad in (Lease("r1", "w1", 2), Lease("r1", "w2", 1), Lease("ghost", "w1", 1)):
        with pytest.raises(LeaseLost) as lost:
            await store.create_approval(bad, approval(run_id=bad.run_id), NOW + 1)
        assert bad.run_id in str(lost.value)
        assert bad.worker_id in str(lost.value)
    await store.finish_run(lease, RunStatus.SUCCEEDED, "1", None, NOW + 2)
    with pytest.raises(LeaseLost):
        await store.create_approval(lease, approval(), NOW + 3)
    assert await store.get_approval("a1") is None
    assert await store.approval_audit("a1") == []
    assert await store.list_approvals() == []


async def test_unknown_approvals_are_none_with_an_empty_audit(store: Store) -> None:
    assert await store.get_approval("nope") is None
    assert await store.approval_audit("nope") == []
    assert await store.list_approvals() == []


async def test_list_approvals_is_oldest_first_filtered_and_limited(store: Store) -> None:
    await running(store, "r1")
    await running(store, "r2")
    # Ties on created_at break by id, compared as the memory store compares strings: "B" < "a".
    for approval_id, run_id, at in (
        ("late", "r1", NOW + 9),
        ("a", "r2", NOW + 5),
        ("B", "r1", NOW + 5),
        ("early", "r2", NOW + 1),
    ):
        await created(store, approval(approval_id, run_id, at), at)
    await store.change_approval("a", decide(), NOW + 10)

    def ids(found: list[ApprovalRecord]) -> list[str]:
        return [a.id for a in found]

    assert ids(await store.list_approvals()) == ["early", "B", "a", "late"]
    assert ids(await store.list_approvals(status=PENDING)) == ["early", "B", "late"]
    assert ids(await store.list_approvals(status=APPROVED)) == ["a"]
    assert ids(await store.list_approvals(run_id="r1")) == ["B", "late"]
    assert ids(await store.list_approvals(run_id="r2", status=PENDING)) == ["early"]
    assert ids(await store.list_approvals(limit=2)) == ["early", "B"]
    assert await store.list_approvals(limit=0) == []
    assert await store.list_approvals(run_id="r3") == []
    assert await store.list_approvals(status=CANCELLED) == []
    listed = await store.list_approvals(run_id="r2")
    assert listed == [await store.get_approval("early"), await store.get_approval("a")]


# -- change_approval ----------------------------------------------------------------------------


async def test_change_approval_stores_the_record_and_chains_every_note(store: Store) -> None:
    await running(store)
    first = await created(store, approval(), NOW + 1)
    at = NOW + 2.3
    stored, outcome = await store.change_approval("a1", decide(), at)
    assert outcome.event == '{"option": "approve"}'
    assert [n.event for n in outcome.notes] == ["voted", "decided"]
    voted = expected_entry("a1", 2, at, "voted", "alice", '{"option": "approve"}', first.audit_head)
    decided = expected_entry(
        "a1", 3, at, "decided", "alice", '{"option": "approve", "run": "running"}', voted.hash
    )
    assert stored == replace(
        first,
        status=APPROVED,
        decision=json.dumps({"option": "approve", "reviewer": "alice", "at": at}),
        votes='["alice"]',
        audit_count=3,
        audit_head=decided.hash,
        updated_at=at,
    )
    assert await store.get_approval("a1") == stored
    trail = await store.approval_audit("a1")
    assert trail[1:] == [voted, decided]
    assert [e.seq for e in trail] == [1, 2, 3]
    assert [e.prev_hash for e in trail] == [GENESIS, trail[0].hash, trail[1].hash]
    assert verify_chain(stored, trail) == []

    def note(record: ApprovalRecord, run_status: str | None, now: float) -> ApprovalChange:
        return ApprovalChange(notes=(Note("outcome", None, {"ref": "pay-1", "outcome": "ok"}),))

    later, _ = await store.change_approval("a1", note, NOW + 4)
    assert (later.status, later.audit_count, later.updated_at) == (APPROVED, 4, NOW + 4)
    trail = await store.approval_audit("a1")
    assert (trail[3].seq, trail[3].event, trail[3].prev_hash) == (4, "outcome", decided.hash)
    assert later.audit_head == trail[3].hash
    assert verify_chain(later, trail) == []


async def test_change_approval_delivers_its_event_to_a_waiting_run(store: Store) -> None:
    lease = await running(store)
    await created(store, approval(), NOW + 1)
    await store.suspend_run(lease, None, NOW + 2, wake_on=[approval_key("a1")])
    assert (await get(store, "r1")).wake_at is None
    before = await store.last_event_id()
    await store.change_approval("a1", decide(), NOW + 3)
    run = await get(store, "r1")
    assert (run.status, run.wake_at) == (RunStatus.WAITING, NOW + 3)
    [ref] = await store.events_after(before)
    assert (ref.run_id, ref.key) == ("r1", "tether:approval:a1")
    [claimed] = await store.claim_runs("w2", [WF], NOW + 3, NOW + 3 + LEASE, 5)
    assert claimed.id == "r1"
    taken = await store.take_event(
        lease_of(claimed), [approval_key("a1")], wait_checkpoint(0), NOW + 4
    )
    assert taken is not None
    assert json.loads(taken) == {"key": "tether:approval:a1", "value": {"option": "approve"}}


async def test_change_approval_delivers_nothing_to_a_finished_run(store: Store) -> None:
    lease = await running(store)
    await created(store, approval(), NOW + 1)
    await store.finish_run(lease, RunStatus.SUCCEEDED, "1", None, NOW + 2)
    before = await store.last_event_id()
    stored, outcome = await store.change_approval("a1", decide(), NOW + 3)
    assert outcome.event is not None  # asked for, but nobody would ever read it
    assert stored.status == APPROVED
    assert await store.last_event_id() == before
    assert (await get(store, "r1")).status is RunStatus.SUCCEEDED


async def test_change_approval_sees_the_stored_record_and_the_run_status(store: Store) -> None:
    lease = await running(store)
    first = await created(store, approval(), NOW + 1)
    seen: list[tuple[ApprovalRecord, str | None, float]] = []

    def look(record: ApprovalRecord, run_status: str | None, now: float) -> ApprovalChange:
        seen.append((record, run_status, now))
        return ApprovalChange(notes=(Note("viewed", "carol"),))

    viewed, _ = await store.change_approval("a1", look, NOW + 2)
    await store.suspend_run(lease, NOW + 100, NOW + 3)
    await store.change_approval("a1", look, NOW + 4)
    await store.cancel_run("r1", '{"type": "RunCancelled"}', NOW + 5)
    await store.change_approval("a1", look, NOW + 6)
    assert [(s[1], s[2]) for s in seen] == [
        ("running", NOW + 2),
        ("waiting", NOW + 4),
        ("cancelled", NOW + 6),
    ]
    assert seen[0][0] == first
    assert seen[1][0] == viewed


async def test_a_refused_change_with_only_notes_writes_only_the_audit(store: Store) -> None:
    await running(store)
    first = await created(store, approval(), NOW + 1)
    before = await store.last_event_id()

    def refuse(record: ApprovalRecord, run_status: str | None, now: float) -> ApprovalChange:
        return ApprovalChange(
            notes=(Note("refused", "bob", {"reason": "separate_duties"}),),
            refused="separate_duties",
        )

    stored, outcome = await store.change_approval("a1", refuse, NOW + 2)
    assert outcome.refused == "separate_duties"
    refused = expected_entry(
        "a1", 2, NOW + 2, "refused", "bob", '{"reason": "separate_duties"}', first.audit_head
    )
    assert stored == replace(first, audit_count=2, audit_head=refused.hash, updated_at=NOW + 2)
    assert stored.status == PENDING
    assert await store.get_approval("a1") == stored
    assert (await store.approval_audit("a1"))[1:] == [refused]
    assert await store.last_event_id() == before


class Boom(Exception):
    pass


async def test_a_change_that_raises_writes_nothing_and_the_error_propagates(
    store: Store,
) -> None:
    lease = await running(store)
    first = await created(store, approval(), NOW + 1)
    await store.suspend_run(lease, None, NOW + 2, wake_on=[approval_key("a1")])
    run = await get(store, "r1")
    before = await store.last_event_id()
    calls: list[str | None] = []

    def explode(record: ApprovalRecord, run_status: str | None, now: float) -> ApprovalChange:
        calls.append(run_status)
        raise Boom("no")

    with pytest.raises(Boom, match="no"):
        await store.change_approval("a1", explode, NOW + 3)
    assert calls == ["waiting"]
    assert await store.get_approval("a1") == first
    assert [e.seq for e in await store.approval_audit("a1")] == [1]
    assert await store.last_event_id() == before
    assert await get(store, "r1") == run


async def test_concurrent_changes_each_land_once_in_one_chain(store: Store) -> None:
    await running(store)
    await created(store, approval(), NOW + 1)

    def view(reviewer: str) -> ChangeFn:
        def change(record: ApprovalRecord, run_status: str | None, now: float) -> ApprovalChange:
            return ApprovalChange(notes=(Note("viewed", reviewer),))

        return change

    names = [f"reviewer-{i}" for i in range(12)]
    await asyncio.gather(*(store.change_approval("a1", view(n), NOW + 2) for n in names))
    stored = await store.get_approval("a1")
    assert stored is not None
    trail = await store.approval_audit("a1")
    assert [e.seq for e in trail] == list(range(1, 14))
    assert sorted(str(e.actor) for e in trail[1:]) == sorted(names)
    assert verify_chain(stored, trail) == []


async def test_change_approval_of_an_unknown_id_raises_approval_not_found(store: Store) -> None:
    calls: list[str] = []

    def never(record: ApprovalRecord, run_status: str | None, now: float) -> ApprovalChange:
        calls.append(record.id)
        return ApprovalChange()

    with pytest.raises(ApprovalNotFound, match=r"'nope'.*tether approvals list"):
        await store.change_approval("nope", never, NOW)
    assert calls == []
    assert await store.get_approval("nope") is None


# -- a run's end cancels its pending approvals ----------------------------------------------------


def assert_cancelled(
    record: ApprovalRecord | None, trail: list[AuditEntry], reason: str, at: float
) -> None:
    assert record is not None
    assert (record.status, record.updated_at) == (CANCELLED, at)
    last = trail[-1]
    assert (last.event, last.actor, last.at) == ("cancelled", None, at)
    assert json.loads(last.detail) == {"reason": reason}
    assert verify_chain(record, trail) == []


@pytest.mark.parametrize("status", [RunStatus.SUCCEEDED, RunStatus.FAILED])
async def test_finish_run_cancels_pending_approvals_and_leaves_decided_ones(
    store: Store, status: RunStatus
) -> None:
    lease = await running(store, "r1")
    await running(store, "other")
    for approval_id in ("p1", "p2", "done"):
        await created(store, approval(approval_id, "r1"), NOW + 1)
    elsewhere = await created(store, approval("x", "other"), NOW + 1)
    decided, _ = await store.change_approval("done", decide(), NOW + 2)
    decided_trail = await store.approval_audit("done")
    at = NOW + 5.7
    await store.finish_run(lease, status, None, '{"type": "E"}', at)
    for approval_id in ("p1", "p2"):
        trail = await store.approval_audit(approval_id)
        assert [e.event for e in trail] == ["created", "cancelled"]
        assert_cancelled(
            await store.get_approval(approval_id), trail, f"the run ended ({status})", at
        )
    assert await store.get_approval("done") == decided
    assert await store.approval_audit("done") == decided_trail
    assert await store.get_approval("x") == elsewhere
    assert [a.id for a in await store.list_approvals(status=CANCELLED)] == ["p1", "p2"]


@pytest.mark.parametrize(("status", "failures"), [(RunStatus.SUCCEEDED, None),
                                                   (RunStatus.DEAD, 4)])  # fmt: skip
async def test_a_run_ends_with_the_same_row_whether_it_had_approvals_to_cancel_or_not(
    store: Store, status: RunStatus, failures: int | None
) -> None:
    """PostgreSQL ends a run without pending approvals in one statement and one with them in a
    transaction that also cancels them: two SET lists, which must leave the same row."""
    rows = []
    for run_id, pending in (("plain", False), ("held", True)):
        lease = await running(store, run_id)
        await store.suspend_run(lease, NOW + 500, NOW + 1, ["go"])  # wake_at, wake_on set
        (run,) = await store.claim_runs("w1", [WF], NOW + 500, NOW + 500 + LEASE, 1)
        lease = lease_of(run)
        await store.cancel_run(run_id, '{"type": "RunCancelled"}', NOW + 500.5)  # flagged
        assert (await get(store, run_id)).cancel_requested
        if pending:
            await created(store, approval(f"a-{run_id}", run_id), NOW + 501)
        if failures is None:
            await store.finish_run(lease, status, '"done"', None, NOW + 502.5)
        else:
            await store.fail_execution(lease, '{"type": "E"}', failures, None, NOW + 502.5)
        rows.append(replace(await get(store, run_id), id="", args=""))
    plain, held = rows
    assert plain == held
    assert (plain.status, plain.owner, plain.lease_expires_at) == (status, None, None)
    assert (plain.wake_at, plain.wake_on, plain.cancel_requested) == (None, (), False)
    assert (plain.finished_at, plain.updated_at) == (NOW + 502.5, NOW + 502.5)


async def test_an_approval_created_while_its_run_ends_elsewhere_never_stays_pending(
    store: Store,
) -> None:
    """Two handles on one database (two workers' stores), so each write is alone in its own
    commit: PostgreSQL then ends a run with no pending approval in one statement, and an
    approval committed just before it, or racing it, must still end cancelled, or fail."""
    other = store.another() or store
    if other is not store:
        await other.open()
    try:
        for i in range(20):
            lease = await running(store, f"r{i}")
            made, _ = await asyncio.gather(
                other.create_approval(lease, approval(f"a{i}", f"r{i}"), NOW + 1),
                store.finish_run(lease, RunStatus.SUCCEEDED, "1", None, NOW + 2),
                return_exceptions=True,
            )
            assert (await get(store, f"r{i}")).status is RunStatus.SUCCEEDED
            record = await store.get_approval(f"a{i}")
            if isinstance(made, LeaseLost):  # the run had ended: nothing was created
                assert record is None
            else:
                assert not isinstance(made, BaseException), made
                assert record is not None
                assert record.status == CANCELLED, (i, record.status)
    finally:
        if other is not store:
            await other.close()


async def test_cancel_run_cancels_the_pending_approvals_of_the_runs_it_ends_at_once(
    store: Store,
) -> None:
    parent = await running(store, "parent")
    await created(store, approval("pa", "parent"), NOW + 1)
    await store.suspend_run(parent, NOW + 500, NOW + 1)  # waiting: ends at once
    await store.create_run(
        NewRun("kid", WF, "{}", parent_id="parent"), NOW, owner="w1", lease_until=NOW + LEASE
    )
    kid = Lease("kid", "w1", 1)
    await created(store, approval("ka", "kid"), NOW + 1)  # held by its worker: only flagged
    await store.create_run(
        NewRun("grandkid", WF, "{}", parent_id="kid"), NOW, owner="w1", lease_until=NOW + LEASE
    )
    await created(store, approval("ga", "grandkid"), NOW + 1)
    await store.suspend_run(Lease("grandkid", "w1", 1), None, NOW + 1)
    at = NOW + 3.3
    await store.cancel_run("parent", '{"type": "RunCancelled"}', at)
    reason = "the run ended (cancelled)"
    for approval_id in ("pa", "ga"):
        trail = await store.approval_audit(approval_id)
        assert_cancelled(await store.get_approval(approval_id), trail, reason, at)
    still = await store.get_approval("ka")
    assert still is not None
    assert (still.status, still.audit_count) == (PENDING, 1)
    await store.finish_run(kid, RunStatus.CANCELLED, None, '{"type": "RunCancelled"}', NOW + 4)
    assert_cancelled(
        await store.get_approval("ka"), await store.approval_audit("ka"), reason, NOW + 4
    )


# -- the audit trail shows tampering -----------------------------------------------------------


async def tamper(store: Store, approval_id: str, seq: int, detail: str) -> None:
    """Edit one audit entry's detail behind the store's back, as someone with database access."""
    if isinstance(store, SqliteStore):  # a MemoryStore too: its private SQLite file
        with sqlite3.connect(store.path) as conn:
            conn.execute(
                "UPDATE tether_approval_audit SET detail = ? WHERE approval_id = ? AND seq = ?",
                (detail, approval_id, seq),
            )
        conn.close()
    else:
        assert isinstance(store, PostgresStore)
        conninfo, schema = parse_postgres_url(store.url)
        async with await psycopg.AsyncConnection.connect(conninfo) as conn:
            await conn.execute(f'SET search_path TO "{schema}"')
            await conn.execute(
                "UPDATE tether_approval_audit SET detail = %s WHERE approval_id = %s AND seq = %s",
                (detail, approval_id, seq),
            )
            await conn.commit()


async def test_verify_chain_finds_an_audit_entry_edited_in_the_database(store: Store) -> None:
    await running(store)
    await created(store, approval(), NOW + 1)
    stored, _ = await store.change_approval("a1", decide(), NOW + 2.2)
    assert verify_chain(stored, await store.approval_audit("a1")) == []
    await tamper(store, "a1", 2, '{"option": "reject"}')
    trail = await store.approval_audit("a1")
    assert trail[1].detail == '{"option": "reject"}'
    assert verify_chain(stored, trail) == [
        "entry 2 (voted) was altered: its hash does not match its content and the entry before it"
    ]

"""The audit trail's hash chain: an intact trail verifies; an edited entry, a deleted entry in
the middle, a deleted tail, a reordered trail and a forged head are each detected."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from tether.store.audit import audit_hash, chain, verify_chain
from tether.store.port.approvals import ApprovalRecord, AuditEntry, Note


def trail(events: int = 4) -> tuple[ApprovalRecord, list[AuditEntry]]:
    record = ApprovalRecord(
        id="ap-1", run_id="run", step="approval", title="t", description="", options="[]",
        operation="null", operation_digest="d", reviewers='["*"]', required=1,
        separate_duties=False, starter=None, context="null", response_schema=None,
        created_at=1.0, expires_at=2.0,
    )  # fmt: skip
    entries: list[AuditEntry] = []
    for n in range(events):
        record, added = chain(record, [Note(f"e{n}", "alice", {"n": n})], 10.0 + n)
        entries += added
    return record, entries


def test_an_intact_trail_verifies_and_links_each_entry_to_the_one_before() -> None:
    record, entries = trail()
    assert verify_chain(record, entries) == []
    assert [e.seq for e in entries] == [1, 2, 3, 4]
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(entries))
    assert record.audit_count == 4
    assert record.audit_head == entries[-1].hash


@pytest.mark.parametrize(
    ("tamper", "problem"),
    [
        (lambda es: [es[0], dataclasses.replace(es[1], detail='{"n": 99}'), *es[2:]], "altered"),
        (lambda es: [es[0], dataclasses.replace(es[1], actor="mallory"), *es[2:]], "altered"),
        (lambda es: [es[0], dataclasses.replace(es[1], at=0.0), *es[2:]], "altered"),
        (lambda es: [es[0], *es[2:]], "missing"),
        (lambda es: es[:-1], "deleted"),
        (lambda es: [es[1], es[0], *es[2:]], "missing"),
    ],
    ids=[
        "edited-detail",
        "edited-actor",
        "edited-time",
        "deleted-middle",
        "deleted-tail",
        "reordered",
    ],
)
def test_each_kind_of_tampering_is_detected(tamper: object, problem: str) -> None:
    record, entries = trail()
    problems = verify_chain(record, tamper(entries))  # type: ignore[operator]
    assert len(problems) == 1
    assert problem in problems[0]


def test_a_rewritten_entry_with_a_recomputed_hash_still_breaks_the_next_link() -> None:
    record, entries = trail()
    rewritten = dataclasses.replace(entries[1], actor="mallory")
    # Recompute the edited entry's own hash: the following entry still names the old one.
    rewritten = dataclasses.replace(rewritten, hash=audit_hash(
        rewritten.prev_hash, rewritten.approval_id, rewritten.seq, rewritten.at, rewritten.event,
        rewritten.actor, rewritten.detail))  # fmt: skip
    problems = verify_chain(record, [entries[0], rewritten, *entries[2:]])
    assert problems
    assert "entry 3" in problems[0]


@pytest.mark.parametrize(
    ("events", "status", "problem"),
    [
        ([("decided", {"status": "rejected"})], "approved", "its trail says 'rejected'"),
        ([], "approved", "its trail says 'pending'"),
        ([("expired", {})], "approved", "its trail says 'expired'"),
        ([("decided", {"status": "approved"})], "approved", None),
        ([("cancelled", {})], "cancelled", None),
    ],
)
def test_a_status_the_trail_does_not_lead_to_is_detected(
    events: list[tuple[str, dict[str, str]]], status: str, problem: str | None
) -> None:
    record, entries = trail(1)
    for event, detail in events:
        record, added = chain(record, [Note(event, "alice", detail)], 20.0)
        entries += added
    problems = verify_chain(dataclasses.replace(record, status=status), entries)
    assert problems == ([] if problem is None else [problems[0]])
    if problem is not None:
        assert problem in problems[0]

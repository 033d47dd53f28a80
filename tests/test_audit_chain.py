"""The audit trail's hash chain: an intact trail verifies; an edited entry, a deleted entry in
the middle, a deleted tail, a reordered trail and a forged head are each detected; and the row
checked against its trail: rewritten fixed fields, votes and deciders are detected."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from tether.store.audit import (
    audit_hash,
    chain,
    covered,
    created_note,
    fixed_digest,
    verify_chain,
    verify_record,
)
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


def created_trail() -> tuple[ApprovalRecord, list[AuditEntry]]:
    """An approval created with its commitment, voted for by ann, approved by ben."""
    record, _ = trail(0)
    record = dataclasses.replace(record, required=2, reviewers='["group:sre"]',
                                 options='[{"id": "approve"}, {"id": "reject"}]')  # fmt: skip
    record, entries = chain(record, [created_note(record)], 10.0)
    vote = {"reviewer": "ann", "option": "approve", "comment": None, "response": None, "at": 11.0}
    last = {**vote, "reviewer": "ben", "at": 12.0}
    record, added = chain(record, [Note("voted", "ann", vote)], 11.0)
    entries += added
    decision = {**last, "approvers": ["ann", "ben"]}
    record = dataclasses.replace(record, status="approved", decision=json.dumps(decision),
                                 votes=json.dumps([vote, last]))  # fmt: skip
    record, added = chain(record, [Note("decided", "ben", {**last, "status": "approved"})], 12.0)
    return record, entries + added


def test_a_row_that_agrees_with_its_committed_trail_verifies_and_is_covered() -> None:
    record, entries = created_trail()
    assert verify_record(record, entries) == []
    assert covered(entries)
    assert json.loads(entries[0].detail)["covers"] == fixed_digest(record)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"reviewers": '["*"]'}, "(reviewers)"),
        ({"required": 1}, "(required)"),
        ({"separate_duties": True}, "(separate_duties)"),
        ({"starter": "eve"}, "(starter)"),
        ({"operation_digest": "e" * 64}, "(operation_digest)"),
        ({"expires_at": 9e12}, "(expires_at)"),
        ({"operation": '{"rm": "-rf"}'}, "title, description, operation or context"),
        ({"title": "Harmless"}, "title, description, operation or context"),
        ({"votes": json.dumps([{"reviewer": "eve"}, {"reviewer": "ben"}])}, "votes"),
    ],
)
def test_each_rewritten_fixed_field_or_vote_of_a_row_is_detected(
    change: dict[str, object], problem: str
) -> None:
    record, entries = created_trail()
    problems = verify_record(dataclasses.replace(record, **change), entries)  # type: ignore[arg-type]
    assert problems
    assert problem in " ".join(problems)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("reviewer", "eve"),
        ("option", "deploy-anyway"),
        ("response", {"force": True}),
        ("approvers", ["ben", "ben"]),
    ],
)
def test_who_decided_and_how_rewritten_in_the_row_is_detected(field: str, value: object) -> None:
    record, entries = created_trail()
    decision = {**json.loads(record.decision or "{}"), field: value}
    problems = verify_record(dataclasses.replace(record, decision=json.dumps(decision)), entries)
    assert problems
    assert field in " ".join(problems)


def test_a_trail_made_before_the_commitment_is_not_covered_but_not_broken() -> None:
    record, entries = trail()
    assert not covered(entries)
    assert verify_record(record, entries) == []

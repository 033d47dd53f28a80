"""The Store contract for the trail of actions, run once per backend (see conftest).

record_action appends and answers increasing ids; list_actions reads newest first, by subject,
by actor, by both or all, a page at a time below a `before` id. Text is kept exactly as given,
hostile text included (the caller redacts; the store never rewrites).
"""

from __future__ import annotations

from dataclasses import replace

from tests.contract.test_store_contract import NOW

from tether.store.port import Store
from tether.store.port.actions import ActionRecord


def action(
    subject: str, actor: str = "alice", what: str = "cancel", at: float = NOW
) -> ActionRecord:
    return ActionRecord(at, actor, "page", "127.0.0.1", what, subject, "done", "")


async def test_a_recorded_action_is_read_back_whole_with_its_id(store: Store) -> None:
    made = replace(action("run-1"), detail="from step 'b'\n<script>\u2028", outcome="refused")
    first = await store.record_action(made)
    second = await store.record_action(action("run-1", what="resume"))
    assert first > 0
    assert second > first
    found = await store.list_actions(subject="run-1")
    assert found == [replace(action("run-1", what="resume"), id=second), replace(made, id=first)]


async def test_actions_are_listed_by_subject_actor_both_or_all_newest_first(store: Store) -> None:
    ids = [
        await store.record_action(action(subject, actor, at=NOW + i))
        for i, (subject, actor) in enumerate(
            [("run-1", "alice"), ("run-2", "alice"), ("run-1", "bob"), ("msg-1", "bob")]
        )
    ]

    def of(found: list[ActionRecord]) -> list[int]:
        return [a.id for a in found]

    assert of(await store.list_actions()) == ids[::-1]
    assert of(await store.list_actions(subject="run-1")) == [ids[2], ids[0]]
    assert of(await store.list_actions(actor="alice")) == [ids[1], ids[0]]
    assert of(await store.list_actions(subject="run-1", actor="bob")) == [ids[2]]
    assert of(await store.list_actions(subject="run-3")) == []
    assert of(await store.list_actions(actor="carol")) == []


async def test_actions_are_paged_below_a_cursor(store: Store) -> None:
    ids = [await store.record_action(action("run-1", at=NOW + i)) for i in range(5)]
    page = await store.list_actions(subject="run-1", limit=2)
    assert [a.id for a in page] == [ids[4], ids[3]]
    following = await store.list_actions(subject="run-1", before=page[-1].id, limit=2)
    assert [a.id for a in following] == [ids[2], ids[1]]
    last = await store.list_actions(subject="run-1", before=following[-1].id, limit=2)
    assert [a.id for a in last] == [ids[0]]
    assert await store.list_actions(before=ids[0]) == []

"""The Store contract for inbox sessions, run once per backend (see conftest).

A session is live while it is not ended, before its absolute expiry and seen within its idle
limit: get_session reads a live one, touch_session moves its last-seen time, end_session and
end_sessions end one or all of a user's, and create_session deletes the ones no longer live.
Same rules as test_store_contract: plain float times, nothing sleeps, exact answers.
"""

from __future__ import annotations

from dataclasses import replace

from tests.contract.test_store_contract import NOW

from tether.store.port import Store
from tether.store.port.users import SessionRecord


def session(name: str, user: str = "alice", *, idle: float = 1800.0) -> SessionRecord:
    return SessionRecord(f"hash-{name}", user, NOW, NOW, NOW + 43_200, idle)


async def test_a_created_session_is_read_back_while_live(store: Store) -> None:
    made = session("a")
    await store.create_session(made, NOW)
    assert await store.get_session("hash-a", NOW + 1) == made
    assert await store.get_session("hash-unknown", NOW + 1) is None


async def test_a_session_is_not_live_after_its_idle_limit_or_its_absolute_expiry(
    store: Store,
) -> None:
    await store.create_session(session("a", idle=60), NOW)
    assert await store.get_session("hash-a", NOW + 59.5) is not None
    assert await store.get_session("hash-a", NOW + 60) is None  # idle for the whole limit
    assert await store.touch_session("hash-a", NOW + 61) is None  # too late to be touched
    long_idle = session("b", idle=10**9)
    await store.create_session(long_idle, NOW)
    assert await store.get_session("hash-b", NOW + 43_199) == long_idle
    assert await store.get_session("hash-b", NOW + 43_200) is None  # the absolute limit


async def test_touching_a_session_moves_its_last_seen_time_and_so_its_idle_limit(
    store: Store,
) -> None:
    await store.create_session(session("a", idle=60), NOW)
    touched = await store.touch_session("hash-a", NOW + 50)
    assert touched == replace(session("a", idle=60), seen_at=NOW + 50)
    assert await store.get_session("hash-a", NOW + 100) == touched  # 50 s after the touch
    assert await store.get_session("hash-a", NOW + 110) is None
    assert await store.touch_session("hash-unknown", NOW) is None


async def test_an_ended_session_is_no_longer_live_and_ends_once(store: Store) -> None:
    await store.create_session(session("a"), NOW)
    await store.create_session(session("b"), NOW)
    assert await store.end_session("hash-a", NOW + 5) is True
    assert await store.end_session("hash-a", NOW + 6) is False  # already ended
    assert await store.end_session("hash-unknown", NOW + 6) is False
    assert await store.get_session("hash-a", NOW + 7) is None
    assert await store.touch_session("hash-a", NOW + 7) is None
    assert await store.get_session("hash-b", NOW + 7) == session("b")  # the others stay


async def test_ending_a_users_sessions_ends_all_of_theirs_and_no_one_elses(store: Store) -> None:
    for name in ("a1", "a2", "a3"):
        await store.create_session(session(name, "alice"), NOW)
    await store.create_session(session("b1", "bob"), NOW)
    await store.end_session("hash-a3", NOW + 1)
    assert await store.end_sessions("alice", NOW + 2) == 2  # a3 had ended already
    assert await store.end_sessions("alice", NOW + 3) == 0
    assert await store.end_sessions("nobody", NOW + 3) == 0
    for name in ("a1", "a2", "a3"):
        assert await store.get_session(f"hash-{name}", NOW + 4) is None
    assert await store.get_session("hash-b1", NOW + 4) == session("b1", "bob")


async def test_creating_a_session_deletes_the_ones_that_are_no_longer_live(store: Store) -> None:
    await store.create_session(session("ended"), NOW)
    await store.create_session(session("idle", idle=10), NOW)
    await store.create_session(session("live"), NOW)
    await store.end_session("hash-ended", NOW + 1)
    await store.create_session(replace(session("new"), created_at=NOW + 20), NOW + 20)
    # Deleted, not merely ended: ending them again finds nothing to end.
    assert await store.end_session("hash-ended", NOW + 21) is False
    assert await store.end_session("hash-idle", NOW + 21) is False
    assert await store.end_sessions("alice", NOW + 21) == 2  # "live" and "new" were kept

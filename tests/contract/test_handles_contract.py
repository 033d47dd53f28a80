"""The Store contract for handles on one database, run once per backend (see conftest): open
and close, another() (a second handle with connections of its own, None for memory), and
poll_changes (PostgreSQL: pushed by NOTIFY, so looked at in a short bounded loop; SQLite: the
file's data version). Nothing sleeps but that bounded polling.
"""

from __future__ import annotations

import asyncio

import pytest
from tests.contract.test_store_contract import NOW, get, new

from tether.errors import StoreUnavailable
from tether.store.memory import MemoryStore
from tether.store.port import Store
from tether.store.port.users import UserRecord

POLL_FOR = 2.0  # seconds a pushed notification may take to arrive


async def polls(store: Store, answer: bool) -> bool:
    """Whether poll_changes gives `answer` within POLL_FOR (looking every 10 ms)."""
    try:
        async with asyncio.timeout(POLL_FOR):
            while await store.poll_changes() is not answer:
                await asyncio.sleep(0.01)
    except TimeoutError:
        return False
    return True


async def test_open_again_is_harmless_and_a_reopened_handle_keeps_what_was_committed(
    store: Store,
) -> None:
    run, _ = await store.create_run(new("r1"), NOW)
    await store.open()  # idempotent: already open
    assert await get(store, "r1") == run
    await store.close()
    await store.open()
    assert await get(store, "r1") == run
    await store.create_run(new("r2"), NOW + 1)
    assert [r.id for r in await store.list_runs()] == ["r2", "r1"]


async def test_another_is_a_handle_of_its_own_that_once_open_shares_the_database(
    store: Store,
) -> None:
    other = store.another()
    if isinstance(store, MemoryStore):
        assert other is None  # the data lives in this one object
        return
    assert other is not None
    assert other is not store
    assert type(other) is type(store)
    assert other.url == store.url
    with pytest.raises(StoreUnavailable):  # not yet open
        await other.get_run("r1")
    first, _ = await store.create_run(new("r1"), NOW)
    await other.open()
    try:
        assert await other.get_run("r1") == first  # the first handle's committed write
        second, _ = await other.create_run(new("r2"), NOW + 1)
        await other.put_user(UserRecord("ann", ("ops",), "h" * 64, NOW))
        assert await get(store, "r2") == second  # and the other way round
        assert await store.get_user("ann") == UserRecord("ann", ("ops",), "h" * 64, NOW)
    finally:
        await other.close()
    assert await get(store, "r2") == second  # closing one handle leaves the other working


async def test_close_finishes_the_writes_still_pending(store: Store) -> None:
    other = store.another() or store  # memory: no second handle, close the store itself
    if other is not store:
        await other.open()
    writes = [asyncio.ensure_future(other.create_run(new(f"r{i}"), NOW + i)) for i in range(5)]
    await asyncio.sleep(0)  # the writes are submitted, not yet committed
    await other.close()
    made = await asyncio.gather(*writes)
    assert [created for _, created in made] == [True] * 5
    if other is store:
        await store.open()
    assert sorted(r.id for r in await store.list_runs()) == [f"r{i}" for i in range(5)]


async def test_poll_changes_reports_what_another_handle_committed(store: Store) -> None:
    await store.create_run(new("r1"), NOW)
    assert isinstance(await store.poll_changes(), bool)
    assert await polls(store, False)  # what was announced so far is taken in
    assert await store.poll_changes() is False  # nothing committed since
    other = store.another()
    if other is None:  # memory: no other connection can commit
        assert isinstance(store, MemoryStore)
        return
    await other.open()
    try:
        assert await polls(store, False)
        await other.create_run(new("r2"), NOW + 1)
        assert await polls(store, True)
        assert (await get(store, "r2")).id == "r2"
    finally:
        await other.close()

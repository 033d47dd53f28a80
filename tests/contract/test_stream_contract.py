"""The Store contract for streams, once per backend: offsets given by the store (from 0, no gap,
never twice, also to concurrent appenders and to a second handle on the same database), reads
from any offset with paging, refs that make a re-append a look-up, the retraction query, and
appends fenced by the lease."""

from __future__ import annotations

import asyncio
import json

import pytest

from tether.errors import LeaseLost
from tether.store import store_from_url
from tether.store.memory import MemoryStore
from tether.store.port import Lease, NewRun, RunStatus, Store
from tether.store.port.streams import StreamAppend, StreamEntry, StreamKind

NOW = 1000.0
WF = "wf"


async def running(store: Store, run_id: str = "r1", worker: str = "w1") -> Lease:
    await store.create_run(NewRun(run_id, WF, "{}"), NOW, owner=worker, lease_until=NOW + 30)
    return Lease(run_id, worker, 1)


def chunk(value: object, writer: str = "step", attempt: int = 1) -> StreamAppend:
    return StreamAppend(StreamKind.CHUNK, json.dumps(value), writer, attempt)


def reset(offsets: list[int], writer: str = "step", attempt: int = 1) -> StreamAppend:
    return StreamAppend(StreamKind.RESET, json.dumps(offsets), writer, attempt)


async def everything(store: Store, run_id: str = "r1", key: str = "k") -> list[StreamEntry]:
    return await store.read_stream(run_id, key, 0, 100_000)


async def test_offsets_start_at_zero_and_follow_on_without_gaps(store: Store) -> None:
    lease = await running(store)
    assert await store.append_stream(lease, "k", [chunk("a"), chunk("b")], NOW) == [0, 1]
    assert await store.append_stream(lease, "k", [chunk("c")], NOW + 1) == [2]
    assert await store.append_stream(lease, "k", [], NOW + 2) == []
    assert await store.append_stream(lease, "k", [chunk("d"), chunk("e")], NOW + 3) == [3, 4]
    entries = await everything(store)
    assert [e.offset for e in entries] == [0, 1, 2, 3, 4]
    assert [json.loads(e.data) for e in entries] == ["a", "b", "c", "d", "e"]


async def test_entries_keep_their_kind_data_writer_attempt_ref_and_time(store: Store) -> None:
    lease = await running(store)
    await store.append_stream(
        lease,
        "k",
        [chunk({"x": [1, 2]}, "gen#2", 3), reset([0], "gen#2", 4),
         StreamAppend(StreamKind.CHUNK, '"w"', "stream:k", 0, ref="stream:k")],
        NOW + 5,
    )  # fmt: skip
    assert await everything(store) == [
        StreamEntry(0, StreamKind.CHUNK, '{"x": [1, 2]}', "gen#2", 3, None, NOW + 5),
        StreamEntry(1, StreamKind.RESET, "[0]", "gen#2", 4, None, NOW + 5),
        StreamEntry(2, StreamKind.CHUNK, '"w"', "stream:k", 0, "stream:k", NOW + 5),
    ]


async def test_streams_are_separate_per_run_and_per_key(store: Store) -> None:
    one = await running(store, "r1")
    two = await running(store, "r2")
    assert await store.append_stream(one, "k", [chunk(1), chunk(2)], NOW) == [0, 1]
    assert await store.append_stream(one, "other", [chunk(3)], NOW) == [0]
    assert await store.append_stream(two, "k", [chunk(4)], NOW) == [0]
    assert [json.loads(e.data) for e in await everything(store, "r1", "k")] == [1, 2]
    assert [json.loads(e.data) for e in await everything(store, "r1", "other")] == [3]
    assert [json.loads(e.data) for e in await everything(store, "r2", "k")] == [4]
    assert await everything(store, "r3", "k") == []
    assert await everything(store, "r1", "missing") == []


async def test_concurrent_appends_get_distinct_contiguous_offsets(store: Store) -> None:
    lease = await running(store)
    calls = [[chunk(f"{i}.{j}") for j in range(3)] for i in range(40)]
    results = await asyncio.gather(*(store.append_stream(lease, "k", c, NOW) for c in calls))
    for offsets in results:  # one append's entries are contiguous...
        assert offsets == list(range(offsets[0], offsets[0] + 3))
    assert sorted(o for r in results for o in r) == list(range(120))  # ...and none is shared
    entries = await everything(store)
    assert [e.offset for e in entries] == list(range(120))
    for offsets, call in zip(results, calls, strict=True):
        assert [entries[o].data for o in offsets] == [e.data for e in call]


async def test_two_handles_on_one_database_appending_at_once_never_share_an_offset(
    store: Store,
) -> None:
    lease = await running(store)
    other = store if isinstance(store, MemoryStore) else store_from_url(store.url)
    await other.open()
    try:
        results = await asyncio.gather(*(
            (store if i % 2 else other).append_stream(lease, "k", [chunk(i), chunk(i)], NOW)
            for i in range(30)
        ))  # fmt: skip
    finally:
        if other is not store:
            await other.close()
    assert sorted(o for r in results for o in r) == list(range(60))
    entries = await everything(store)
    assert [e.offset for e in entries] == list(range(60))
    for i, offsets in enumerate(results):
        assert [json.loads(entries[o].data) for o in offsets] == [i, i]


@pytest.mark.parametrize("start", [0, 1, 7, 12, 13, 50])
async def test_a_read_from_any_offset_returns_the_suffix_in_order(store: Store, start: int) -> None:
    lease = await running(store)
    await store.append_stream(lease, "k", [chunk(i) for i in range(13)], NOW)
    entries = await store.read_stream("r1", "k", start, 1000)
    assert [e.offset for e in entries] == list(range(start, 13))
    assert [json.loads(e.data) for e in entries] == list(range(start, 13))


async def test_limit_pages_through_the_stream(store: Store) -> None:
    lease = await running(store)
    await store.append_stream(lease, "k", [chunk(i) for i in range(10)], NOW)
    assert [e.offset for e in await store.read_stream("r1", "k", 0, 4)] == [0, 1, 2, 3]
    assert [e.offset for e in await store.read_stream("r1", "k", 4, 4)] == [4, 5, 6, 7]
    assert [e.offset for e in await store.read_stream("r1", "k", 8, 4)] == [8, 9]
    assert await store.read_stream("r1", "k", 10, 4) == []
    assert await store.read_stream("r1", "k", 0, 0) == []


async def test_an_entry_whose_ref_is_stored_is_not_appended_again(store: Store) -> None:
    lease = await running(store)
    first = StreamAppend(StreamKind.CHUNK, '"once"', "stream:k", 0, ref="stream:k")
    assert await store.append_stream(lease, "k", [chunk("a"), first], NOW) == [0, 1]
    # A re-append (a crash between the append and its checkpoint): the stored offset, no row.
    assert await store.append_stream(lease, "k", [first], NOW + 1) == [1]
    again = StreamAppend(StreamKind.CHUNK, '"other data"', "stream:k", 0, ref="stream:k")
    assert await store.append_stream(lease, "k", [again, chunk("b")], NOW + 2) == [1, 2]
    # Within one append, the second entry with a ref is the first one.
    twice = StreamAppend(StreamKind.CHUNK, '"t"', "stream:k#2", 0, ref="stream:k#2")
    assert await store.append_stream(lease, "k", [twice, twice, chunk("c")], NOW) == [3, 3, 4]
    entries = await everything(store)
    assert [json.loads(e.data) for e in entries] == ["a", "once", "b", "t", "c"]
    assert [e.ref for e in entries] == [None, "stream:k", None, "stream:k#2", None]
    # The same ref on another stream is another entry.
    assert await store.append_stream(lease, "other", [first], NOW) == [0]


async def test_concurrent_re_appends_of_one_ref_write_it_once(store: Store) -> None:
    lease = await running(store)
    entry = StreamAppend(StreamKind.CHUNK, '"x"', "stream:k", 0, ref="stream:k")
    results = await asyncio.gather(*(store.append_stream(lease, "k", [entry], NOW)
                                     for _ in range(10)))  # fmt: skip
    assert results == [[0]] * 10
    assert len(await everything(store)) == 1


async def test_unretracted_lists_a_writers_chunks_that_no_reset_names(store: Store) -> None:
    lease = await running(store)
    await store.append_stream(
        lease, "k", [chunk(0, "gen", 1), chunk(1, "gen", 1), chunk(2, "other", 1)], NOW
    )
    assert await store.stream_unretracted("r1", "k", "gen") == [0, 1]
    assert await store.stream_unretracted("r1", "k", "other") == [2]
    assert await store.stream_unretracted("r1", "k", "nobody") == []
    assert await store.stream_unretracted("r1", "missing", "gen") == []
    await store.append_stream(lease, "k", [reset([0, 1], "gen", 2), chunk(4, "gen", 2)], NOW)
    assert await store.stream_unretracted("r1", "k", "gen") == [4]
    assert await store.stream_unretracted("r1", "k", "other") == [2]
    await store.append_stream(lease, "k", [chunk(5, "gen", 2), reset([4], "gen", 2)], NOW)
    assert await store.stream_unretracted("r1", "k", "gen") == [5]


async def test_an_append_without_the_lease_raises_lease_lost_and_writes_nothing(
    store: Store,
) -> None:
    lease = await running(store)
    await store.append_stream(lease, "k", [chunk("kept")], NOW)
    await store.release_worker("w1", NOW + 1)
    [adopted] = await store.claim_runs("w2", [WF], NOW + 2, NOW + 40, 1)
    assert adopted.epoch == 2
    for stale in (lease, Lease("r1", "w2", 1), Lease("nope", "w1", 1)):
        with pytest.raises(LeaseLost, match="stream 'k'"):
            await store.append_stream(stale, "k", [chunk("lost")], NOW + 3)
    assert [json.loads(e.data) for e in await everything(store)] == ["kept"]
    new = Lease("r1", "w2", adopted.epoch)
    assert await store.append_stream(new, "k", [chunk("next")], NOW + 3) == [1]


async def test_a_finished_run_takes_no_more_appends_but_can_be_read(store: Store) -> None:
    lease = await running(store)
    await store.append_stream(lease, "k", [chunk("a")], NOW)
    await store.finish_run(lease, RunStatus.SUCCEEDED, "null", None, NOW + 1)
    with pytest.raises(LeaseLost):
        await store.append_stream(lease, "k", [chunk("late")], NOW + 2)
    assert [json.loads(e.data) for e in await everything(store)] == ["a"]

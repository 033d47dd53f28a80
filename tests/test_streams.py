"""Streams on every backend, in normal and forced-replay mode: chunks written by steps and by
workflow code, read live and from any offset; a failed or crashed step attempt's chunks
retracted by a reset marker; workflow writes exactly once under replay; payload limits; the
reader following, stopping and being cancelled cleanly."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import tether
from tether.store.port import Lease
from tether.store.port.streams import StreamAppend, StreamKind

MakeApp = Callable[..., tether.App]
FAST = tether.Retry(max_attempts=3, initial_delay=timedelta(milliseconds=1), jitter=0)


async def read_all(app: tether.App, run_id: str, key: str = "out", offset: int = 0) -> list:
    """Everything the reader yields until it stops by itself (the run has ended)."""
    async with asyncio.timeout(20):
        return [entry async for entry in app.read_stream(run_id, key, offset)]


def chunks(entries: list) -> list[object]:
    """What a UI shows: the chunks, with every retracted offset removed."""
    shown: dict[int, object] = {}
    for offset, value in entries:
        if isinstance(value, tether.StreamReset):
            for gone in value.offsets:
                del shown[gone]
        else:
            shown[offset] = value
    return [shown[o] for o in sorted(shown)]


async def test_a_steps_chunks_are_read_in_order_before_and_after_and_readers_stop_at_the_end(
    make_app: MakeApp,
) -> None:
    app = make_app()
    go = asyncio.Event()
    n = 700  # more than two batches of a step's writer

    @app.step()
    async def produce(count: int) -> int:
        await go.wait()
        out = tether.stream("out")
        for i in range(count):
            await out.write({"i": i})
        return count

    @app.workflow()
    async def flow(count: int) -> int:
        return await produce(count)

    async with app:
        handle = await app.start(flow, n, id="produce")
        early = asyncio.create_task(read_all(app, "produce"))
        await asyncio.sleep(0.05)
        assert not early.done()  # following: nothing written yet, the run goes on
        go.set()
        before = await early  # stops by itself once the run has ended
        assert await handle.result(timeout=10) == n
        after = await read_all(app, "produce")
    expected = [(i, {"i": i}) for i in range(n)]
    assert before == expected
    assert after == expected


async def test_reading_from_every_offset_yields_exactly_the_suffix(make_app: MakeApp) -> None:
    app = make_app()
    failed: list[int] = []

    @app.step(retry=FAST)
    async def part(tag: str, count: int) -> None:
        out = tether.stream("out")
        for i in range(count):
            await out.write(f"{tag}{i}")
        if tag == "b" and not failed:
            failed.append(1)
            raise RuntimeError("first attempt of b fails")

    @app.workflow()
    async def flow() -> None:
        await tether.stream("out").write("w0")
        await part("a", 3)
        await tether.stream("out").write({"w": 1})
        await part("b", 4)
        await tether.stream("out").write(["w", 2])

    async with app:
        handle = await app.start(flow, id="suffixes")
        await handle.result(timeout=10)
        whole = await read_all(app, "suffixes")
        assert [o for o, _ in whole] == list(range(len(whole)))
        assert len(whole) == 1 + 3 + 1 + 4 + 1 + 4 + 1  # b's first attempt, its reset, then b
        for k in range(len(whole) + 3):
            assert await read_all(app, "suffixes", offset=k) == whole[k:], k
        async with contextlib.aclosing(app.read_stream("suffixes", "out", follow=False)) as it:
            assert [e async for e in it] == whole
    assert chunks(whole) == ["w0", "a0", "a1", "a2", {"w": 1}, "b0", "b1", "b2", "b3", ["w", 2]]


async def test_a_retried_attempts_chunks_are_retracted_before_the_next_attempts(
    make_app: MakeApp,
) -> None:
    app = make_app()
    attempts: list[int] = []
    seen_by_second: list[object] = []

    @app.step(retry=FAST)
    async def generate() -> str:
        attempts.append(1)
        if len(attempts) == 2:  # the failed attempt was retracted before this one began
            entries = await app.engine.store.read_stream("retried", "out", 0, 100)
            seen_by_second.extend(e.kind.value for e in entries)
        out = tether.stream("out")
        for token in ("Hel", "lo", "!") if len(attempts) == 1 else ("Hi", "!"):
            await out.write(token)
        if len(attempts) == 1:
            raise ConnectionError("the model API dropped the connection")
        return "Hi!"

    @app.workflow()
    async def flow() -> str:
        return await generate()

    async with app:
        handle = await app.start(flow, id="retried")
        assert await handle.result(timeout=10) == "Hi!"
        entries = await read_all(app, "retried")
    assert entries == [
        (0, "Hel"),
        (1, "lo"),
        (2, "!"),
        (3, tether.StreamReset(offsets=(0, 1, 2), step="generate")),
        (4, "Hi"),
        (5, "!"),
    ]
    assert len(attempts) == 2
    assert seen_by_second == ["chunk", "chunk", "chunk", "reset"]


async def test_a_step_that_fails_for_good_leaves_its_chunks_retracted(make_app: MakeApp) -> None:
    app = make_app()

    @app.step(retry=tether.NO_RETRY)
    async def doomed() -> None:
        await tether.stream("out").write("partial")
        await tether.stream("out").write("output")
        raise tether.PermanentError("no")

    @app.workflow()
    async def flow() -> str:
        await tether.stream("out").write("before")
        try:
            await doomed()
        except tether.PermanentError:
            return "handled"
        return "unreachable"

    async with app:
        assert await (await app.start(flow, id="doomed")).result(timeout=10) == "handled"
        entries = await read_all(app, "doomed")
    assert entries == [
        (0, "before"),
        (1, "partial"),
        (2, "output"),
        (3, tether.StreamReset(offsets=(1, 2), step="doomed")),
    ]


async def test_after_a_crash_mid_step_the_rerun_retracts_what_the_dead_attempt_wrote(
    make_app: MakeApp,
) -> None:
    def register(app: tether.App, hang: bool) -> None:
        @app.step()
        async def answer() -> str:
            out = tether.stream("out")
            for token in ("dead", "attempt") if hang else ("live", "one", "!"):
                await out.write(token)
            if hang:
                await asyncio.sleep(3600)  # the worker dies here (its App closes)
            return "done"

        @app.workflow()
        async def flow() -> str:
            await tether.stream("out").write("start")
            return await answer()

    first = make_app()
    register(first, hang=True)
    async with first:
        await first.start("flow", id="crashed")
        store = first.engine.store
        async with asyncio.timeout(10):  # the dead attempt's batch became durable
            while len(await store.read_stream("crashed", "out", 0, 10)) < 3:
                await asyncio.sleep(0.005)
    second = make_app()
    register(second, hang=False)
    async with second:
        assert await (await second.get("crashed")).result(timeout=10) == "done"
        entries = await read_all(second, "crashed")
    assert entries == [
        (0, "start"),
        (1, "dead"),
        (2, "attempt"),
        (3, tether.StreamReset(offsets=(1, 2), step="answer")),
        (4, "live"),
        (5, "one"),
        (6, "!"),
    ]


async def test_workflow_writes_appear_exactly_once_under_replay_and_restarts(
    make_app: MakeApp,
) -> None:
    app = make_app()
    steps: list[int] = []
    store = app.engine.store
    appends: list[int] = []
    append = store.append_stream

    async def counted(*args: Any, **kwargs: Any) -> list[int]:
        appends.append(1)
        return await append(*args, **kwargs)

    store.append_stream = counted  # type: ignore[method-assign]

    @app.step()
    async def work(i: int) -> int:
        steps.append(i)
        return i * 10

    @app.workflow()
    async def flow() -> int:
        out = tether.stream("out")
        await out.write("a")
        x = await work(1)
        await out.write({"after": x})
        await out.write({"after": x})  # the same chunk twice is two entries
        y = await work(2)
        await tether.sleep(timedelta(milliseconds=80))  # suspends: a real restart of the run
        await out.write({"after": y})
        return y

    async with app:
        assert await (await app.start(flow, id="wf-writes")).result(timeout=10) == 20
        entries = await read_all(app, "wf-writes")
        cps = await (await app.get("wf-writes")).checkpoints()
    assert entries == [(0, "a"), (1, {"after": 10}), (2, {"after": 10}), (3, {"after": 20})]
    assert steps == [1, 2]
    assert len(appends) == 4  # replay skips recorded writes: it does not even look them up
    names = [c.name for c in cps if c.kind == "stream"]
    assert names == ["stream:out", "stream:out#2", "stream:out#3", "stream:out#4"]
    assert [c.result for c in cps if c.kind == "stream"] == ["0", "1", "2", "3"]


async def test_a_workflow_write_appended_before_a_crash_is_not_appended_again(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow()
    async def flow() -> str:
        await tether.stream("out").write("once")
        await tether.stream("out").write("then")
        return "ok"

    await app.start(flow, id="half-done")  # no worker yet: the run waits, pending
    store = app.engine.store
    # A worker claimed it, appended the first write and died before recording its checkpoint.
    [claimed] = await store.claim_runs("dead", ["flow"], 1.0, 2.0, 1)
    lease = Lease(claimed.id, "dead", claimed.epoch)
    entry = StreamAppend(StreamKind.CHUNK, '"once"', "stream:out", 0, ref="stream:out")
    assert await store.append_stream(lease, "out", [entry], 1.5) == [0]
    await store.release_worker("dead", 3.0)
    async with app:
        assert await (await app.get("half-done")).result(timeout=10) == "ok"
        entries = await read_all(app, "half-done")
    assert entries == [(0, "once"), (1, "then")]


async def test_a_live_reader_receives_each_chunk_while_the_step_is_still_running(
    make_app: MakeApp,
) -> None:
    app = make_app()
    proceed = [asyncio.Event() for _ in range(3)]

    @app.step()
    async def slow() -> None:
        for i, event in enumerate(proceed):
            await tether.stream("out").write(i)
            await event.wait()

    @app.workflow()
    async def flow() -> None:
        await slow()

    async with app:
        await app.start(flow, id="live")
        reader = app.read_stream("live", "out")
        async with asyncio.timeout(10):
            for i, event in enumerate(proceed):
                assert await anext(reader) == (i, i)  # before the step goes on
                event.set()
            with pytest.raises(StopAsyncIteration):
                await anext(reader)  # the run ended: the reader stops
        await reader.aclose()


async def test_a_reader_at_the_end_when_the_run_ends_still_gets_the_last_entries(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow()
    async def flow() -> str:
        await tether.wait_for_event("go", timeout=timedelta(seconds=30))
        await tether.stream("out").write("late")
        return "ended"

    store = app.engine.store
    read = store.read_stream
    ended: list[str] = []

    async def read_then_end(run_id: str, key: str, offset: int, limit: int) -> list[Any]:
        page = await read(run_id, key, offset, limit)
        if not page and not ended:  # the run writes and ends between this read and the next look
            await app.send("last", "go")
            ended.append(await (await app.get("last")).result(timeout=10))
        return page

    store.read_stream = read_then_end  # type: ignore[method-assign]
    async with app:
        await app.start(flow, id="last")
        entries = await read_all(app, "last")
    assert ended == ["ended"]
    assert entries == [(0, "late")]


async def test_parallel_steps_writing_one_stream_get_distinct_offsets_in_order(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.step()
    async def part(tag: str) -> None:
        out = tether.stream("out")
        for i in range(300):
            await out.write([tag, i])
            if i % 50 == 0:
                await asyncio.sleep(0)

    @app.workflow()
    async def flow() -> None:
        await asyncio.gather(part("a"), part("b"), part("c"))

    async with app:
        await (await app.start(flow, id="parallel")).result(timeout=10)
        entries = await read_all(app, "parallel")
    assert [o for o, _ in entries] == list(range(900))
    for tag in "abc":
        assert [v[1] for _, v in entries if v[0] == tag] == list(range(300))  # type: ignore[index]


async def test_an_oversized_chunk_raises_payload_too_large_and_nothing_is_written(
    make_app: MakeApp,
) -> None:
    app = make_app(max_payload=1000)
    seen: list[str] = []

    @app.step()
    async def step_write() -> None:
        await tether.stream("out").write("small")
        try:
            await tether.stream("out").write("x" * 2000)
        except tether.PayloadTooLarge:
            seen.append("step")

    @app.workflow()
    async def flow() -> None:
        await step_write()
        try:
            await tether.stream("out").write({"big": "y" * 2000})
        except tether.PayloadTooLarge:
            seen.append("workflow")
        await tether.stream("out").write("last")

    async with app:
        await (await app.start(flow, id="too-big")).result(timeout=10)
        entries = await read_all(app, "too-big")
        cps = await (await app.get("too-big")).checkpoints()
    assert entries == [(0, "small"), (1, "last")]
    assert set(seen) == {"step", "workflow"}
    assert [c.name for c in cps if c.kind == "stream"] == ["stream:out"]  # the big one took none


async def test_streams_outside_a_run_bad_keys_and_unknown_runs_are_refused(
    make_app: MakeApp,
) -> None:
    with pytest.raises(tether.NotInWorkflow, match=r"tether\.stream\(\)"):
        tether.stream("out")
    app = make_app()

    @app.step(retry=tether.NO_RETRY)
    def sync_step() -> None:
        tether.stream("out")

    @app.workflow()
    async def flow() -> None:
        await sync_step()

    with pytest.raises(tether.ConfigurationError):
        tether.stream("")
    with pytest.raises(tether.ConfigurationError):
        app.read_stream("r", "k" * 257)
    with pytest.raises(tether.ConfigurationError):
        app.read_stream("r", "out", -1)
    async with app:
        with pytest.raises(tether.RunNotFound):
            await anext(app.read_stream("nobody", "out"))
        handle = await app.start(flow, id="sync-step")
        with pytest.raises(tether.RunFailed, match="async def"):
            await handle.result(timeout=10)


async def test_cancelling_a_following_reader_leaves_no_task_and_no_waiter(
    make_app: MakeApp,
) -> None:
    app = make_app()
    hold = asyncio.Event()

    @app.step()
    async def pause() -> None:
        await tether.stream("out").write("first")
        await hold.wait()

    @app.workflow()
    async def flow() -> None:
        await pause()

    async with app:
        await app.start(flow, id="cancelled-reader")
        before = asyncio.all_tasks()
        got: list[object] = []

        async def follow() -> None:
            async for entry in app.read_stream("cancelled-reader", "out"):
                got.append(entry)

        reader = asyncio.create_task(follow())
        async with asyncio.timeout(10):
            while not got:
                await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)  # waiting at the end of the stream now
        assert app.engine.stream_waiters
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert got == [(0, "first")]
        assert app.engine.stream_waiters == {}
        assert asyncio.all_tasks() <= before | {asyncio.current_task()}
        hold.set()


async def test_a_reader_without_follow_stops_at_the_end_of_a_running_runs_stream(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow()
    async def flow() -> None:
        await tether.stream("out").write(1)
        await tether.stream("out").write(2)
        await tether.wait_for_event("go", timeout=timedelta(seconds=30))

    async with app:
        handle = await app.start(flow, id="no-follow")
        async with asyncio.timeout(10):
            while len(await app.engine.store.read_stream("no-follow", "out", 0, 10)) < 2:
                await asyncio.sleep(0.005)
            entries = [e async for e in app.read_stream("no-follow", "out", follow=False)]
        assert entries == [(0, 1), (1, 2)]
        assert not (await handle.status()).terminal
        await app.send("no-follow", "go")
        await handle.result(timeout=10)


def test_the_blocking_twin_reads_a_stream(tmp_path: object) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/sync.db")

    @app.step()
    async def produce() -> None:
        for i in range(5):
            await tether.stream("out").write(i)

    @app.workflow()
    async def flow() -> None:
        await produce()

    with app.sync as s:
        s.start(flow, id="sync").result(timeout=10)
        assert list(s.read_stream("sync", "out")) == [(i, i) for i in range(5)]
        assert list(s.read_stream("sync", "out", 3)) == [(3, 3), (4, 4)]
        first = s.read_stream("sync", "out")
        assert next(first) == (0, 0)
        first.close()  # stopping early closes the reader on the portal's loop


async def test_a_workflow_write_records_helpers_first_so_a_chunk_never_shows_an_unrecorded_uuid(
    make_app: MakeApp,
) -> None:
    app = make_app()
    seen_at_append: list[list[str]] = []  # the history's names when each chunk is appended
    store = app.engine.store
    real_append = store.append_stream

    async def append(lease: Any, key: str, entries: Any, now: float) -> list[int]:
        history = await store.load_history(lease.run_id)
        seen_at_append.append([c.name for c in history])
        return await real_append(lease, key, entries, now)

    store.append_stream = append  # type: ignore[method-assign]

    @app.workflow()
    async def tagged() -> str:
        token = tether.uuid4()  # a recorded helper, queued until the next write
        await tether.stream("out").write(str(token))
        return str(token)

    async with app:
        token = await (await app.start(tagged, id="tag")).result(timeout=10)
        [[offset, chunk]] = [e async for e in app.read_stream("tag", "out")]
    assert (offset, chunk) == (0, token)
    assert seen_at_append
    assert all("uuid4" in names for names in seen_at_append)

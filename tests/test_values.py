"""Values a run publishes (`tether.set_value`) and callers read (`app.get_value`), on every
backend, in normal and forced-replay mode: the latest version wins, replay writes nothing,
readers wait for a value (woken in-process, or by polling from another App on the same
database) and stop when the run ends, and bad input is refused before anything is written."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

import tether
from tether.errors import ValueNotFound
from tether.store.port import Checkpoint, CheckpointStatus, Lease, NewRun, Store

MakeApp = Callable[..., tether.App]


async def test_the_latest_value_wins_and_every_set_is_a_version(make_app: MakeApp) -> None:
    app = make_app()
    done: list[int] = []

    @app.step()
    async def work(i: int) -> int:
        done.append(i)
        return i * 10

    @app.workflow()
    async def flow(n: int) -> str:
        for i in range(1, n + 1):
            await tether.set_value("progress", {"done": i, "of": n})
            await work(i)
        await tether.set_value("summary", "all done")
        return "ok"

    async with app:
        handle = await app.start(flow, 3, id="v1")
        assert await handle.result(timeout=20) == "ok"
        assert await app.get_value("v1", "progress") == {"done": 3, "of": 3}
        assert await app.get_value("v1", "summary") == "all done"
        listed = await app.list_values("v1")
        history = await handle.checkpoints()
    assert [(v.key, v.value, v.version) for v in listed] == [
        ("progress", {"done": 3, "of": 3}, 3),
        ("summary", "all done", 1),
    ]
    assert all(v.set_at.tzinfo is not None for v in listed)
    assert sorted(done) == [1, 2, 3]  # forced replay re-runs no step body
    assert [c.name for c in history if c.kind == "value"] == [
        "value:progress", "value:progress#2", "value:progress#3", "value:summary",
    ]  # fmt: skip
    assert all(c.status is CheckpointStatus.COMPLETED for c in history if c.kind == "value")


async def test_replay_after_a_suspension_writes_no_second_version(make_app: MakeApp) -> None:
    app = make_app()

    @app.workflow()
    async def flow() -> int:
        await tether.set_value("stage", "before")
        # Longer than the held wait (50 ms in tests): the run is released, then replayed.
        await tether.sleep(timedelta(milliseconds=200))
        await tether.set_value("stage", "after")
        return 1

    async with app:
        handle = await app.start(flow, id="v-replay")
        assert await handle.result(timeout=20) == 1
        listed = await app.list_values("v-replay")
    assert [(v.key, v.value, v.version) for v in listed] == [("stage", "after", 2)]


async def test_values_keep_their_json_types(make_app: MakeApp) -> None:
    app = make_app()
    moment = datetime(2024, 5, 1, 12, 30, tzinfo=UTC)

    @app.workflow()
    async def flow() -> None:
        await tether.set_value("when", moment)
        await tether.set_value("raw", b"\x00\x01")
        await tether.set_value("nothing", None)

    async with app:
        await (await app.start(flow, id="v-types")).result(timeout=20)
        assert await app.get_value("v-types", "when") == moment
        assert await app.get_value("v-types", "raw") == b"\x00\x01"
        assert await app.get_value("v-types", "nothing", default="absent") is None


async def test_a_waiting_reader_gets_the_value_once_the_run_sets_it(make_app: MakeApp) -> None:
    app = make_app()

    @app.workflow()
    async def flow() -> str:
        await tether.set_value("ready", False)
        answer = await tether.wait_for_event("go")
        await tether.set_value("answer", answer)
        return "done"

    async with app:
        handle = await app.start(flow, id="v-wait")
        # The first version is set; the reader waits for a newer one.
        assert await app.get_value("v-wait", "ready", wait=20) is False
        reader = asyncio.create_task(app.get_value("v-wait", "answer", wait=30))
        await asyncio.sleep(0.1)
        assert not reader.done()  # not set yet: it waits
        await app.send("v-wait", "go", 42)
        async with asyncio.timeout(20):
            assert await reader == 42
        assert await handle.result(timeout=20) == "done"


async def test_after_version_waits_for_a_newer_value(make_app: MakeApp) -> None:
    app = make_app()

    @app.workflow()
    async def flow() -> None:
        await tether.set_value("n", 1)
        await tether.wait_for_event("go")
        await tether.set_value("n", 2)

    async with app:
        handle = await app.start(flow, id="v-after")
        assert await app.get_value("v-after", "n", wait=20) == 1
        newer = asyncio.create_task(app.get_value("v-after", "n", wait=30, after_version=1))
        await asyncio.sleep(0.1)
        assert not newer.done()
        await app.send("v-after", "go")
        async with asyncio.timeout(20):
            assert await newer == 2
        await handle.result(timeout=20)
        with pytest.raises(ValueNotFound, match="newer than version 2"):
            await app.get_value("v-after", "n", after_version=2)


async def test_watching_a_value_yields_each_new_version_until_the_run_ends(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow()
    async def flow(n: int) -> None:
        for i in range(n):
            await tether.wait_for_event("tick")
            await tether.set_value("progress", i + 1)

    async with app:
        await app.start(flow, 3, id="v-watch")
        seen: list[tuple[int, object]] = []

        async def watch() -> None:
            async with contextlib.aclosing(app.watch_value("v-watch", "progress")) as updates:
                async for info in updates:
                    seen.append((info.version, info.value))
                    if info.version < 3:
                        await app.send("v-watch", "tick")

        await app.send("v-watch", "tick")
        async with asyncio.timeout(30):
            await watch()  # returns by itself once the run has ended
    assert seen == [(1, 1), (2, 2), (3, 3)]


async def test_a_reader_stops_waiting_when_the_run_ends_without_the_value(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow()
    async def flow() -> str:
        await tether.wait_for_event("go")
        return "never set it"

    async with app:
        handle = await app.start(flow, id="v-never")
        reader = asyncio.create_task(app.get_value("v-never", "x", wait=3600))
        fallback = asyncio.create_task(app.get_value("v-never", "x", wait=3600, default="fb"))
        await asyncio.sleep(0.1)
        await app.send("v-never", "go")
        async with asyncio.timeout(20):  # far below the hour it would wait otherwise
            with pytest.raises(ValueNotFound, match=r"ended \(succeeded\) without setting"):
                await reader
            assert await fallback == "fb"
        await handle.result(timeout=5)


async def test_missing_values_and_runs_are_reported_clearly(make_app: MakeApp) -> None:
    app = make_app()

    @app.workflow()
    async def flow() -> None:
        await tether.wait_for_event("go")

    async with app:
        await app.start(flow, id="v-missing")
        with pytest.raises(ValueNotFound, match="has not set value 'x' yet") as caught:
            await app.get_value("v-missing", "x")
        assert isinstance(caught.value, LookupError)
        with pytest.raises(ValueNotFound, match=r"did not set value 'x' within 0.1s"):
            await app.get_value("v-missing", "x", wait=timedelta(milliseconds=100))
        assert await app.get_value("v-missing", "x", default=None) is None
        with pytest.raises(tether.RunNotFound, match="no-such-run"):
            await app.get_value("no-such-run", "x", default=None)
        with pytest.raises(tether.RunNotFound):
            await app.list_values("no-such-run")
        assert await app.list_values("v-missing") == []
        with pytest.raises(tether.ConfigurationError, match="wait= takes seconds"):
            await app.get_value("v-missing", "x", wait=-1)
        with pytest.raises(tether.ConfigurationError, match="after_version"):
            await app.get_value("v-missing", "x", after_version=-1)
        with pytest.raises(tether.ConfigurationError, match="without '#'"):
            await app.get_value("v-missing", "a#2")
        await app.send("v-missing", "go")


async def test_set_value_outside_a_workflow_or_in_a_step_raises_not_in_workflow(
    make_app: MakeApp,
) -> None:
    app = make_app()
    with pytest.raises(tether.NotInWorkflow, match="set_value"):
        await tether.set_value("k", 1)

    @app.step(retry=tether.NO_RETRY)
    async def inner() -> None:
        await tether.set_value("k", 1)

    @app.workflow()
    async def flow() -> None:
        await inner()

    async with app:
        with pytest.raises(tether.RunFailed, match="NotInWorkflow"):
            await (await app.start(flow, id="v-step")).result(timeout=20)
        assert await app.list_values("v-step") == []


async def test_bad_keys_and_oversized_values_fail_the_call_before_any_write(
    make_app: MakeApp,
) -> None:
    app = make_app(max_payload=1000)
    caught: list[str] = []

    @app.workflow()
    async def flow() -> str:
        for key, value in (("", 1), ("a#2", 1), ("x" * 201, 1), ("big", "y" * 5000)):
            try:
                await tether.set_value(key, value)
            except (tether.ConfigurationError, tether.PayloadTooLarge) as exc:
                caught.append(type(exc).__name__)
        await tether.set_value("ok", 1)
        return "ok"

    async with app:
        handle = await app.start(flow, id="v-bad")
        assert await handle.result(timeout=20) == "ok"
        assert [v.key for v in await app.list_values("v-bad")] == ["ok"]
        assert [c.name for c in await handle.checkpoints()] == ["value:ok"]
    assert set(caught) == {"ConfigurationError", "PayloadTooLarge"}


async def test_a_reader_in_another_app_sees_the_value_by_polling_the_store(
    make_app: MakeApp,
) -> None:
    writer, reader = make_app(), make_app()  # two Apps, one database, no shared engine

    @writer.workflow()
    async def flow() -> None:
        await tether.wait_for_event("go")
        await tether.set_value("result", "from the other app")

    async with writer:
        await writer.start(flow, id="v-remote")
        waiting = asyncio.create_task(reader.get_value("v-remote", "result", wait=30))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        await writer.send("v-remote", "go")
        async with asyncio.timeout(20):
            assert await waiting == "from the other app"


# -- the store operations, on every backend ----------------------------------------------------


async def claimed(store: Store, run_id: str) -> Lease:
    now = 1000.0
    await store.create_run(NewRun(run_id, "wf", "[]"), now)
    (record,) = await store.claim_runs("w1", ["wf"], now, now + 60, 1)
    return Lease(record.id, "w1", record.epoch)


def value_checkpoint(seq: int, name: str) -> Checkpoint:
    return Checkpoint(seq, name, "value", CheckpointStatus.COMPLETED, attempts=1)


async def test_set_value_writes_the_version_and_its_checkpoint_together_or_not_at_all(
    make_store: Callable[[], Store],
) -> None:
    store = make_store()
    await store.open()
    try:
        lease = await claimed(store, "s1")
        assert await store.set_value(lease, "k", '"a"', value_checkpoint(0, "value:k"), 1.0) == 1
        assert await store.set_value(lease, "k", '"b"', value_checkpoint(1, "value:k#2"), 2.0) == 2
        assert await store.set_value(lease, "j", "7", value_checkpoint(2, "value:j"), 3.0) == 1
        latest = await store.get_value("s1", "k")
        assert latest is not None
        assert (latest.value, latest.version, latest.seq, latest.created_at) == ('"b"', 2, 1, 2.0)
        assert [(v.key, v.version) for v in await store.list_values("s1")] == [("j", 1), ("k", 2)]
        history = await store.load_history("s1")
        assert [(c.name, c.result) for c in history] == [
            ("value:k", '{"key": "k", "version": 1}'),
            ("value:k#2", '{"key": "k", "version": 2}'),
            ("value:j", '{"key": "j", "version": 1}'),
        ]
        stale = Lease("s1", "w1", lease.epoch + 1)
        with pytest.raises(tether.LeaseLost, match="value 'k' was not stored"):
            await store.set_value(stale, "k", '"c"', value_checkpoint(3, "value:k#3"), 4.0)
        assert (await store.get_value("s1", "k")).version == 2  # type: ignore[union-attr]
        assert len(await store.load_history("s1")) == 3
        assert await store.get_value("s1", "nothing") is None
        assert await store.get_value("no-run", "k") is None
    finally:
        await store.close()

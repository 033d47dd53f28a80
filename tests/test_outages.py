"""Writes whose acknowledgement was lost: the commit happened but the caller saw an error. The
engine resolves them by reading back, never by writing twice (on every backend)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import tether
from tether.errors import StoreUnavailable

MakeApp = Callable[..., tether.App]


def lose_first_ack(store: object, method: str, lost: Counter[str]) -> None:
    """Make the store's `method` commit, then report the database unreachable, once (for
    take_event: once it really took an event)."""
    real: Callable[..., Awaitable[Any]] = getattr(store, method)

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        result = await real(*args, **kwargs)
        if not lost[method] and (method != "take_event" or result is not None):
            lost[method] += 1
            raise StoreUnavailable("connection lost after COMMIT (simulated)")
        return result

    setattr(store, method, flaky)


async def test_an_event_taken_before_the_ack_was_lost_is_not_taken_twice(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow()
    async def two() -> list[object]:
        return [await tether.wait_for_event("go"), await tether.wait_for_event("go")]

    lost: Counter[str] = Counter()
    lose_first_ack(app.engine.store, "take_event", lost)
    async with app:
        handle = await app.start(two, id="ack")
        await app.send("ack", "go", "first")
        await app.send("ack", "go", "second")
        # Had the retry taken again, the first wait would have got "second" and the second
        # wait nothing: reading back keeps one event per wait.
        assert await handle.result(timeout=30) == ["first", "second"]
        assert lost["take_event"] == 1


async def test_a_checkpoint_whose_ack_was_lost_is_read_back_and_the_step_not_rerun(
    make_app: MakeApp,
) -> None:
    app = make_app()
    bodies: Counter[str] = Counter()

    @app.step()
    async def charge(amount: int) -> str:
        bodies["charge"] += 1
        return f"charged {amount}"

    @app.workflow()
    async def pay() -> str:
        return await charge(5)

    lost: Counter[str] = Counter()
    lose_first_ack(app.engine.store, "write_checkpoint", lost)
    async with app:
        assert await (await app.start(pay)).result(timeout=30) == "charged 5"
    assert lost["write_checkpoint"] == 1
    assert bodies["charge"] == 1


async def test_a_finish_whose_ack_was_lost_leaves_the_run_finished_once(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow()
    async def quick() -> int:
        return 7

    lost: Counter[str] = Counter()
    lose_first_ack(app.engine.store, "finish_run", lost)
    async with app:
        assert await (await app.start(quick)).result(timeout=30) == 7
    assert lost["finish_run"] == 1


@pytest.mark.parametrize("method", ["write_checkpoint", "finish_run"])
async def test_an_outage_longer_than_the_budget_stops_the_run_here_for_later(
    make_app: MakeApp, method: str
) -> None:
    app = make_app()
    app.engine.settings = dataclasses.replace(app.engine.settings, store_outage=0.2)
    store = app.engine.store

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("the database is down (simulated)")

    @app.step()
    async def work() -> int:
        return 1

    @app.workflow()
    async def flow() -> int:
        return await work()

    async with app:
        real = getattr(store, method)
        setattr(store, method, down)
        handle = await app.start(flow, id="outage")
        worker = app.engine.worker
        assert worker is not None
        for _ in range(200):  # the runner gives up after the budget and lets the run go
            if "outage" not in worker.runners:
                break
            await asyncio.sleep(0.01)
        assert "outage" not in worker.runners
        assert not (await handle.status()).terminal  # not failed: resumed once it is back
        setattr(store, method, real)

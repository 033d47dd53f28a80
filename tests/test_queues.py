"""Queues on every backend: concurrency limits, priorities, dedup keys, rate limits, and workers
that serve only some queues."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta

import psycopg
import pytest
from tests.contract.test_approval_contract import approval as pending
from tests.postgres_server import with_schema

import tether
from tether.store.port import Lease, NewRun, RunStatus
from tether.store.postgres import CHANNEL, PostgresStore, parse_postgres_url

MakeApp = Callable[..., tether.App]


async def test_a_queue_runs_at_most_its_concurrency_at_once(make_app: MakeApp) -> None:
    app = make_app()
    app.queue("renders", concurrency=2)
    running = 0
    most = 0

    @app.step()
    async def render(i: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)
        running -= 1
        return i

    @app.workflow(queue="renders")
    async def job(i: int) -> int:
        return await render(i)

    async with app:
        handles = [await app.start(job, i) for i in range(6)]
        assert [await h.result(timeout=30) for h in handles] == list(range(6))
    assert most == 2


async def test_higher_priority_runs_of_a_queue_start_first(make_app: MakeApp) -> None:
    app = make_app()
    app.queue("serial", concurrency=1)
    order: list[str] = []

    @app.workflow(queue="serial")
    async def job(name: str) -> None:
        order.append(name)

    # Created before any worker runs, so the claim sees them all at once.
    for name, priority in (("low", 0), ("urgent", 9), ("normal", 5)):
        await app.start(job, name, id=name, priority=priority)
    async with app:
        for name in ("low", "urgent", "normal"):
            await (await app.get(name)).result(timeout=30)
    assert order == ["urgent", "normal", "low"]


async def test_a_dedup_key_admits_one_unfinished_run_until_it_ends(make_app: MakeApp) -> None:
    app = make_app()

    @app.workflow(queue="mail")
    async def send(user: str) -> str:
        await tether.wait_for_event("go")
        return user

    async with app:
        first = await app.start(send, "ada", dedup_key="ada")
        with pytest.raises(tether.DuplicateRun, match="ada") as info:
            await app.start(send, "ada", dedup_key="ada")
        assert info.value.run_id == first.id
        await app.send(first.id, "go")
        assert await first.result(timeout=30) == "ada"
        again = await app.start(send, "ada", dedup_key="ada")  # the first one ended
        await app.send(again.id, "go")
        assert await again.result(timeout=30) == "ada"


async def test_a_worker_serves_only_its_queues(make_app: MakeApp) -> None:
    app = make_app()
    app.engine.settings = dataclasses.replace(app.engine.settings, queues=("fast",))

    @app.workflow(queue="fast")
    async def quick() -> str:
        return "fast"

    @app.workflow(queue="slow")
    async def later() -> str:
        return "slow"

    async with app:
        fast = await app.start(quick)
        slow = await app.start(later)
        assert await fast.result(timeout=30) == "fast"
        await asyncio.sleep(0.2)  # a claim loop turn or two: the slow queue is not served here
        assert await slow.status() is RunStatus.PENDING


async def test_a_rate_limit_spaces_the_starts_of_a_queue(make_app: MakeApp) -> None:
    app = make_app()
    app.queue("api", rate=tether.Rate(2, per=timedelta(seconds=0.5)))

    @app.workflow(queue="api")
    async def call(i: int) -> int:
        return i

    async with app:
        handles = [await app.start(call, i) for i in range(4)]
        for handle in handles:
            await handle.result(timeout=30)
        records = [await app.engine.store.get_run(h.id) for h in handles]
    started = sorted(r.started_at for r in records if r is not None and r.started_at)
    assert len(started) == 4
    # Two starts per half second: the third waits for the first one's window to pass.
    assert started[2] - started[0] >= 0.45


def test_bad_queue_limits_are_refused_with_what_to_fix() -> None:
    app = tether.App("memory://")
    with pytest.raises(tether.ConfigurationError, match="concurrency must be an int >= 1"):
        app.queue("q", concurrency=0)
    with pytest.raises(tether.ConfigurationError, match="count >= 1"):
        tether.Rate(0)

    @app.workflow()
    async def anything() -> None:
        return None

    with pytest.raises(tether.ConfigurationError, match="priority must be an int"):
        asyncio.run(app.start(anything, priority="high"))  # type: ignore[arg-type]


async def test_on_postgresql_the_end_of_a_queued_run_wakes_other_workers_and_no_other_end_does(
    postgres_url: str,
) -> None:
    """A run's end frees budget only in a queue: it is the only end that sends a wake-up to
    other processes' workers, whether it ends in one statement or with its pending approvals
    cancelled in a transaction. The listener is another process's, as a raw connection."""
    url = with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}")
    store = PostgresStore(url)
    await store.open()
    conninfo, _ = parse_postgres_url(url)
    listener = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    await listener.execute(f"LISTEN {CHANNEL}")

    async def woken(ends: Callable[[], Awaitable[object]]) -> int:
        async for _ in listener.notifies(timeout=0.3):
            pass  # the wake-ups of the run's creation, before its end
        await ends()
        return len([n async for n in listener.notifies(timeout=0.3, stop_after=1)])

    async def ended(run_id: str, queue: str | None, *, approval: bool = False) -> int:
        now = 1000.0
        run = NewRun(run_id, "wf", '{"args": [], "kwargs": {}}', queue=queue)
        await store.create_run(run, now, owner="w1", lease_until=now + 30)
        lease = Lease(run_id, "w1", 1)
        if approval:
            await store.create_approval(lease, pending(f"a-{run_id}", run_id), now + 1)
        return await woken(lambda: store.finish_run(lease, RunStatus.SUCCEEDED, "1", None,
                                                    now + 2))  # fmt: skip

    try:
        assert await ended("plain", None) == 0
        assert await ended("queued", "renders") == 1
        assert await ended("queued-approval", "renders", approval=True) == 1
        assert await ended("plain-approval", None, approval=True) == 0
        for approval_id in ("a-queued-approval", "a-plain-approval"):
            record = await store.get_approval(approval_id)
            assert record is not None
            assert record.status == "cancelled"  # the full end ran
    finally:
        await listener.close()
        await store.close()

"""Losing the database mid-run: a PostgreSQL restart, or the backend connections killed in the
middle of the work. The worker reconnects and goes on; no step runs twice, no checkpoint is
written twice, no run hangs."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
from tests.postgres_server import LocalPostgres

import tether
from tether.store.port import RunStatus

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("TETHER_TEST_POSTGRES_URL")),
    reason="restarts its own server: needs the local PostgreSQL binaries, not a shared server",
)


@pytest.fixture
def server() -> Iterator[LocalPostgres]:
    try:
        pg = LocalPostgres()
    except FileNotFoundError:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("NO POSTGRESQL server binaries in CI")
        pytest.skip("NO POSTGRESQL server binaries (initdb, pg_ctl): skipped")
    pg.start()
    try:
        yield pg
    finally:
        pg.remove()


def build(url: str, bodies: Counter[str], reached: asyncio.Event) -> tether.App:
    app = tether.App(url)

    @app.step()
    async def work(i: int) -> int:
        bodies[f"work#{i}"] += 1
        if i == 3:
            reached.set()
        await asyncio.sleep(0.15)
        return i

    @app.workflow()
    async def ten() -> int:
        total = 0
        for i in range(10):
            total += await work(i)
        return total

    return app


async def checkpoints_are_unique(app: tether.App, run_id: str) -> list[str]:
    names = [c.name for c in await (await app.get(run_id)).checkpoints()]
    assert len(names) == len(set(names))
    return names


async def test_a_postgres_restart_mid_run_loses_no_step_and_repeats_none(
    server: LocalPostgres,
) -> None:
    bodies: Counter[str] = Counter()
    reached = asyncio.Event()
    app = build(server.url, bodies, reached)
    async with app:
        handle = await app.start("ten", id="through-restart")
        await asyncio.wait_for(reached.wait(), 30)
        # A fast restart disconnects every client while step 3 is in flight.
        await asyncio.to_thread(server.stop, "fast")
        await asyncio.to_thread(server.start)
        assert await handle.result(timeout=60) == sum(range(10))
        names = await checkpoints_are_unique(app, "through-restart")
    assert names == ["work"] + [f"work#{i}" for i in range(2, 11)]
    assert all(count == 1 for count in bodies.values()), bodies
    assert len(bodies) == 10


async def test_killed_backend_connections_are_replaced_and_the_run_goes_on(
    server: LocalPostgres,
) -> None:
    bodies: Counter[str] = Counter()
    reached = asyncio.Event()
    app = build(server.url, bodies, reached)
    killed: list[int] = []

    def kill_backends() -> None:
        with psycopg.connect(server.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND datname = current_database()"
            ).fetchall()
            killed.append(len(rows))

    async with app:
        handle = await app.start("ten", id="killed-conns")
        await asyncio.wait_for(reached.wait(), 30)
        await asyncio.to_thread(kill_backends)
        assert await handle.result(timeout=60) == sum(range(10))
        await checkpoints_are_unique(app, "killed-conns")
        assert await (await app.get("killed-conns")).status() is RunStatus.SUCCEEDED
    assert killed[0] >= 2  # the pool's connections and the listener were cut
    assert all(count == 1 for count in bodies.values()), bodies
    assert len(bodies) == 10

"""A full disk in the middle of a run, on a real SQLite file: SQLite's `max_page_count` (a
setting of each connection, so it is set on every connection of the store) is lowered to the
database's current size while a step runs; its checkpoint cannot be written. The run must see a
clear error and keep trying, callers starting runs or sending events must be told plainly, and
once the limit is raised again the run must finish without re-running any step whose
checkpoint was acknowledged, on a database that passes `PRAGMA integrity_check`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.faults import figures

import tether
from tether.errors import StoreUnavailable
from tether.store.port import CheckpointStatus, RunStatus
from tether.store.sqlite import SqliteStore

pytestmark = pytest.mark.timeout(60)

RESULT = 30_000  # characters of each step's result: several pages, so a full file refuses it
UNLIMITED = 1_073_741_823  # SQLite's default max_page_count


def queue_of(app: tether.App) -> Any:
    store = app.engine.store
    assert isinstance(store, SqliteStore)
    return store.driver.queue


def set_max_pages(app: tether.App, pages: int | None) -> int:
    """Limit the database to `pages` pages (None: to its size now) on every connection of the
    store; returns the limit set."""
    queue = queue_of(app)
    if pages is None:
        inline = queue._inline
        pages = inline.execute("PRAGMA page_count").fetchone()[0]
    queue.apply_pragma(f"max_page_count = {pages}")
    return pages


def failures_of(app: tether.App, method: str, seen: list[Exception]) -> None:
    """Note every exception the store's `method` raises (what its caller sees)."""
    store = app.engine.store
    real: Callable[..., Awaitable[Any]] = getattr(store, method)

    async def spy(*args: Any, **kwargs: Any) -> Any:
        try:
            return await real(*args, **kwargs)
        except Exception as exc:
            seen.append(exc)
            raise

    setattr(store, method, spy)


async def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def assert_clear(exc: BaseException) -> None:
    """A full database is named as such, with what to do; never a raw driver error."""
    assert isinstance(exc, StoreUnavailable), f"{type(exc).__name__}: {exc}"
    text = str(exc).lower()
    assert "is full" in text, text
    assert "free disk space" in text, text  # and says what to do


class Pipeline:
    """An App on a SQLite file whose workflow `pipeline(n)` runs steps two at a time (their
    checkpoints share one commit), each returning RESULT characters; the body of step 2 fills
    the database, once."""

    def __init__(self, db: Path, **options: Any) -> None:
        self.app = app = tether.App(f"sqlite:///{db}", **options)
        self.bodies: Counter[int] = Counter()
        self.filled = asyncio.Event()
        self.refused: list[Exception] = []
        failures_of(app, "write_checkpoint", self.refused)

        @app.step()
        async def produce(i: int) -> str:
            self.bodies[i] += 1
            if i == 2 and not self.filled.is_set():
                set_max_pages(app, None)  # the disk fills up while this step runs
                self.filled.set()
            return f"{i}:" + secrets.token_hex(RESULT // 2)

        @app.workflow()
        async def pipeline(n: int) -> list[int]:
            sizes = []
            for i in range(0, n, 2):
                pair = await asyncio.gather(produce(i), produce(i + 1))
                sizes += [len(r) for r in pair]
            return sizes

        @app.workflow()
        async def ingest(data: str) -> int:
            return len(data)

        self.pipeline, self.ingest = pipeline, ingest


def integrity(db: Path) -> list[tuple[str]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute("PRAGMA integrity_check").fetchall()


async def test_a_full_database_is_a_clear_error_and_the_run_resumes_when_space_returns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "tether.db"
    flow = Pipeline(db)
    app, bodies, refused = flow.app, flow.bodies, flow.refused
    caplog.set_level(logging.WARNING, logger="tether.runner")
    async with app:
        handle = await app.start(flow.pipeline, 6, id="full-run")
        await wait_for(lambda: len(refused) >= 2)  # both checkpoints of the pair, at least once
        # The run keeps trying; it neither failed nor moved on.
        run = await app.engine.store.get_run("full-run")
        assert run is not None
        assert run.status is RunStatus.RUNNING
        for exc in refused:
            assert_clear(exc)
        # A caller starting a run or sending an event is told plainly too.
        with pytest.raises(StoreUnavailable) as started:
            await app.start(flow.ingest, "x" * 20_000, id="big-start")
        assert_clear(started.value)
        with pytest.raises(StoreUnavailable) as sent:
            await app.send("full-run", "note", "y" * 20_000)
        assert_clear(sent.value)
        await asyncio.sleep(0.5)  # a few more retries while the disk is full
        tries_while_full = len(refused)

        set_max_pages(app, UNLIMITED)  # space returns
        returned = time.monotonic()
        with contextlib.suppress(tether.RunFailed):
            await handle.result(timeout=30)
        resumed_ms = (time.monotonic() - returned) * 1000
        final = await app.engine.store.get_run("full-run")
        history = await app.engine.store.load_history("full-run")
    checked = integrity(db)

    assert final is not None
    figures.record("disk full: checkpoint writes refused while full", tries_while_full)
    figures.record("disk full: steps re-executed after their checkpoint was acknowledged",
                   sum(bodies.values()) - len(bodies))  # fmt: skip
    figures.record("disk full: runs failed by the full disk",
                   final.status is not RunStatus.SUCCEEDED)  # fmt: skip
    figures.record("disk full: integrity_check failures", checked != [("ok",)])
    figures.record("disk full: ms from space returning to the run's end", resumed_ms)
    assert final.status is RunStatus.SUCCEEDED, final.error
    assert final.result == f"[{', '.join([str(RESULT + 2)] * 6)}]".replace(" ", "")
    assert final.epoch == 1  # the same execution went on: nobody had to adopt the run
    # Each step body ran once: the refused checkpoints were written again, not the steps.
    assert dict(bodies) == dict.fromkeys(range(6), 1)
    assert [c.status for c in history] == [CheckpointStatus.COMPLETED] * 6
    assert any("is full" in r.getMessage() for r in caplog.records)  # the retries were logged
    assert checked == [("ok",)]
    with contextlib.closing(sqlite3.connect(db)) as conn:  # the refused start left no run
        assert conn.execute("SELECT id FROM tether_runs").fetchall() == [("full-run",)]


async def test_a_full_database_that_outlasts_the_outage_limit_is_resumed_by_a_later_claim(
    tmp_path: Path,
) -> None:
    """The run gives up its writes after `store_outage`; its lease runs out and the worker
    claims it again once there is room. Steps acknowledged before do not run again; the two
    whose checkpoints were refused do (at least once is the promise for an unrecorded step)."""
    db = tmp_path / "tether.db"
    flow = Pipeline(db, lease_duration=timedelta(seconds=1))
    app = flow.app
    app.engine.settings = dataclasses.replace(
        app.engine.settings, store_outage=0.3, poll_interval=0.05
    )
    async with app:
        handle = await app.start(flow.pipeline, 6, id="long-full")
        await wait_for(flow.filled.is_set)
        await asyncio.sleep(1.0)  # past the outage limit: this execution gave the run up
        assert flow.bodies[4] == 0  # it did not go on without its checkpoints
        set_max_pages(app, UNLIMITED)
        await handle.result(timeout=30)
        final = await app.engine.store.get_run("long-full")
    acknowledged_again = sum(flow.bodies[i] - 1 for i in (0, 1, 4, 5))
    figures.record("disk full: steps re-executed after their checkpoint was acknowledged",
                   acknowledged_again)  # fmt: skip
    assert final is not None
    assert final.status is RunStatus.SUCCEEDED
    assert final.epoch == 2  # claimed again after the lease ran out
    assert dict(flow.bodies) == {0: 1, 1: 1, 2: 2, 3: 2, 4: 1, 5: 1}
    assert integrity(db) == [("ok",)]

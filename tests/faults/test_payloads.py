"""Payload sizes at the edges, for the four kinds of payload Tether stores: step results,
workflow arguments, event payloads and approval contexts, on a real SQLite file with the default
limit (10 MiB of JSON).

0 B (the empty string) and limit - 1 bytes of JSON are stored and read back intact. Limit + 1
and 200 MB are refused with PayloadTooLarge before any write: the database holds no new row for
them (and no text of their size anywhere), the caller of `app.start` / `app.send` gets the error,
and a step result or approval context over the limit fails its run with it. Refusing 200 MB
must not copy it: the peak of Python allocations while refusing (tracemalloc) stays under
HUGE_BOUND, a twentieth of the payload, where encoding it first would take one to four times it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sqlite3
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.faults import figures

import tether
from tether.serde import DEFAULT_MAX_PAYLOAD
from tether.store.port import RunStatus

pytestmark = pytest.mark.timeout(120)

LIMIT = DEFAULT_MAX_PAYLOAD
HUGE = 200_000_000  # characters (or bytes) of the largest payload
HUGE_BOUND = HUGE // 20  # bytes a refusal of HUGE may allocate at its peak
WORDS = "the quick brown fox jumps over a lazy dog "  # plain text: nothing to escape or redact


def text(json_bytes: int, overhead: int = 2) -> str:
    """A str whose JSON (with `overhead` bytes around it: the quotes) is exactly json_bytes."""
    n = json_bytes - overhead
    return (WORDS * (n // len(WORDS) + 1))[:n]


def digest(value: str | bytes) -> str:
    data = value.encode() if isinstance(value, str) else value
    return f"{len(data)}:{hashlib.sha256(data).hexdigest()}"


@contextlib.contextmanager
def peak_allocation() -> Iterator[list[int]]:
    """The peak of Python allocations made inside the block, in bytes (tracemalloc)."""
    peak: list[int] = []
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield peak
    finally:
        peak.append(tracemalloc.get_traced_memory()[1] - base)
        tracemalloc.stop()


class Database:
    """The SQLite file, read beside the library."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)) as conn:
            return conn.execute(sql, args).fetchall()

    def rows(self) -> Counter[str]:
        tables = [t for (t,) in self.query("SELECT name FROM sqlite_master WHERE type='table'")]
        return Counter({t: self.query(f'SELECT count(*) FROM "{t}"')[0][0] for t in tables})

    def longest_text(self) -> int:
        """The longest text or blob value anywhere in the database."""
        longest = 0
        for (table,) in self.query("SELECT name FROM sqlite_master WHERE type='table'"):
            for column in self.query(f'SELECT name FROM pragma_table_info("{table}")'):
                found = self.query(f'SELECT max(length("{column[0]}")) FROM "{table}"')[0][0]
                longest = max(longest, found or 0)
        return longest


@contextlib.asynccontextmanager
async def app_on(tmp_path: Path) -> AsyncIterator[tuple[tether.App, Database]]:
    app = tether.App(f"sqlite:///{tmp_path / 'tether.db'}")
    try:
        yield app, Database(tmp_path / "tether.db")
    finally:
        await app.close()


def refused_record(kind: str, label: str, longest_before: int, db: Database) -> None:
    """Whether a refused payload reached the database: a value longer than any before."""
    longest = db.longest_text()
    figures.record("payloads: refused payloads found in the database (must be 0)",
                   longest > longest_before)  # fmt: skip
    assert longest == longest_before, f"{kind} {label}: a value of {longest} bytes was stored"


async def test_step_results_at_the_edges(tmp_path: Path) -> None:
    huge_str, huge_bytes = "x" * HUGE, b"x" * HUGE
    values: dict[str, str | bytes] = {
        "0 B": "",
        "limit - 1": text(LIMIT - 1),
        "limit + 1": text(LIMIT + 1),
        "200 MB": huge_str,
        "200 MB of bytes": huge_bytes,
    }
    bodies: Counter[str] = Counter()
    async with app_on(tmp_path) as (app, db):

        @app.step()
        async def produce(label: str) -> Any:
            bodies[label] += 1
            return values[label]

        @app.workflow()
        async def flow(label: str) -> str:
            value = await produce(label)
            return digest(value)

        async with app:
            for label, size in (("0 B", 2), ("limit - 1", LIMIT - 1)):
                handle = await app.start(flow, label, id=f"step {label}")
                assert await handle.result(timeout=30) == digest(values[label])
                (checkpoint,) = await app.engine.store.load_history(handle.id)
                assert len((checkpoint.result or "").encode()) == size  # '""' for 0 B
                assert app.engine.serde.loads(checkpoint.result or "") == values[label]
            longest = db.longest_text()
            for label in ("limit + 1", "200 MB", "200 MB of bytes"):
                before = db.rows()
                with peak_allocation() as peak:
                    handle = await app.start(flow, label, id=f"step {label}")
                    with pytest.raises(tether.RunFailed, match="PayloadTooLarge") as failed:
                        await handle.result(timeout=30)
                assert failed.value.error["type"] == "tether.errors.PayloadTooLarge"
                (checkpoint,) = await app.engine.store.load_history(handle.id)
                assert checkpoint.result is None  # the failure is recorded, never the value
                assert checkpoint.attempts == 1  # refused for good: not retried
                assert bodies[label] == 1
                # Only the run's own rows: the run and its failed step's record.
                assert db.rows() - before == Counter({"tether_runs": 1, "tether_checkpoints": 1})
                refused_record("step result", label, longest, db)
                if label != "limit + 1":
                    figures.record(f"payloads: peak MB while refusing {label} [step result]",
                                   peak[0] / 1e6)  # fmt: skip
                    assert peak[0] < HUGE_BOUND, peak[0]


async def test_workflow_arguments_at_the_edges(tmp_path: Path) -> None:
    async with app_on(tmp_path) as (app, db):

        @app.workflow()
        async def take(data: str) -> str:
            return digest(data)

        overhead = len(take.encode_args(app.engine.serde, ("",), {}))  # {"args":[""],...}
        async with app:
            for label, data in (("0 B", ""), ("limit - 1", text(LIMIT - 1, overhead))):
                handle = await app.start(take, data, id=f"args {label}")
                assert await handle.result(timeout=30) == digest(data)
                run = await app.engine.store.get_run(handle.id)
                assert run is not None
                assert len(run.args.encode()) == (LIMIT - 1 if data else overhead)
                assert take.decode_args(app.engine.serde, run.args) == ([data], {})
            longest = db.longest_text()
            for label, data in (("limit + 1", text(LIMIT + 1, overhead)), ("200 MB", "x" * HUGE)):
                before = db.rows()
                with peak_allocation() as peak, pytest.raises(tether.PayloadTooLarge):
                    await app.start(take, data, id=f"args {label}")
                del data
                refused_record("workflow arguments", label, longest, db)
                assert db.rows() == before  # no run, nothing at all
                assert await app.list_runs(status="pending") == []
                if label == "200 MB":
                    figures.record("payloads: peak MB while refusing 200 MB [workflow arguments]",
                                   peak[0] / 1e6)  # fmt: skip
                    assert peak[0] < HUGE_BOUND, peak[0]


async def test_event_payloads_at_the_edges(tmp_path: Path) -> None:
    async with app_on(tmp_path) as (app, db):

        @app.workflow()
        async def listen() -> list[str]:
            first = await tether.wait_for_event("data")
            second = await tether.wait_for_event("data")
            return [digest(first), digest(second)]

        async with app:
            handle = await app.start(listen, id="events")
            big = text(LIMIT - 1)
            await app.send("events", "data", "")
            await app.send("events", "data", big)
            assert await handle.result(timeout=30) == [digest(""), digest(big)]
            stored = db.query("SELECT length(payload) FROM tether_events ORDER BY id")
            assert stored == [(2,), (LIMIT - 1,)]

            waiting = await app.start(listen, id="waiting")
            longest = db.longest_text()
            for label, data in (("limit + 1", text(LIMIT + 1)), ("200 MB", "x" * HUGE)):
                before = db.rows()
                with peak_allocation() as peak, pytest.raises(tether.PayloadTooLarge):
                    await app.send(waiting.id, "data", data)
                del data
                refused_record("event payload", label, longest, db)
                assert db.rows() == before  # no event row, no wake-up written
                if label == "200 MB":
                    figures.record("payloads: peak MB while refusing 200 MB [event payload]",
                                   peak[0] / 1e6)  # fmt: skip
                    assert peak[0] < HUGE_BOUND, peak[0]
            run = await app.engine.store.get_run(waiting.id)
            assert run is not None
            assert run.status in (RunStatus.RUNNING, RunStatus.WAITING)  # still waiting


async def test_approval_contexts_at_the_edges(tmp_path: Path) -> None:
    contexts = {"0 B": "", "limit - 1": text(LIMIT - 1), "limit + 1": text(LIMIT + 1),
                "200 MB": "x" * HUGE}  # fmt: skip
    async with app_on(tmp_path) as (app, db):

        @app.workflow()
        async def ask(label: str) -> bool:
            decision = await tether.approval("Ship it?", reviewers=["alice"],
                                             context=contexts[label])  # fmt: skip
            return decision.approved

        async with app:
            for label in ("0 B", "limit - 1"):
                handle = await app.start(ask, label, id=f"approval {label}")
                pending: list[tether.Approval] = []
                async with asyncio.timeout(30):
                    while not pending:
                        pending = await app.list_approvals(run_id=handle.id)
                (approval,) = pending
                assert approval.context == contexts[label]
                await app.decide(approval.id, "approve", reviewer="alice",
                                 operation_digest=approval.operation_digest)  # fmt: skip
                assert await handle.result(timeout=30) is True
            longest = db.longest_text()
            for label in ("limit + 1", "200 MB"):
                before = db.rows()
                with peak_allocation() as peak:
                    handle = await app.start(ask, label, id=f"approval {label}")
                    with pytest.raises(tether.RunFailed, match="PayloadTooLarge"):
                        await handle.result(timeout=30)
                assert await app.list_approvals(status=None, run_id=handle.id) == []
                assert await app.engine.store.load_history(handle.id) == []
                # The run's own row only: no approval, no audit entry, no checkpoint.
                assert db.rows() - before == Counter({"tether_runs": 1})
                refused_record("approval context", label, longest, db)
                if label == "200 MB":
                    figures.record("payloads: peak MB while refusing 200 MB [approval context]",
                                   peak[0] / 1e6)  # fmt: skip
                    assert peak[0] < HUGE_BOUND, peak[0]

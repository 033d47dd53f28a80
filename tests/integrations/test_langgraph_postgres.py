"""TetherSaver's writes on PostgreSQL: a put or a task's writes is one round trip (its statements
in one pipeline, committed by its one Sync) and all or nothing; the pooled connection comes back
as it was lent (in a transaction of its own for the next read).
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("langgraph")

import psycopg
from langgraph.checkpoint.base import empty_checkpoint
from psycopg import pq
from tests.postgres_server import execute_in, with_schema

from tether.integrations.langgraph import TetherSaver
from tether.store.postgres import parse_postgres_url


@pytest.fixture
def url(postgres_url: str) -> str:
    return with_schema(postgres_url, f"lg_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def saver(url: str) -> Iterator[TetherSaver]:
    with TetherSaver.from_url(url) as made:
        yield made


def a_checkpoint(notes: list[str]) -> Any:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"notes": notes, "draft": "x" * 200}  # both stored as blobs
    checkpoint["channel_versions"] = {"notes": "1", "draft": "1"}
    return checkpoint


def refuse_checkpoints_of(url: str, thread_id: str) -> None:
    """A trigger that fails the checkpoint row of `thread_id`: the last statement of a put."""
    execute_in(
        url,
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'checkpoint refused by the test'; END $$",
        "CREATE TRIGGER refuse BEFORE INSERT ON tether_lg_checkpoints FOR EACH ROW "
        f"WHEN (NEW.thread_id = '{thread_id}') EXECUTE FUNCTION refuse()",
    )


def count(url: str, table: str, thread_id: str) -> int:
    conninfo, schema = parse_postgres_url(url)
    with psycopg.connect(conninfo) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        row = conn.execute(
            f"SELECT count(*) FROM tether_lg_{table} WHERE thread_id = %s", (thread_id,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def round_trips(saver: TetherSaver, call: Any) -> int:
    """Answers that the server ended with ReadyForQuery while `call` ran: one per round trip
    (libpq's own trace of the protocol). Sequential calls get the pool's one connection."""
    pool = saver._db._sync_pool()  # type: ignore[attr-defined]
    with tempfile.TemporaryFile("w+") as trace:
        with pool.connection() as conn:
            conn.pgconn.trace(trace.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        call()
        with pool.connection() as conn:
            conn.pgconn.untrace()
        trace.seek(0)
        return sum("\tReadyForQuery\t" in line for line in trace)


def test_a_put_and_a_tasks_writes_take_one_round_trip_each(saver: TetherSaver) -> None:
    base = {"configurable": {"thread_id": "t-trips", "checkpoint_ns": ""}}
    checkpoint = a_checkpoint(["a", "b"])
    metadata, versions = {"source": "input", "step": -1}, {"notes": "1", "draft": "1"}
    stored: list[Any] = []
    put = round_trips(
        saver,
        lambda: stored.append(saver.put(base, checkpoint, metadata, versions)),  # type: ignore[arg-type]
    )
    writes = round_trips(
        saver, lambda: saver.put_writes(stored[0], [("notes", ["c"]), ("draft", "y")], "task-1")
    )
    assert (put, writes) == (1, 1)
    found = saver.get_tuple(stored[0])
    assert found is not None
    assert found.checkpoint["channel_values"] == {"notes": ["a", "b"], "draft": "x" * 200}
    assert sorted((w[1], w[2]) for w in found.pending_writes or ()) == [
        ("draft", "y"),
        ("notes", ["c"]),
    ]


def test_a_put_that_fails_in_its_last_statement_leaves_none_of_its_rows(
    saver: TetherSaver, url: str
) -> None:
    # The blobs are sent first, then the checkpoint's row, which the server refuses: the
    # pipeline's implicit transaction must take the blobs back with it.
    list(saver.list(None))  # the saver's tables exist from here
    refuse_checkpoints_of(url, "t-atomic")
    base = {"configurable": {"thread_id": "t-atomic", "checkpoint_ns": ""}}
    metadata = {"source": "input", "step": -1}
    with pytest.raises(psycopg.Error, match="refused by the test"):
        saver.put(base, a_checkpoint(["a"]), metadata, {"notes": "1", "draft": "1"})  # type: ignore[arg-type]
    assert (count(url, "blobs", "t-atomic"), count(url, "checkpoints", "t-atomic")) == (0, 0)
    base = {"configurable": {"thread_id": "t-after", "checkpoint_ns": ""}}

    # The connection went back to the pool as it came: not in autocommit, and usable.
    pool = saver._db._sync_pool()  # type: ignore[attr-defined]
    with pool.connection() as conn:
        assert conn.autocommit is False
    stored = saver.put(base, a_checkpoint(["b"]), {"source": "input", "step": -1}, {"notes": "1"})
    found = saver.get_tuple(stored)
    assert found is not None
    assert found.checkpoint["channel_values"]["notes"] == ["b"]


async def test_an_async_put_that_fails_leaves_none_of_its_rows_and_the_next_one_lands(
    url: str,
) -> None:
    async with TetherSaver.from_url(url) as saver:
        [_ async for _ in saver.alist(None)]  # the saver's tables exist from here
        refuse_checkpoints_of(url, "t-async")
        base = {"configurable": {"thread_id": "t-async", "checkpoint_ns": ""}}
        metadata = {"source": "input", "step": -1}
        with pytest.raises(psycopg.Error, match="refused by the test"):
            await saver.aput(base, a_checkpoint(["a"]), metadata, {"notes": "1", "draft": "1"})  # type: ignore[arg-type]
        assert (count(url, "blobs", "t-async"), count(url, "checkpoints", "t-async")) == (0, 0)
        base = {"configurable": {"thread_id": "t-after", "checkpoint_ns": ""}}
        stored = await saver.aput(base, a_checkpoint(["b"]), metadata, {"notes": "1"})  # type: ignore[arg-type]
        await saver.aput_writes(stored, [("notes", ["c"])], "task-1")
        found = await saver.aget_tuple(stored)
        assert found is not None
        assert found.checkpoint["channel_values"]["notes"] == ["b"]
        assert [(w[1], w[2]) for w in found.pending_writes or ()] == [("notes", ["c"])]


def test_a_write_the_driver_cannot_send_commits_none_of_its_rows(
    saver: TetherSaver, url: str
) -> None:
    # A NUL byte fails on the client, after the rows before it were queued: psycopg still
    # syncs the pipeline, which must not commit them.
    base = {"configurable": {"thread_id": "t-nul", "checkpoint_ns": ""}}
    metadata = {"source": "input", "step": -1}
    stored = saver.put(base, a_checkpoint(["a"]), metadata, {"notes": "1", "draft": "1"})  # type: ignore[arg-type]
    with pytest.raises(psycopg.DataError, match="NUL"):
        saver.put_writes(stored, [("a", 1), ("b", 2), ("c\x00", 3)], "task-1")
    assert count(url, "writes", "t-nul") == 0
    orphan = {"configurable": {"thread_id": "t-nul2", "checkpoint_ns": "", "checkpoint_id": "\x00"}}
    with pytest.raises(psycopg.DataError, match="NUL"):
        saver.put(orphan, a_checkpoint(["a"]), metadata, {"notes": "1", "draft": "1"})  # type: ignore[arg-type]
    assert (count(url, "blobs", "t-nul2"), count(url, "checkpoints", "t-nul2")) == (0, 0)
    pool = saver._db._sync_pool()  # type: ignore[attr-defined]
    with pool.connection() as conn:
        assert (conn.autocommit, conn.info.transaction_status) == (False, pq.TransactionStatus.IDLE)
    saver.put_writes(stored, [("a", 1)], "task-2")
    assert count(url, "writes", "t-nul") == 1


async def test_an_async_write_the_driver_cannot_send_commits_none_of_its_rows(url: str) -> None:
    async with TetherSaver.from_url(url) as saver:
        base = {"configurable": {"thread_id": "t-anul", "checkpoint_ns": ""}}
        metadata = {"source": "input", "step": -1}
        stored = await saver.aput(base, a_checkpoint(["a"]), metadata, {"notes": "1"})  # type: ignore[arg-type]
        with pytest.raises(psycopg.DataError, match="NUL"):
            await saver.aput_writes(stored, [("a", 1), ("b\x00", 2)], "task-1")
        assert count(url, "writes", "t-anul") == 0
        await saver.aput_writes(stored, [("a", 1)], "task-2")
        assert count(url, "writes", "t-anul") == 1

"""PostgreSQL's hot path: a statement alone sent straight through libpq (direct.py) answers as
psycopg's cursor would (rows, counts, errors, values of every type), keeps working when its
prepared statements vanish, never holds the event loop for a slow answer, and leaves its
connection usable or closed when interrupted; the connection the driver keeps for writes
(held.py) serves lone writes without the pool and is replaced once it breaks."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import socket
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from tests.contract.test_store_contract import LEASE, NOW, WF, checkpoint, lease_of, new
from tests.postgres_server import with_schema

import tether
from tether.errors import StoreUnavailable
from tether.store.drivers.postgres import direct
from tether.store.drivers.postgres.direct import Direct, Numbered
from tether.store.postgres import PostgresStore, parse_postgres_url

Conn = psycopg.AsyncConnection[Any]


@pytest.fixture
async def conn(postgres_url: str) -> AsyncIterator[Conn]:
    conninfo, _ = parse_postgres_url(postgres_url)
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as c:
        yield c


async def other(postgres_url: str) -> Conn:
    conninfo, _ = parse_postgres_url(postgres_url)
    return await psycopg.AsyncConnection.connect(conninfo, autocommit=True)


def test_placeholders_are_numbered_as_postgresql_reads_them() -> None:
    named = Numbered.of("SELECT %(a)s, %(b)s, %(a)s, '100%%'")
    assert named is not None
    assert (named.text, named.names, named.count) == (b"SELECT $1, $2, $1, '100%'", ("a", "b"), 2)
    assert named.values({"b": 2, "a": 1, "unused": 3}) == [1, 2]
    positional = Numbered.of("INSERT INTO t VALUES (%s, %s)")
    assert positional is not None
    assert (positional.text, positional.names) == (b"INSERT INTO t VALUES ($1, $2)", None)
    assert positional.values((1, "x")) == [1, "x"]
    # What only psycopg's cursor reads as psycopg does never goes this way.
    for other in ("SELECT %s, %(a)s", "SELECT %b", "SELECT %(a)t", "SELECT 5 % 2", "SELECT %"):
        assert Numbered.of(other) is None, other
    # Parameters that do not fit are refused as the cursor refuses them, before any send.
    with pytest.raises(psycopg.ProgrammingError, match="missing"):
        named.values({"a": 1})
    with pytest.raises(psycopg.ProgrammingError, match="mapping"):
        named.values([1, 2])
    with pytest.raises(psycopg.ProgrammingError, match="2 placeholders but 3"):
        positional.values((1, 2, 3))
    for wrong in ({"a": 1, "b": 2}, "ab", b"ab"):
        with pytest.raises(psycopg.ProgrammingError, match="sequence"):
            positional.values(wrong)


VALUES: list[Any] = [
    None, True, False, 0, 1, -7, 2**31, 2**63 - 1, 10**30, 1.5, -0.0, 1e300,
    "", "héllo ✓ 𝄞", "'; DROP TABLE x; --", "x" * 100_000, b"\x00\x01\xff",
    [1, 2, 3], ["a", None, "c"], Decimal("1.10"),
    datetime.datetime(2026, 12, 6, 4, 42, tzinfo=datetime.UTC), datetime.date(2026, 1, 31),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
]  # fmt: skip


async def outcome(call: Any) -> Any:
    try:
        return await call
    except psycopg.Error as exc:
        return type(exc)


@pytest.mark.parametrize("prepare", [True, False], ids=["prepared", "unnamed"])
async def test_a_statement_answers_as_psycopgs_cursor_would(conn: Conn, prepare: bool) -> None:
    way = Direct(prepare=prepare)
    for value in VALUES:
        for sql in ("SELECT %(v)s, %(v)s IS NULL, 42", "SELECT %s::text, pg_typeof(%s)::text"):
            params: Any = {"v": value} if "%(v)s" in sql else (value, value)
            cursor = await outcome(conn.execute(sql, params))
            want = cursor if isinstance(cursor, type) else await cursor.fetchall()
            for _ in range(2):  # the second time on the prepared statement
                assert await outcome(way.execute(conn, sql, params)) == want, (value, sql)
    assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE


async def test_changed_rows_are_counted_and_returned_rows_loaded(conn: Conn) -> None:
    way = Direct(prepare=True)
    await conn.execute("CREATE TEMP TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    for i in range(3):
        assert (
            await way.execute(conn, "INSERT INTO t VALUES (%(i)s, %(v)s)", {"i": i, "v": "a"}) == 1
        )
    assert (
        await way.execute(conn, "UPDATE t SET v = %(v)s WHERE id < %(n)s", {"v": "b", "n": 2}) == 2
    )
    rows = await way.execute(conn, "UPDATE t SET v = %s WHERE id = %s RETURNING id, v", ("c", 2))
    assert rows == [(2, "c")]
    assert await way.execute(conn, "SELECT id FROM t WHERE id > %s", (9,)) == []
    assert (
        await way.execute(conn, "INSERT INTO t VALUES (%s, 'z') ON CONFLICT DO NOTHING", (0,)) == 0
    )


async def test_errors_are_psycopgs_and_leave_the_connection_usable(conn: Conn) -> None:
    way = Direct(prepare=True)
    await conn.execute("CREATE TEMP TABLE u (id INTEGER PRIMARY KEY)")
    await way.execute(conn, "INSERT INTO u VALUES (%s)", (1,))
    with pytest.raises(psycopg.errors.UniqueViolation) as raised:
        await way.execute(conn, "INSERT INTO u VALUES (%s)", (1,))
    assert raised.value.diag.constraint_name == "u_pkey"
    with pytest.raises(psycopg.errors.DivisionByZero):
        await way.execute(conn, "SELECT 1 / %s", (0,))
    with pytest.raises(psycopg.DataError, match="NUL"):  # refused before anything is sent
        await way.execute(conn, "INSERT INTO u SELECT length(%s)", ("a\x00b",))
    assert await way.execute(conn, "SELECT count(*) FROM u WHERE id > %s", (0,)) == [(1,)]


async def test_prepared_statements_dropped_behind_its_back_are_prepared_again(
    conn: Conn,
) -> None:
    way = Direct(prepare=True)
    sql = "SELECT %(v)s::integer + 1"
    assert await way.execute(conn, sql, {"v": 1}) == [(2,)]
    names = await (await conn.execute("SELECT name FROM pg_prepared_statements")).fetchall()
    assert [n for (n,) in names if n.startswith("_tether_")], names
    await conn.execute("DEALLOCATE ALL")
    assert await way.execute(conn, sql, {"v": 2}) == [(3,)]
    await conn.execute("DISCARD ALL")
    assert await way.execute(conn, sql, {"v": 3}) == [(4,)]


async def test_unnamed_statements_prepare_nothing_on_the_server(conn: Conn) -> None:
    way = Direct(prepare=False)  # prepare_threshold=none: PgBouncer in transaction mode
    for i in range(5):
        assert await way.execute(conn, "SELECT %s::integer", (i,)) == [(i,)]
    rows = await (await conn.execute("SELECT name FROM pg_prepared_statements")).fetchall()
    assert rows == []


async def test_a_slow_answer_is_waited_for_by_the_loop_which_goes_on_meanwhile(
    conn: Conn,
) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    try:
        await asyncio.sleep(0.01)
        before = ticks
        rows = await Direct(prepare=True).execute(conn, "SELECT %s::int FROM pg_sleep(0.3)", (7,))
        during = ticks - before
    finally:
        ticking.cancel()
    assert rows == [(7,)]
    # Held on the spot for the whole statement, the loop would not have ticked at all.
    assert during >= 20, during


async def test_an_answer_is_waited_for_on_the_spot_only_when_nothing_else_is_ready(
    conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    spots: list[int] = []
    real = direct._on_the_spot

    def counted(*args: Any) -> int:
        spots.append(1)
        return real(*args)

    monkeypatch.setattr(direct, "_on_the_spot", counted)
    # However slow the machine: every answer comes in time.
    monkeypatch.setattr(direct, "ON_THE_SPOT", 10.0)
    way = Direct(prepare=True)
    assert await way.execute(conn, "SELECT %s::int", (1,)) == [(1,)]
    assert len(spots) == 2  # its prepare and its execution: nothing else was ready
    asyncio.get_running_loop().call_soon(lambda: None)  # another callback ready to run
    assert await way.execute(conn, "SELECT %s::int", (2,)) == [(2,)]
    assert len(spots) == 2


async def test_answers_on_the_spot_still_let_the_loop_see_sockets_that_became_ready(
    conn: Conn,
) -> None:
    """Answers taken on the spot do not turn the loop: without a turn now and then, a socket
    that became ready would wait until the statements stopped."""
    loop = asyncio.get_running_loop()
    near, far = socket.socketpair()
    near.setblocking(False)
    done = 0
    seen_after: list[int] = []

    async def reader() -> None:
        await loop.sock_recv(near, 1)
        seen_after.append(done)

    try:
        listening = asyncio.create_task(reader())
        await asyncio.sleep(0)  # the reader waits on its socket
        far.send(b"x")
        way = Direct(prepare=True)
        for i in range(300):  # about 30 ms of answers, mostly on the spot
            assert await way.execute(conn, "SELECT %s::int", (i,)) == [(i,)]
            done += 1
        await listening
    finally:
        near.close()
        far.close()
    assert seen_after[0] < 300, seen_after


async def test_a_cancelled_statement_is_cancelled_in_the_server_and_its_connection_kept(
    conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(direct, "DRAIN", 30.0)  # however slow the machine, the answer is read
    await conn.execute("CREATE TEMP TABLE c (v INTEGER)")
    way = Direct(prepare=True)
    slow = "INSERT INTO c SELECT %s FROM pg_sleep(5)"
    task = asyncio.create_task(way.execute(conn, slow, (5,)))
    await asyncio.sleep(0.1)
    started = asyncio.get_running_loop().time()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # As psycopg's own wait does: cancelled in the server (not left to run its 5 s), the
    # answer read, the connection idle and usable; the statement changed nothing.
    assert asyncio.get_running_loop().time() - started < 4
    assert not conn.closed
    assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert await way.execute(conn, "SELECT count(*) FROM c WHERE v = %s", (5,)) == [(0,)]


async def test_a_cancelled_statement_whose_answer_does_not_come_closes_its_connection(
    conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(direct, "DRAIN", 1e-6)  # no time for the cancel and the answer
    task = asyncio.create_task(Direct(prepare=True).execute(conn, "SELECT pg_sleep(%s)", (5,)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert conn.closed


async def test_a_connection_cut_mid_statement_raises_instead_of_hanging(
    conn: Conn, postgres_url: str
) -> None:
    pid = conn.info.backend_pid
    task = asyncio.create_task(Direct(prepare=True).execute(conn, "SELECT pg_sleep(%s)", (5,)))
    await asyncio.sleep(0.1)
    async with await other(postgres_url) as killer:
        await killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(psycopg.OperationalError):
        await asyncio.wait_for(task, 10)


# -- the held connection ---------------------------------------------------------------------


@pytest.fixture
def store(postgres_store: PostgresStore) -> PostgresStore:
    return postgres_store


async def held_pid(store: PostgresStore) -> int:
    """The held connection's backend pid, once it is open (opened when first wanted)."""
    driver = store.driver
    for _ in range(500):
        held = driver._held
        assert held is not None
        if held.free and held._conn is not None:
            return held._conn.info.backend_pid
        await asyncio.sleep(0.01)
    raise AssertionError("the held connection never opened")


async def test_lone_writes_take_the_held_connection_not_the_pool(store: PostgresStore) -> None:
    await store.create_run(new("r"), NOW)
    (run,) = await store.claim_runs("w", [WF], NOW, NOW + LEASE, 1)
    await held_pid(store)
    pool = store.driver.pool
    assert pool is not None
    before = pool.get_stats().get("requests_num", 0)
    for seq in range(20):
        await store.write_checkpoint(lease_of(run), checkpoint(seq), NOW + 1)
    assert pool.get_stats().get("requests_num", 0) == before
    assert [c.seq for c in await store.load_history("r")] == list(range(20))


async def test_a_killed_held_connection_fails_one_write_then_is_replaced(
    store: PostgresStore, postgres_url: str
) -> None:
    await store.create_run(new("k"), NOW)
    (run,) = await store.claim_runs("w", [WF], NOW, NOW + LEASE, 1)
    pid = await held_pid(store)
    async with await other(postgres_url) as killer:
        await killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(StoreUnavailable):
        await store.write_checkpoint(lease_of(run), checkpoint(0), NOW + 1)
    for seq in range(1, 4):  # on pooled connections while another is opened
        await store.write_checkpoint(lease_of(run), checkpoint(seq), NOW + 1)
    assert await held_pid(store) != pid
    await store.write_checkpoint(lease_of(run), checkpoint(4), NOW + 1)
    assert [c.seq for c in await store.load_history("k")] == [1, 2, 3, 4]


async def test_closing_the_store_closes_its_held_connection(postgres_url: str) -> None:
    backend = PostgresStore(with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}"))
    await backend.open()
    await backend.create_run(new("c"), NOW)
    pid = await held_pid(backend)
    await backend.close()
    async with await other(postgres_url) as look:
        cur = await look.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
        assert await cur.fetchone() == (0,)


async def test_a_run_one_step_after_another_sends_every_statement_straight(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = tether.App(with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}"))

    @app.step()
    async def inc(x: int) -> int:
        return x + 1

    @app.workflow()
    async def ten(x: int) -> int:
        for _ in range(10):
            x = await inc(x)
        return x

    async with app:
        assert await (await app.start(ten, 0)).result() == 10  # warmed up: the held connection
        sent: list[str] = []
        real = psycopg.AsyncCursor.execute

        async def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            sent.append(str(query)[:60])
            return await real(self, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted)
        assert await (await app.start(ten, 5)).result() == 15
        monkeypatch.undo()
        # A run's start, its ten checkpoints and its end: none through a cursor.
        assert sent == []


async def test_a_cancellation_the_pools_wait_dropped_still_cancels_the_read(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg_pool waits for a connection with asyncio.wait_for, which on Python 3.11 can drop
    a cancellation that comes as the connection does: the task went on as if never asked to
    stop (a worker's service task then slept past its worker's stop)."""
    pool = store.driver.pool
    assert pool is not None
    real = pool.getconn

    async def dropping(timeout: float | None = None) -> Any:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # asked to stop while it waits...
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)  # ...and the wait drops it, as wait_for can
        return await real(timeout)

    monkeypatch.setattr(pool, "getconn", dropping)
    with pytest.raises(asyncio.CancelledError):
        await store.get_run("nothing")
    monkeypatch.undo()
    assert await store.get_run("nothing") is None  # the connection went back to the pool


async def test_closing_the_store_lets_a_write_in_flight_on_the_held_connection_finish(
    postgres_url: str,
) -> None:
    """A write alone runs in its caller's task, which the group commit's drain does not wait
    for: its connection must not be closed under its statement (it hung for ever)."""
    backend = PostgresStore(with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}"))
    await backend.open()
    await backend.create_run(new("w"), NOW)
    (run,) = await backend.claim_runs("w1", [WF], NOW, NOW + LEASE, 1)
    await held_pid(backend)
    conninfo, schema = parse_postgres_url(backend.driver.url)
    async with await psycopg.AsyncConnection.connect(conninfo) as blocker:
        await blocker.execute(f'SET search_path TO "{schema}"')
        await blocker.execute("SELECT 1 FROM tether_runs WHERE id = 'w' FOR UPDATE")
        write = asyncio.create_task(backend.write_checkpoint(lease_of(run), checkpoint(0), NOW + 1))
        await asyncio.sleep(0.2)  # its statement waits on the row, on the held connection
        closing = asyncio.create_task(backend.close())
        await asyncio.sleep(0.2)
        await blocker.rollback()
    await asyncio.wait_for(write, 10)
    await asyncio.wait_for(closing, 10)
    again = PostgresStore(backend.driver.url)
    await again.open()
    try:
        assert [c.seq for c in await again.load_history("w")] == [0]
    finally:
        await again.close()


async def test_a_keepalives_handle_keeps_no_connection_for_writes(store: PostgresStore) -> None:
    other_handle = store.another()
    await other_handle.open()
    try:
        await other_handle.heartbeat("w1", [], NOW + 10, NOW)
        assert other_handle.driver._held is None
    finally:
        await other_handle.close()

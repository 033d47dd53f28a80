"""Transaction steps: a body's writes to Tether's own database commit with the step's checkpoint
or not at all, on memory (its private SQLite), real SQLite files and PostgreSQL, in normal and
forced-replay mode; failures roll back then retry; the body cannot end the transaction; an SQL
error of one body fails only that step in a shared group commit; a full disk is a database
outage, not the step's error; a lost lease commits nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.crash.backends import ro_query
from tests.postgres_server import with_schema

import tether
from tether.errors import ConfigurationError, LeaseLost, NotInWorkflow, StoreUnavailable
from tether.store import store_from_url
from tether.store.port import Checkpoint, CheckpointStatus, Lease, NewRun, Store
from tether.store.port.outbox import NewOutboxMessage, TransactionOutcome
from tether.store.postgres import PostgresStore
from tether.store.sqlite import SqliteStore

pytestmark = pytest.mark.timeout(60)

FAST = tether.Retry(max_attempts=3, initial_delay=timedelta(milliseconds=5))


def sql(app: tether.App, text: str) -> str:
    """`text` with `?` placeholders in the App's dialect (psycopg takes %s)."""
    return text.replace("?", "%s") if isinstance(app.engine.store, PostgresStore) else text


def rows(app: tether.App, text: str, *args: Any) -> list[tuple[Any, ...]]:
    """Read Tether's database beside the library (memory: the store's private SQLite file)."""
    store = app.engine.store
    assert isinstance(store, SqliteStore | PostgresStore)
    return ro_query(store.driver.url, text, *args)


def make_ledger(app: tether.App) -> tuple[tether.Workflow[[str, int], int], list[str]]:
    """A workflow of two concurrent transaction steps and a plain one; `bodies` counts
    body executions."""
    bodies: list[str] = []

    @app.transaction()
    def setup(conn: Any) -> None:
        # Before the concurrent steps: PostgreSQL may fail one of two concurrent CREATE TABLE
        # IF NOT EXISTS of one table (a unique violation in its catalog).
        conn.execute("CREATE TABLE IF NOT EXISTS ledger (account TEXT, amount INTEGER)")

    @app.transaction()
    def debit(conn: Any, account: str, amount: int) -> int:
        bodies.append("debit")
        conn.execute(sql(app, "INSERT INTO ledger VALUES (?, ?)"), (account, -amount))
        row = conn.execute(sql(app, "SELECT sum(amount) FROM ledger WHERE account = ?"),
                           (account,)).fetchone()  # fmt: skip
        return int(row[0])

    @app.transaction(name="credit", retry=FAST)
    def credit_body(conn: Any, account: str, amount: int) -> int:
        bodies.append("credit")
        cur = conn.cursor()
        cur.executemany(sql(app, "INSERT INTO ledger VALUES (?, ?)"), [(account, amount)])
        return cur.rowcount if isinstance(cur.rowcount, int) else 1

    @app.step()
    async def total(values: list[int]) -> int:
        return sum(values)

    @app.workflow()
    async def transfer(account: str, amount: int) -> int:
        await setup()
        a, b = await asyncio.gather(debit(account, amount), credit_body(f"{account}-2", amount))
        return await total([a, b])

    return transfer, bodies


async def test_writes_commit_with_the_checkpoint_and_replay_returns_the_recorded_result(
    make_app: Callable[..., tether.App],
) -> None:
    app = make_app()
    transfer, bodies = make_ledger(app)
    async with app:
        handle = await app.start(transfer, "alice", 30, id="t1")
        assert await handle.result() == -29
        history = await handle.checkpoints()
    # Each body ran once, even in forced-replay mode (replay returns the recorded result).
    assert sorted(bodies) == ["credit", "debit"]
    assert [(c.name, c.kind, c.status) for c in history] == [
        ("setup", "transaction", CheckpointStatus.COMPLETED),
        ("debit", "transaction", CheckpointStatus.COMPLETED),
        ("credit", "transaction", CheckpointStatus.COMPLETED),
        ("total", "step", CheckpointStatus.COMPLETED),
    ]
    assert history[1].result == "-30"
    assert history[2].result == "1"
    assert history[1].finished_at is not None
    assert history[1].started_at is not None
    assert sorted(rows(app, "SELECT account, amount FROM ledger")) == [
        ("alice", -30),
        ("alice-2", 30),
    ]


async def test_a_failing_body_is_rolled_back_then_retried_and_commits_once(
    make_app: Callable[..., tether.App],
) -> None:
    app = make_app()
    tries: list[int] = []

    @app.transaction(retry=FAST)
    def book(conn: Any, seat: str) -> str:
        tries.append(1)
        conn.execute("CREATE TABLE IF NOT EXISTS seats (seat TEXT)")
        conn.execute(sql(app, "INSERT INTO seats VALUES (?)"), (seat,))
        if len(tries) < 3:
            raise ConnectionError(f"attempt {len(tries)} fails after its insert")
        return seat

    @app.workflow()
    async def flow() -> str:
        return await book("12A")

    async with app:
        handle = await app.start(flow, id="b1")
        assert await handle.result() == "12A"
        (cp,) = await handle.checkpoints()
    assert len(tries) == 3
    assert cp.attempts == 3
    assert cp.status is CheckpointStatus.COMPLETED
    assert rows(app, "SELECT seat FROM seats") == [("12A",)]


async def test_exhausted_retries_fail_the_step_with_nothing_written(
    make_app: Callable[..., tether.App],
) -> None:
    app = make_app()

    @app.transaction(retry=tether.NO_RETRY)
    def book(conn: Any) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS seats (seat TEXT)")
        conn.execute("INSERT INTO seats VALUES ('1A')")
        tether.outbox("https://example.invalid/booked", {"seat": "1A"})
        raise ValueError("no seat")

    @app.workflow()
    async def flow() -> str:
        try:
            await book()
        except ValueError as exc:
            return f"caught {exc}"
        return "booked"

    async with app:
        handle = await app.start(flow, id="b1")
        assert await handle.result() == "caught no seat"
        (cp,) = await handle.checkpoints()
    assert cp.status is CheckpointStatus.FAILED
    assert cp.attempts == 1
    assert cp.kind == "transaction"
    with pytest.raises((sqlite3.Error, Exception), match="seats"):
        rows(app, "SELECT seat FROM seats")  # the table was rolled back with the row
    assert await app.list_outbox() == []


CALLS: dict[str, Callable[[Any], object]] = {
    "commit": lambda c: c.commit(),
    "rollback": lambda c: c.rollback(),
    "close": lambda c: c.close(),
    "COMMIT": lambda c: c.execute("COMMIT"),
    "BEGIN": lambda c: c.execute(" /* hidden */ -- and here\n begin"),
    "SAVEPOINT": lambda c: c.cursor().execute("SAVEPOINT x"),
    "SET": lambda c: c.execute("SET search_path TO public"),
    "PRAGMA": lambda c: c.execute("PRAGMA synchronous = OFF"),
}


async def test_the_body_cannot_commit_roll_back_or_end_the_transaction(
    make_app: Callable[..., tether.App],
) -> None:
    app = make_app()
    leaked: list[Any] = []

    @app.transaction()
    def misuse(conn: Any, call: str) -> None:
        leaked.append(conn)
        conn.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
        conn.execute("INSERT INTO t VALUES (1)")
        CALLS[call](conn)

    @app.transaction()
    def fine(conn: Any) -> int:
        if not isinstance(app.engine.store, PostgresStore):
            conn.execute("PRAGMA table_info(tether_runs)").fetchall()  # reading a pragma is fine
        return 1

    @app.workflow()
    async def flow(call: str) -> str:
        try:
            await misuse(call)
        except tether.PermanentError as exc:
            return str(exc)
        return "allowed"

    @app.workflow()
    async def ok() -> int:
        return await fine()

    async with app:
        for call in CALLS:
            text = await (await app.start(flow, call, id=f"m-{call}")).result()
            assert "not allowed inside an @app.transaction() body" in text, (call, text)
            (cp,) = await (await app.get(f"m-{call}")).checkpoints()
            assert cp.attempts == 1, call  # a misuse is not retried
        assert await (await app.start(ok, id="ok")).result() == 1
    with pytest.raises(tether.PermanentError, match="has ended"):
        leaked[0].execute("SELECT 1")
    with pytest.raises((sqlite3.Error, Exception), match="t"):
        rows(app, "SELECT x FROM t")


async def test_misuse_of_the_decorator_is_refused(make_app: Callable[..., tether.App]) -> None:
    app = make_app()
    with pytest.raises(ConfigurationError, match="plain `def`"):

        @app.transaction()
        async def body(conn: Any) -> None: ...

    with pytest.raises(TypeError):
        app.transaction(at_most_once=True)  # type: ignore[call-overload]

    @app.transaction
    def plain(conn: Any, x: int) -> int:
        return x

    with pytest.raises(NotInWorkflow, match="runs only in workflow code"):
        await plain(1)
    assert plain.fn(None, 2) == 2
    assert plain.name == "plain"


# -- SQLite: the group commit ------------------------------------------------------------------


async def test_an_sql_error_of_one_body_fails_only_its_step_in_a_shared_commit(
    tmp_path: Path,
) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/t.db")

    @app.transaction(retry=tether.NO_RETRY)
    def write(conn: Any, n: int) -> int:
        table = "missing_table" if n == 7 else "items"
        conn.execute("CREATE TABLE IF NOT EXISTS items (n INTEGER)")
        conn.execute(f"INSERT INTO {table} VALUES (?)", (n,))
        return n

    @app.workflow()
    async def flow(n: int) -> int:
        return await write(n)

    async with app:
        handles = await asyncio.gather(*(app.start(flow, n, id=f"r{n}") for n in range(30)))
        outcomes = await asyncio.gather(*(h.result() for h in handles), return_exceptions=True)
    failed = {n: o for n, o in enumerate(outcomes) if isinstance(o, BaseException)}
    assert list(failed) == [7], failed
    assert isinstance(failed[7], tether.RunFailed)
    assert "no such table: missing_table" in str(failed[7])
    assert "OperationalError" in str(failed[7].error), failed[7].error
    assert sorted(r[0] for r in rows(app, "SELECT n FROM items")) == [
        n for n in range(30) if n != 7
    ]


async def test_a_full_disk_in_a_body_is_a_database_outage_not_the_steps_error(
    tmp_path: Path,
) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/t.db")
    app.engine.settings = dataclasses.replace(app.engine.settings, store_outage=30.0)
    seen: list[Exception] = []
    real = app.engine.store.run_transaction

    async def spy(*args: Any) -> str:
        try:
            return await real(*args)
        except Exception as exc:
            seen.append(exc)
            raise

    app.engine.store.run_transaction = spy  # type: ignore[method-assign]

    @app.transaction(retry=tether.NO_RETRY)
    def big(conn: Any) -> int:
        conn.execute("CREATE TABLE IF NOT EXISTS blobs (b BLOB)")
        conn.execute("INSERT INTO blobs VALUES (?)", (b"x" * 200_000,))
        return 1

    @app.workflow()
    async def flow() -> int:
        return await big()

    store = app.engine.store
    assert isinstance(store, SqliteStore)
    async with app:
        queue = store.driver.queue
        pages = queue._inline.execute("PRAGMA page_count").fetchone()[0]  # type: ignore[union-attr]
        queue.apply_pragma(f"max_page_count = {pages + 5}")
        handle = await app.start(flow, id="full")
        async with asyncio.timeout(10):
            while not seen:
                await asyncio.sleep(0.01)
        queue.apply_pragma("max_page_count = 1073741823")  # space again
        assert await handle.result() == 1
        (cp,) = await handle.checkpoints()
    assert all(isinstance(e, StoreUnavailable) and "is full" in str(e) for e in seen), seen
    assert cp.attempts == 1
    assert cp.status is CheckpointStatus.COMPLETED
    assert rows(app, "SELECT count(*) FROM blobs") == [(1,)]


# -- leases ---------------------------------------------------------------------------------------


async def test_a_stale_lease_commits_nothing(store: Store) -> None:
    await store.create_run(NewRun("r", "wf", "[[], {}]"), 1.0, owner="w", lease_until=99.0)
    await store.claim_runs("w2", ["wf"], 100.0, 200.0, 1)  # adopted: epoch 2
    message = NewOutboxMessage("m1", "https://example.invalid/x", "k", "{}")

    def body(conn: Any) -> TransactionOutcome:
        conn.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
        conn.execute("INSERT INTO t VALUES (1)")
        return TransactionOutcome("1", (message,))

    done = Checkpoint(0, "s", "transaction", CheckpointStatus.COMPLETED, attempts=1)
    with pytest.raises(LeaseLost, match="was rolled back"):
        await store.run_transaction(Lease("r", "w", 1), body, done, 101.0)
    assert await store.load_history("r") == []
    assert await store.list_outbox() == []
    tables = "SELECT name FROM sqlite_master WHERE name = 't'"  # the body's table: rolled back
    if isinstance(store, SqliteStore):  # a MemoryStore too: its private SQLite file
        assert ro_query(store.driver.url, tables) == []
    else:
        assert ro_query(store.url, "SELECT to_regclass('t')") == [(None,)]
    assert await store.run_transaction(Lease("r", "w2", 2), body, done, 101.0) == "1"
    assert [c.result for c in await store.load_history("r")] == ["1"]


async def test_a_lease_lost_while_the_body_runs_commits_nothing(postgres_url: str) -> None:
    """PostgreSQL runs the body without locking the run row: another worker may adopt the
    run meanwhile. The lease is checked again, under a lock, before the commit."""
    import psycopg

    from tether.store.postgres import parse_postgres_url

    url = with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}")
    store = store_from_url(url)
    await store.open()
    conninfo, schema = parse_postgres_url(url)
    try:
        await store.create_run(NewRun("r", "wf", "[[], {}]"), 1.0, owner="w", lease_until=9e9)

        def body(conn: Any) -> TransactionOutcome:
            conn.execute("CREATE TABLE t (x INTEGER)")
            conn.execute("INSERT INTO t VALUES (1)")
            with psycopg.connect(conninfo, autocommit=True) as other:  # another worker adopts
                other.execute(f'UPDATE "{schema}".tether_runs SET epoch = 2, owner = %s',
                              ("w2",))  # fmt: skip
            return TransactionOutcome("1")

        done = Checkpoint(0, "s", "transaction", CheckpointStatus.COMPLETED, attempts=1)
        with pytest.raises(LeaseLost):
            await store.run_transaction(Lease("r", "w", 1), body, done, 2.0)
        assert await store.load_history("r") == []
        with pytest.raises(psycopg.errors.UndefinedTable):
            ro_query(url, "SELECT x FROM t")
    finally:
        await store.close()


async def test_a_body_run_by_the_writer_thread_still_finds_its_step_and_records_messages(
    tmp_path: Path,
) -> None:
    """While another connection holds SQLite's write lock, the group commit hands the batch to
    its writer thread: the body runs there, in its step's context all the same."""
    app = tether.App(f"sqlite:///{tmp_path}/t.db")
    threads: list[int] = []

    @app.transaction()
    def body(conn: Any) -> str:
        threads.append(threading.get_ident())
        conn.execute("CREATE TABLE IF NOT EXISTS keys (k TEXT)")
        conn.execute("INSERT INTO keys VALUES (?)", (tether.idempotency_key(),))
        return tether.outbox("https://example.invalid/k", {"n": 1}).key

    @app.step()
    async def lock() -> None:
        """Another connection takes the write lock, and gives it back 0.2 s later."""
        blocker = sqlite3.connect(f"{tmp_path}/t.db", isolation_level=None,
                                  check_same_thread=False)  # fmt: skip
        blocker.execute("BEGIN IMMEDIATE")

        def release() -> None:
            blocker.execute("COMMIT")
            blocker.close()

        threading.Timer(0.2, release).start()

    @app.workflow()
    async def flow() -> str:
        # The lock's checkpoint meets the lock and goes to the writer thread; the transaction
        # submitted meanwhile follows it there.
        _, key = await asyncio.gather(lock(), body())
        return key

    async with app:
        key = await (await app.start(flow, id="w")).result()
        (message,) = await app.list_outbox()
    assert threads[-1] != threading.get_ident()  # the writer thread ran it
    assert message.key == key
    assert message.checkpoint == "body"
    (recorded,) = rows(app, "SELECT k FROM keys")
    assert recorded[0].startswith("tether-")

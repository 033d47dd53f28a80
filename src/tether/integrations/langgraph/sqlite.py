"""TetherSaver's SQLite connections: one write connection committing in groups, and readers.

The file is opened as Tether's store opens it (`tether.store.drivers.sqlite`): WAL, the URL's
`synchronous` (FULL unless the URL says otherwise), a busy timeout; it is the App's file, in
tables of the saver's own (`tether_lg_*`, created by `sql/sqlite/` migrations recorded in
`tether_lg_migrations`).

Writes queue for the one write connection. The thread that finds it free becomes the leader:
it commits everything queued, its own operation and others', in one transaction, so one fsync
covers them all; the others wait, and nobody is answered before their own commit. Alone, a
write runs in its caller's thread, with no thread switch. A task's writes (`put_writes`) wait up
to a millisecond in a lobby for company: LangGraph saves the step's checkpoint right after them,
and the graph waits for that checkpoint, never for the writes, so the two share one commit. When
waiting keeps finding nobody, it pauses for a while. Async callers queue their write and, if
nobody leads, a worker thread leads: the event loop never runs SQL.

Reads run on pooled reader connections in the caller's thread (async callers: a worker thread),
each in one read transaction: a consistent snapshot that never waits for the writer. Sync
callers never need an event loop, so calling them inside a running loop blocks it for the
statement's duration but cannot deadlock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

from tether.errors import StoreUnavailable
from tether.store.drivers.sqlite import parse_sqlite_url
from tether.store.drivers.sqlite.commit import create_private
from tether.store.query import Op, Queries, Query, drive, prime

T = TypeVar("T")

LINGER = 0.001  # seconds a task's writes wait in the lobby for company before leading
MISSES_BEFORE_REST = 3  # lingers in a row that found nobody before lingering pauses
REST = 64  # writes that do not linger in the first pause; doubles while lingering misses
MAX_REST = 4096
IDLE_READERS = 8


@dataclass(slots=True, eq=False)
class _Job:
    make: Callable[[], Op[Any]]  # makes the operation again if its batch must be redone
    op: Op[Any] | None  # None: the leader makes it (async callers: encoding off the loop)
    first: Query | None  # the query the caller already took from `op` (see query.prime)
    future: concurrent.futures.Future[Any] | None  # None: the leader's own job
    outcome: tuple[bool, Any] = (False, None)


class _Writer:
    """The write connection, its queue and its lobby. Whichever thread finds the lead free
    commits every queued job, its own and others', in one transaction; the rest wait for their
    futures. So an uncontended write costs no thread switch, and contended ones share commits.

    A lingering job waits in the lobby: the next job to be committed takes it along. If none
    comes within LINGER, its owner moves it to the queue and leads. Leaders take the lobby only
    with queued work, so they never commit a lingering job alone before its time."""

    def __init__(self, conn: sqlite3.Connection, queries: Queries, path: str) -> None:
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.lead = threading.Lock()
        self._lobby: list[_Job] = []
        self._lobby_lock = threading.Lock()
        self._conn, self._queries, self._path = conn, queries, path
        self._closed = False
        self._misses = self._resting = 0
        self._rest = REST

    def write(self, make: Callable[[], Op[T]], op: Op[T], first: Query, linger: bool) -> T:
        """Commit `op`, in this thread when the lead is free; answer after the commit."""
        job = _Job(make, op, first, None)
        if linger and self.lingering():
            job.future = concurrent.futures.Future()
            self.wait_in_lobby(job)
            concurrent.futures.wait([job.future], timeout=LINGER)
            self.leave_lobby(job)
            return cast(T, job.future.result())
        if not self.lead.acquire(blocking=False):
            job.future = concurrent.futures.Future()
            self.jobs.put(job)
            self.serve()
            return cast(T, job.future.result())
        try:
            batch = self._take(company=True)
            batch.append(job)
            self._commit(batch)
            while batch := self._take():
                self._commit(batch)
        finally:
            self.lead.release()
        if not self.jobs.empty():
            self.serve()
        ok, value = job.outcome
        if not ok:
            raise value
        return cast(T, value)

    def enqueue(self, make: Callable[[], Op[T]], *, linger: bool) -> _Job:
        """Queue (or seat in the lobby) an operation for a leader; see `serve`."""
        job = _Job(make, None, None, concurrent.futures.Future())
        if linger:
            self.wait_in_lobby(job)
        else:
            self.jobs.put(job)
        return job

    def wait_in_lobby(self, job: _Job) -> None:
        with self._lobby_lock:
            self._lobby.append(job)

    def leave_lobby(self, job: _Job) -> None:
        """The linger is over: a job nobody took goes to the queue, and its owner leads."""
        with self._lobby_lock:
            missed = job in self._lobby
            if missed:
                self._lobby.remove(job)
                self.jobs.put(job)
        self.lingered(not missed)
        if missed:  # otherwise a leader has it and will answer
            self.serve()

    def serve(self) -> None:
        """Commit the queued jobs unless another thread holds the lead. A leader looks at the
        queue again after letting go, so a job queued while it led is never left behind."""
        while self.lead.acquire(blocking=False):
            try:
                while batch := self._take():
                    self._commit(batch)
            finally:
                self.lead.release()
            if self.jobs.empty():
                return

    def lingering(self) -> bool:
        """Whether a lingering job should wait for company now (not during a pause)."""
        if self._resting:
            self._resting -= 1
            return False
        return True

    def lingered(self, joined: bool) -> None:
        """Count a linger's outcome; after MISSES_BEFORE_REST misses in a row, pause lingering
        for a while (longer each time it keeps missing). A race here only skews a heuristic."""
        if joined:
            self._misses, self._rest = 0, REST
            return
        self._misses += 1
        if self._misses >= MISSES_BEFORE_REST:
            self._resting, self._misses = self._rest, 0
            self._rest = min(self._rest * 2, MAX_REST)

    def close(self) -> None:
        with self.lead:
            with self._lobby_lock:
                for job in self._lobby:
                    self.jobs.put(job)
                self._lobby.clear()
            while batch := self._take():
                self._commit(batch)
            self._closed = True
            self._conn.close()

    def _take(self, *, company: bool = False) -> list[_Job]:
        """The queued jobs and, if there are some (or the caller has a job), the lobby's."""
        batch: list[_Job] = []
        while True:
            try:
                batch.append(self.jobs.get_nowait())
            except queue.Empty:
                break
        if (batch or company) and self._lobby:
            with self._lobby_lock:
                batch = self._lobby + batch
                self._lobby.clear()
        return batch

    def _commit(self, batch: list[_Job]) -> None:
        self._run(batch)
        for job in batch:
            if job.future is not None:
                ok, value = job.outcome
                if ok:
                    job.future.set_result(value)
                else:
                    job.future.set_exception(value)

    def _run(self, batch: list[_Job]) -> None:
        """Run a batch in one transaction and set each job's outcome. Without savepoints (each
        costs statements, and statements cost GIL round trips): if one job fails, the whole
        transaction is rolled back, that job gets its error and the others run again alone."""
        conn, failed = self._conn, None
        run = partial(execute, conn, self._queries)
        try:
            if self._closed:
                raise sqlite3.ProgrammingError("the saver's connection was closed")
            conn.execute("BEGIN IMMEDIATE")
            for job in batch:
                try:
                    job.outcome = (True, drive(job.op or job.make(), run, job.first))
                except Exception as exc:
                    job.outcome, failed = (False, exc), job
                    break
            conn.execute("COMMIT" if failed is None else "ROLLBACK")
        except sqlite3.Error as exc:  # the transaction itself failed: nothing was written
            if not self._closed and conn.in_transaction:
                conn.execute("ROLLBACK")
            failure = StoreUnavailable(f"SQLite write to {self._path!r} failed: {exc}")
            failure.__cause__ = exc
            for job in batch:
                job.outcome = (False, failure)
            return
        if failed is not None and len(batch) > 1:
            for job in batch:
                if job is not failed:
                    job.op = job.first = None
                    self._run([job])


def execute(conn: sqlite3.Connection, queries: Queries, query: Query) -> Any:
    sql = queries.sql(query)
    if query.many:
        conn.executemany(sql, cast("list[dict[str, Any]]", query.params))
        return None
    cursor = conn.execute(sql, cast("dict[str, Any]", query.params))
    return cursor.rowcount if cursor.description is None else cursor.fetchall()


class SqliteDatabase:
    """TetherSaver's tables in a SQLite file."""

    def __init__(self, url: str, *, busy_timeout: float = 30.0) -> None:
        self.url = url
        self.path, self.synchronous = parse_sqlite_url(url)
        self._busy_timeout = busy_timeout
        self._created = False  # the file made private (0600) before its first connection
        self._queries = Queries(__package__, "sqlite")
        self._lock = threading.Lock()
        self._writer: _Writer | None = None
        self._readers: list[tuple[int, sqlite3.Connection]] = []
        self._generation = 0

    def _connect(self) -> sqlite3.Connection:
        if not self._created:
            create_private(self.path)
            self._created = True
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=self._busy_timeout
        )
        # WAL stays set in the file. Switching to it needs the file to itself and does not wait
        # for other connections (a new file opened by several at once): try again meanwhile.
        deadline = time.monotonic() + self._busy_timeout
        while conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            try:
                conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        return conn

    def _open(self) -> _Writer:
        writer = self._writer
        if writer is not None:
            return writer
        with self._lock:
            if self._writer is None:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                try:
                    conn = self._connect()
                    migrate(conn, self._queries.migrations)
                except sqlite3.Error as exc:
                    raise StoreUnavailable(
                        f"cannot open SQLite database {self.path!r} for LangGraph: {exc}"
                    ) from exc
                self._writer = _Writer(conn, self._queries, self.path)
            return self._writer

    def close(self) -> None:
        """Finish the queued writes and close every connection; using the database again
        opens it again."""
        with self._lock:
            writer, self._writer = self._writer, None
            readers, self._readers = self._readers, []
            self._generation += 1
        if writer is not None:
            writer.close()
        for _, conn in readers:
            conn.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # -- running operations ---------------------------------------------------------------

    def run(
        self, make: Callable[[], Op[T]], *, write: bool, linger: bool = False, blind: bool = False
    ) -> T:
        # `blind` changes nothing here: a statement in the file costs no round trip to save.
        if not write:
            self._open()
            return self._read(make())
        op = make()
        first, result = prime(op)  # encode in the caller's thread, not the leader's
        if first is None:
            return cast(T, result)
        return self._open().write(make, op, first, linger)

    async def arun(
        self, make: Callable[[], Op[T]], *, write: bool, linger: bool = False, blind: bool = False
    ) -> T:
        if not write:
            return await asyncio.to_thread(self.run, make, write=False)
        writer = self._writer
        if writer is None:
            writer = await asyncio.to_thread(self._open)
        lingering = linger and writer.lingering()
        job = writer.enqueue(make, linger=lingering)  # made and encoded by the leader, off the loop
        loop = asyncio.get_running_loop()
        if lingering:
            loop.call_later(LINGER, self._kick, loop, writer, job)
        else:
            self._kick(loop, writer, None)
        return cast(T, await asyncio.wrap_future(cast("concurrent.futures.Future[T]", job.future)))

    @staticmethod
    def _kick(loop: asyncio.AbstractEventLoop, writer: _Writer, lingered: _Job | None) -> None:
        """Have a worker thread lead; after a linger, only if nobody took the job meanwhile."""
        if lingered is not None:
            loop.run_in_executor(None, writer.leave_lobby, lingered)
        elif not writer.lead.locked():
            loop.run_in_executor(None, writer.serve)

    def _read(self, op: Op[T]) -> T:
        with self._lock:
            generation = self._generation
            taken = self._readers.pop() if self._readers else None
        conn = taken[1] if taken is not None else self._connect()
        try:
            conn.execute("BEGIN")  # one snapshot for all of the operation's queries
            return drive(op, partial(execute, conn, self._queries))
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            with self._lock:
                kept = generation == self._generation and len(self._readers) < IDLE_READERS
                if kept:
                    self._readers.append((generation, conn))
            if not kept:
                conn.close()


def migrate(conn: sqlite3.Connection, migrations: list[tuple[int, str]]) -> None:
    """Apply the migrations not yet recorded in tether_lg_migrations, in one transaction that
    holds the write lock (so two processes opening the file at once do not both apply them)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS tether_lg_migrations "
            "(version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
        )
        done = {row[0] for row in conn.execute("SELECT version FROM tether_lg_migrations")}
        for version, sql in migrations:
            if version in done:
                continue
            code = "\n".join(ln for ln in sql.splitlines() if not ln.lstrip().startswith("--"))
            for statement in filter(str.strip, code.split(";")):
                conn.execute(statement)
            conn.execute("INSERT INTO tether_lg_migrations VALUES (?, ?)", (version, time.time()))
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise

"""The SQLite backend of the Store port, with group commit.

One writer thread owns the connection. Operations queue up while a commit is in flight; the
thread then runs everything queued in one BEGIN IMMEDIATE transaction (a SAVEPOINT per operation
keeps each one atomic on its own) and one COMMIT, so many runs share one fsync. WAL mode and
synchronous=FULL by default: a checkpoint is durable when its operation returns. SQL lives in
sql/sqlite/*.sql. This module must not import tether.core.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

from tether import faults
from tether.errors import ConfigurationError, LeaseLost, RunNotFound, StoreUnavailable
from tether.store.base import (
    Checkpoint,
    CheckpointStatus,
    HeartbeatReply,
    Lease,
    NewRun,
    RunRecord,
    RunStatus,
    WorkerInfo,
)

T = TypeVar("T")

RUN_COLUMNS = (
    "id, workflow, status, args, result, error, owner, epoch, lease_expires_at, wake_at,"
    " deadline_at, cancel_requested, created_at, updated_at, finished_at"
)
_SYNC_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")


def _load_sql() -> tuple[dict[str, str], list[tuple[int, str]]]:
    folder = resources.files("tether.store") / "sql" / "sqlite"
    queries: dict[str, str] = {}
    name = None
    for line in (folder / "queries.sql").read_text().splitlines():
        if line.startswith("-- name:"):
            name = line.split(":", 1)[1].strip()
            queries[name] = ""
        elif name is not None and not line.startswith("--"):
            queries[name] += line + "\n"
    queries = {k: v.strip().format(run_columns=RUN_COLUMNS) for k, v in queries.items()}
    migrations = sorted(
        (int(f.name.split("_", 1)[0]), f.read_text())
        for f in folder.iterdir()
        if f.name[:4].isdigit() and f.name.endswith(".sql")
    )
    return queries, migrations


_Q, _MIGRATIONS = _load_sql()
_UPSERT_CHECKPOINT = _Q["upsert_checkpoint"]


def _run(row: Sequence[Any]) -> RunRecord:
    return RunRecord(
        id=row[0],
        workflow=row[1],
        status=RunStatus(row[2]),
        args=row[3],
        result=row[4],
        error=row[5],
        owner=row[6],
        epoch=row[7],
        lease_expires_at=row[8],
        wake_at=row[9],
        deadline_at=row[10],
        cancel_requested=bool(row[11]),
        created_at=row[12],
        updated_at=row[13],
        finished_at=row[14],
    )


def _checkpoint(row: Sequence[Any]) -> Checkpoint:
    return Checkpoint(
        seq=row[0],
        name=row[1],
        kind=row[2],
        status=CheckpointStatus(row[3]),
        result=row[4],
        error=row[5],
        attempts=row[6],
        started_at=row[7],
        finished_at=row[8],
        retry_at=row[9],
    )


def _lease_lost(conn: sqlite3.Connection, lease: Lease) -> LeaseLost:
    row = conn.execute(
        "SELECT owner, epoch, status FROM tether_runs WHERE id = ?", (lease.run_id,)
    ).fetchone()
    now = "is gone" if row is None else f"is {row[2]}, owner {row[0]!r}, epoch {row[1]}"
    return LeaseLost(
        f"worker {lease.worker_id!r} lost run {lease.run_id!r} (it held epoch {lease.epoch}; "
        f"the run {now}); this worker stops executing it"
    )


@dataclass(slots=True)
class _Op:
    fn: Callable[[sqlite3.Connection], Any]
    write: bool
    label: str
    multi: bool  # writes with more than one statement: needs a savepoint to stay atomic
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any] | None  # None when executed at once, on the caller's turn
    outcome: tuple[bool, Any] = field(default=(False, None))


def _deliver(ops: list[_Op]) -> None:
    for op in ops:
        if op.future is None or op.future.done():
            continue
        ok, value = op.outcome
        if ok:
            op.future.set_result(value)
        else:
            op.future.set_exception(value)


def parse_sqlite_url(url: str) -> tuple[str, str]:
    """(path, synchronous mode) from sqlite:///relative.db or sqlite:////abs.db?synchronous=OFF."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise ConfigurationError(f"not a sqlite URL: {url!r}; use sqlite:///path/to/file.db")
    path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
    if not path:
        raise ConfigurationError(f"the sqlite URL {url!r} names no file; use sqlite:///file.db")
    sync = parse_qs(parts.query).get("synchronous", ["FULL"])[0].upper()
    if sync not in _SYNC_MODES:
        raise ConfigurationError(f"synchronous={sync!r} in {url!r}: use one of {_SYNC_MODES}")
    return path, sync


def _locked(exc: sqlite3.OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


class _Busy(Exception):
    """Another connection holds the write lock: the inline path hands the batch to the thread."""


class SqliteStore:
    """Store on one SQLite file; several processes may share the file."""

    def __init__(self, url: str, *, busy_timeout: float = 30.0) -> None:
        self.url = url
        self.path, self.synchronous = parse_sqlite_url(url)
        self._busy_timeout = busy_timeout
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None  # the writer thread's
        self._inline: sqlite3.Connection | None = None  # the event loop's, never waits on locks
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batch: list[_Op] = []
        self._queued = 0  # operations handed to the thread and not yet done

    def _connect(self, busy_timeout: float) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=busy_timeout
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        return conn

    async def open(self) -> None:
        if self._thread is not None:
            return
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = self._connect(self._busy_timeout)
            self._migrate(conn)
            self._inline = self._connect(0)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open SQLite database {self.path!r}: {exc}") from exc
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._writer, name="tether-sqlite", daemon=True)
        self._thread.start()

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS tether_migrations "
                "(version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM tether_migrations")}
            for version, sql in _MIGRATIONS:
                if version not in done:
                    code = "\n".join(ln for ln in sql.splitlines() if not ln.startswith("--"))
                    for statement in filter(str.strip, code.split(";")):
                        conn.execute(statement)
                    conn.execute(
                        "INSERT INTO tether_migrations VALUES (?, "
                        "(julianday('now') - 2440587.5) * 86400.0)",
                        (version,),
                    )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        if self._thread is None:
            return
        if self._batch:
            self._flush()
        self._queue.put(None)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        self._thread = None
        for conn in (self._conn, self._inline):
            if conn is not None:
                conn.close()
        self._conn = self._inline = None

    # Group commit has two paths. Operations submitted from the event loop that opened the
    # store collect during one loop iteration and are flushed at its end, on the loop itself,
    # in one transaction: no thread hop, and every run that became ready in that iteration
    # shares the commit. If another connection holds the write lock (another process, or the
    # thread), the batch goes to the writer thread, which waits for the lock without blocking
    # the loop. Operations from other loops always go to the thread.

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        if self._queued or self._inline is None:
            self._hand_over(batch)
            return
        try:
            self._execute(self._inline, batch)
        except _Busy:
            self._hand_over(batch)
            return
        _deliver(batch)

    def _hand_over(self, batch: list[_Op]) -> None:
        self._queued += len(batch)
        for op in batch:
            self._queue.put(op)

    def _writer(self) -> None:
        conn = self._conn
        assert conn is not None
        stop = False
        while not stop:
            batch: list[_Op] = []
            item: _Op | None = self._queue.get()
            while True:
                if item is None:
                    stop = True
                else:
                    batch.append(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if not batch:
                continue
            while True:
                try:
                    self._execute(conn, batch)
                    break
                except _Busy:  # the busy timeout ran out: keep waiting, never drop work
                    continue
            by_loop: dict[asyncio.AbstractEventLoop, list[_Op]] = {}
            for op in batch:
                by_loop.setdefault(op.loop, []).append(op)
            for loop, ops in by_loop.items():
                # A loop that closed while waiting has nobody left to tell (RuntimeError).
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._delivered, ops)

    def _delivered(self, ops: list[_Op]) -> None:
        if ops[0].loop is self._loop:
            self._queued -= len(ops)
        _deliver(ops)

    def _execute(self, conn: sqlite3.Connection, batch: list[_Op]) -> None:
        """Run a batch in one transaction; each operation's outcome is set on it. Raises _Busy
        (nothing done) if the write lock cannot be had now."""
        if len(batch) == 1 and not batch[0].multi and not faults.ENABLED:
            # One single-statement operation: SQLite's implicit transaction is its atomic unit,
            # which saves the BEGIN and COMMIT round trips. (With fault sites enabled the
            # explicit path runs, so that "before commit" exists to be hit.)
            op = batch[0]
            try:
                op.outcome = (True, op.fn(conn))
            except sqlite3.OperationalError as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if _locked(exc):
                    raise _Busy() from exc
                self._fail_all(batch, exc)
            except Exception as exc:
                op.outcome = (False, exc)
            return
        writes = any(op.write for op in batch)
        # A statement is atomic by itself, and one operation alone has the transaction as its
        # atomic unit: only multi-statement writes sharing a batch need savepoints.
        shared = len(batch) > 1
        if writes:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if _locked(exc):
                    raise _Busy() from exc
                self._fail_all(batch, exc)
                return
        try:
            for op in batch:
                if op.write:
                    faults.hit("store.before_write", op.label)
                savepoint = shared and op.multi
                if savepoint:
                    conn.execute("SAVEPOINT op")
                try:
                    op.outcome = (True, op.fn(conn))
                except Exception as exc:
                    op.outcome = (False, exc)
                    if savepoint:
                        conn.execute("ROLLBACK TO op")
                    elif op.multi:  # alone in its transaction: undo it whole
                        conn.execute("ROLLBACK")
                        conn.execute("BEGIN IMMEDIATE")
                if savepoint:
                    conn.execute("RELEASE op")
            if writes:
                for op in batch:
                    faults.hit("store.before_commit", op.label)
                conn.execute("COMMIT")
                for op in batch:
                    faults.hit("store.after_commit", op.label)
        except Exception as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._fail_all(batch, exc)

    def _fail_all(self, batch: list[_Op], exc: Exception) -> None:
        failure = StoreUnavailable(f"SQLite write to {self.path!r} failed: {exc}")
        failure.__cause__ = exc
        for op in batch:
            op.outcome = (False, failure)

    async def _submit(
        self,
        fn: Callable[[sqlite3.Connection], T],
        *,
        write: bool,
        label: str = "",
        multi: bool = False,
    ) -> T:
        if self._thread is None:
            raise StoreUnavailable(f"the SQLite store {self.path!r} is not open; call open() first")
        loop = asyncio.get_running_loop()
        if loop is self._loop and not (
            self._batch or self._queued or getattr(loop, "_ready", True) or self._inline is None
        ):
            # Nothing else is ready (CPython's private ready queue is empty): waiting for a
            # loop iteration would only add latency, so commit now, on this call.
            op = _Op(fn, write, label, multi, loop, None)
            try:
                self._execute(self._inline, [op])
            except _Busy:
                pass  # another connection holds the lock: the thread waits for it below
            else:
                ok, value = op.outcome
                if ok:
                    return value  # type: ignore[no-any-return]
                raise value
        future: asyncio.Future[T] = loop.create_future()
        op = _Op(fn, write, label, multi, loop, future)
        if loop is not self._loop:
            self._queue.put(op)
        elif self._queued or self._inline is None:
            self._hand_over([op])
        else:
            # Others are about to run in this loop iteration: let them join the commit.
            self._batch.append(op)
            if len(self._batch) == 1:
                loop.call_soon(self._flush)
        return await future

    # -- the port ---------------------------------------------------------------------------

    async def register_worker(self, worker: WorkerInfo, now: float) -> None:
        args = {
            "id": worker.id,
            "host": worker.host,
            "pid": worker.pid,
            "pid_token": worker.pid_token,
            "started_at": worker.started_at,
            "now": now,
        }
        await self._submit(lambda c: c.execute(_Q["upsert_worker"], args), write=True)

    async def list_workers(self, host: str | None = None) -> list[WorkerInfo]:
        def op(c: sqlite3.Connection) -> list[WorkerInfo]:
            return [WorkerInfo(*row) for row in c.execute(_Q["list_workers"], {"host": host})]

        return await self._submit(op, write=False)

    async def release_worker(self, worker_id: str, now: float) -> list[str]:
        def op(c: sqlite3.Connection) -> list[str]:
            rows = c.execute(_Q["release_worker_runs"], {"id": worker_id, "now": now})
            ids = sorted(r[0] for r in rows)
            c.execute(_Q["delete_worker"], {"id": worker_id})
            return ids

        return await self._submit(op, write=True, label=f"release_worker:{worker_id}", multi=True)

    async def heartbeat(
        self, worker_id: str, leases: Sequence[Lease], lease_until: float, now: float
    ) -> HeartbeatReply:
        def op(c: sqlite3.Connection) -> HeartbeatReply:
            lost, cancel = [], []
            for lease in leases:
                row = c.execute(
                    _Q["extend_lease"],
                    {
                        "run_id": lease.run_id,
                        "worker": worker_id,
                        "epoch": lease.epoch,
                        "lease_until": lease_until,
                    },
                ).fetchone()
                if row is None:
                    lost.append(lease.run_id)
                elif row[0]:
                    cancel.append(lease.run_id)
            c.execute(_Q["touch_worker"], {"id": worker_id, "now": now})
            return HeartbeatReply(lost=lost, cancel=cancel)

        return await self._submit(op, write=True, label="heartbeat", multi=True)

    async def create_run(
        self,
        run: NewRun,
        now: float,
        *,
        owner: str | None = None,
        lease_until: float | None = None,
    ) -> tuple[RunRecord, bool]:
        status = RunStatus.RUNNING if owner else RunStatus.PENDING
        epoch = 1 if owner else 0
        lease = lease_until if owner else None
        args = {
            "id": run.id,
            "workflow": run.workflow,
            "args": run.args,
            "now": now,
            "deadline_at": run.deadline_at,
            "owner": owner,
            "status": status.value,
            "epoch": epoch,
            "lease_expires_at": lease,
        }

        def op(c: sqlite3.Connection) -> tuple[RunRecord, bool]:
            if c.execute(_Q["insert_run"], args).rowcount == 1:
                created = RunRecord(
                    id=run.id,
                    workflow=run.workflow,
                    status=status,
                    args=run.args,
                    owner=owner,
                    epoch=epoch,
                    lease_expires_at=lease,
                    deadline_at=run.deadline_at,
                    created_at=now,
                    updated_at=now,
                )
                return created, True
            return _run(c.execute(_Q["get_run"], {"id": run.id}).fetchone()), False

        return await self._submit(op, write=True, label=f"create_run:{run.id}")

    async def get_run(self, run_id: str) -> RunRecord | None:
        def op(c: sqlite3.Connection) -> RunRecord | None:
            row = c.execute(_Q["get_run"], {"id": run_id}).fetchone()
            return None if row is None else _run(row)

        return await self._submit(op, write=False)

    async def list_runs(
        self,
        *,
        statuses: Sequence[RunStatus] = (),
        workflow: str | None = None,
        limit: int = 100,
    ) -> list[RunRecord]:
        args = {
            "any_status": not statuses,
            "statuses": json.dumps([str(s) for s in statuses]),
            "workflow": workflow,
            "limit": max(0, limit),
        }
        return await self._submit(
            lambda c: [_run(r) for r in c.execute(_Q["list_runs"], args)], write=False
        )

    async def claim_runs(
        self,
        worker_id: str,
        workflows: Sequence[str],
        now: float,
        lease_until: float,
        limit: int,
    ) -> list[RunRecord]:
        args = {
            "worker": worker_id,
            "workflows": json.dumps(list(workflows)),
            "now": now,
            "lease_until": lease_until,
            "limit": limit,
        }

        def op(c: sqlite3.Connection) -> list[RunRecord]:
            runs = [_run(r) for r in c.execute(_Q["claim_runs"], args).fetchall()]
            return sorted(runs, key=lambda r: (r.created_at, r.id))  # RETURNING has no order

        return await self._submit(op, write=True, label="claim_runs")

    async def next_wake_at(self, workflows: Sequence[str]) -> float | None:
        args = {"workflows": json.dumps(list(workflows))}

        def op(c: sqlite3.Connection) -> float | None:
            value = c.execute(_Q["next_wake_at"], args).fetchone()[0]
            return None if value is None else float(value)

        return await self._submit(op, write=False)

    async def load_history(self, run_id: str) -> list[Checkpoint]:
        return await self._submit(
            lambda c: [_checkpoint(r) for r in c.execute(_Q["load_history"], {"run_id": run_id})],
            write=False,
        )

    async def write_checkpoint(self, lease: Lease, checkpoint: Checkpoint, now: float) -> None:
        cp = checkpoint
        args = (
            lease.run_id,
            cp.seq,
            cp.name,
            cp.kind,
            cp.status.value,
            cp.result,
            cp.error,
            cp.attempts,
            cp.started_at,
            cp.finished_at,
            cp.retry_at,
            lease.worker_id,
            lease.epoch,
        )

        def op(c: sqlite3.Connection) -> None:
            if c.execute(_UPSERT_CHECKPOINT, args).rowcount != 1:
                raise _lease_lost(c, lease)

        label = f"write_checkpoint:{cp.name}:{cp.status.value}" if faults.ENABLED else ""
        await self._submit(op, write=True, label=label)

    def _fenced(
        self, lease: Lease, query: str, **extra: Any
    ) -> Callable[[sqlite3.Connection], None]:
        args = {"run_id": lease.run_id, "worker": lease.worker_id, "epoch": lease.epoch, **extra}

        def op(c: sqlite3.Connection) -> None:
            if c.execute(_Q[query], args).rowcount != 1:
                raise _lease_lost(c, lease)

        return op

    async def suspend_run(self, lease: Lease, wake_at: float | None, now: float) -> None:
        await self._submit(
            self._fenced(lease, "suspend_run", wake_at=wake_at, now=now),
            write=True,
            label=f"suspend_run:{lease.run_id}",
        )

    async def finish_run(
        self,
        lease: Lease,
        status: RunStatus,
        result: str | None,
        error: str | None,
        now: float,
    ) -> None:
        if not RunStatus(status).terminal:
            raise ValueError(f"finish_run needs a terminal status, not {status!r}")
        op = self._fenced(
            lease, "finish_run", status=str(status), result=result, error=error, now=now
        )
        await self._submit(op, write=True, label=f"finish_run:{lease.run_id}")

    async def cancel_run(self, run_id: str, error: str, now: float) -> RunRecord:
        def op(c: sqlite3.Connection) -> RunRecord:
            args = {"id": run_id, "error": error, "now": now}
            if c.execute(_Q["cancel_unowned"], args).rowcount == 0:
                c.execute(_Q["cancel_owned"], args)
            row = c.execute(_Q["get_run"], {"id": run_id}).fetchone()
            if row is None:
                raise RunNotFound(f"no run has id {run_id!r}; check the id with `tether runs list`")
            return _run(row)

        return await self._submit(op, write=True, label=f"cancel_run:{run_id}", multi=True)

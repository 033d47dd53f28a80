"""The connections of one SQLite file and their group commit.

Operations (functions of a connection) submitted from the event loop that opened the file
collect during one loop iteration and commit together at its end, on the loop, in one
transaction; when nothing else is ready an operation commits at once. When another connection
holds the write lock, the batch goes to a writer thread that waits for it without blocking the
loop. It knows nothing of runs, checkpoints or queries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

from tether import faults
from tether.errors import ConfigurationError, StoreUnavailable
from tether.store.drivers.ready import others_ready
from tether.store.query import check_schema

T = TypeVar("T")
log = logging.getLogger("tether.store")
SYNC_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
JOURNAL_SIZE_LIMIT = 16 * 1024 * 1024  # bytes of -wal file kept after a checkpoint
PRIVATE = 0o600  # a new database file's mode: its owner alone reads it (-wal, -shm follow)


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
    if sync not in SYNC_MODES:
        raise ConfigurationError(f"synchronous={sync!r} in {url!r}: use one of {SYNC_MODES}")
    return path, sync


def sqlite_migrates(url: str) -> bool:
    """Whether opening the file at `url` applies missing migrations: yes unless the URL says
    `migrate=false` (then a schema older than the code is an error naming `tether migrate`)."""
    value = parse_qs(urlsplit(url).query).get("migrate", ["true"])[0].lower()
    if value not in ("true", "false"):
        raise ConfigurationError(f"migrate={value!r} in {url!r}: use migrate=true or false")
    return value == "true"


# Filesystem types whose files other machines may open too (/proc/mounts' third field).
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "glusterfs", "fuse.glusterfs",
    "ceph", "fuse.ceph", "afs", "lustre", "gpfs", "fuse.s3fs", "fuse.rclone", "davfs",
})  # fmt: skip


def network_filesystem(path: str, mounts: str = "/proc/mounts") -> str | None:
    """The type of the network filesystem holding `path`, or None (a local one, or unknown)."""
    try:
        with open(mounts, encoding="utf-8") as f:
            table = [line.split() for line in f]
    except OSError:
        return None
    where = os.path.realpath(os.path.dirname(os.path.abspath(path)) or ".")
    best, kind = "", None
    for fields in table:
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind if kind in NETWORK_FILESYSTEMS else None


def create_private(path: str) -> None:
    """Create the database file with mode 0600, whatever the umask, if it does not exist yet:
    SQLite creates its -wal and -shm files with the main file's mode, so they are 0600 too. An
    existing file keeps its mode (an operator may share it on purpose), with a warning when
    other users can read it."""
    if path == ":memory:" or path.startswith("file:"):
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE)
    except FileExistsError:
        with contextlib.suppress(OSError):
            mode = os.stat(path).st_mode & 0o777
            if mode & 0o077:
                log.warning(
                    "the SQLite file %s has mode %s: other users of this machine may read "
                    "it (checkpoints, approvals, token digests); make it private with "
                    "`chmod 600 %s*` unless you share it on purpose",
                    path,
                    oct(mode),
                    path,
                )
        return
    try:
        os.fchmod(fd, PRIVATE)  # the umask may have taken bits away (0o277 would leave 0400)
    finally:
        os.close(fd)


def _locked(exc: sqlite3.OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


# A row of tether_migrations saying its versions are numbered like PostgreSQL's (the same file
# names in sql/sqlite/ and sql/postgres/). Files made before that numbered SQLite's mailboxes
# and child runs 0002 (now part of 0001) and every later migration one higher.
NUMBERED = 0


def _renumber(conn: sqlite3.Connection, done: set[int], path: str) -> set[int]:
    """Translate a file's recorded migrations to the shared numbering (in the migration's
    transaction) and mark it as translated; a new file is only marked."""
    if done and not {1, 2} <= done:
        raise ConfigurationError(
            f"the SQLite database {path!r} was made by a development version of Tether whose "
            f"schema no release had (migrations {sorted(done)}); start a new file, or open it "
            f"once with the version that made it and export what you need"
        )
    renumbered = ({1} if done else set()) | {v - 1 for v in done if v >= 3}
    conn.execute("DELETE FROM tether_migrations WHERE version > 1")
    conn.executemany(
        "INSERT INTO tether_migrations VALUES (?, (julianday('now') - 2440587.5) * 86400.0)",
        [(v,) for v in [*sorted(renumbered - {1}), NUMBERED]],
    )
    return renumbered | {NUMBERED}


class _Busy(Exception):
    """Another connection holds the write lock: the inline path hands the batch to the thread."""


class CommitQueue:
    """One SQLite file's connections and its group commit; operations are functions of a
    connection, run whole in a transaction."""

    def __init__(
        self,
        path: str,
        synchronous: str,
        migrations: list[tuple[int, str]],
        *,
        busy_timeout: float = 30.0,
        migrate: bool = True,
    ) -> None:
        self.path, self.synchronous = path, synchronous
        self._migrations = migrations
        self._migrates = migrate  # False: check the schema, never change it
        self._busy_timeout = busy_timeout
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None  # the writer thread's
        self._inline: sqlite3.Connection | None = None  # the event loop's, never waits on locks
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batch: list[_Op] = []
        self._queued = 0  # operations handed to the thread and not yet done
        self._data_version: int | None = None

    def _connect(self, busy_timeout: float, *, setup: bool = False) -> sqlite3.Connection:
        # Processes opening a new file at once race to set it up: SQLite answers "locked" at
        # once, without waiting, where waiting could deadlock (two connections both wanting
        # to switch the file to WAL). Such a connection tries again, within the busy timeout.
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                return self._configure(busy_timeout, setup)
            except sqlite3.OperationalError as exc:
                if not _locked(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _configure(self, busy_timeout: float, setup: bool) -> sqlite3.Connection:
        # The settings below may wait for another process's lock (one creating the file):
        # they always get the store's busy timeout; `busy_timeout` applies from then on
        # (0 for the inline connection, which hands busy work to the writer thread).
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=self._busy_timeout
        )
        try:
            self._settings(conn, busy_timeout, setup)
        except BaseException:
            conn.close()
            raise
        return conn

    def _settings(self, conn: sqlite3.Connection, busy_timeout: float, setup: bool) -> None:
        if setup:
            # Before journal_mode (which writes the file's first page): a new database frees
            # pages incrementally (retention compacts it); an existing one keeps its mode.
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        # A -wal file that a long reader made grow is cut back to this size once it is
        # checkpointed and written again (docs/retention.md).
        conn.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")

    @property
    def is_open(self) -> bool:
        return self._thread is not None

    async def open(self) -> None:
        if self._thread is not None:
            return
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        shared = network_filesystem(self.path)
        if shared is not None:
            log.warning(
                "the SQLite file %s is on a network filesystem (%s): SQLite's locks may not "
                "hold there, and workers on other machines would judge leases by their own "
                "clocks; keep every process on one machine, or use PostgreSQL",
                self.path,
                shared,
            )
        try:
            create_private(self.path)
            conn = self._connect(self._busy_timeout, setup=True)
            self._migrate(conn)
            self._inline = self._connect(0)
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"cannot open SQLite database {self.path!r}: {exc}") from exc
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._writer, name="tether-sqlite", daemon=True)
        self._thread.start()

    def _migrate(self, conn: sqlite3.Connection) -> None:
        try:
            self._apply(conn)
        except ConfigurationError:
            conn.close()  # open() gives up on this file: nothing else would close it
            raise

    def _apply(self, conn: sqlite3.Connection) -> None:
        known = {v for v, _ in self._migrations} | {NUMBERED}
        if not self._migrates:
            recorded = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tether_migrations'"
            ).fetchone()
            done = set()
            if recorded:
                done = {r[0] for r in conn.execute("SELECT version FROM tether_migrations")}
            check_schema(done, known, repr(self.path), migrate=False)
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS tether_migrations "
                "(version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM tether_migrations")}
            if NUMBERED not in done:
                done = _renumber(conn, done, self.path)
            check_schema(done, known, repr(self.path), migrate=True)
            for version, sql in self._migrations:
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
                self._run_one(conn, op, savepoint=shared and op.multi)
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

    def _run_one(self, conn: sqlite3.Connection, op: _Op, *, savepoint: bool) -> None:
        """One operation of a batch, in its transaction. An error of the operation's own (a
        lost lease) is its outcome, and its writes are undone; an error of the database (disk
        full, I/O) propagates and fails the whole batch, which SQLite may have rolled back
        already: nothing of it is half kept, and every caller is told to retry."""
        if savepoint:
            conn.execute("SAVEPOINT op")
        try:
            op.outcome = (True, op.fn(conn))
        except sqlite3.OperationalError:
            raise
        except Exception as exc:
            op.outcome = (False, exc)
            if savepoint:
                conn.execute("ROLLBACK TO op")
            elif op.multi:  # alone in its transaction: undo it whole
                conn.execute("ROLLBACK")
                conn.execute("BEGIN IMMEDIATE")
        if savepoint:
            conn.execute("RELEASE op")

    def _fail_all(self, batch: list[_Op], exc: Exception) -> None:
        failure = StoreUnavailable(self._explain(exc))
        failure.__cause__ = exc
        for op in batch:
            op.outcome = (False, failure)

    def _explain(self, exc: Exception) -> str:
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_FULL:
            return (
                f"the SQLite database {self.path!r} is full (no space left on its disk, or "
                f"PRAGMA max_page_count reached): nothing of this write was stored. Free disk "
                f"space, then try again; running workflows retry their own writes and go on "
                f"once there is room"
            )
        return f"SQLite write to {self.path!r} failed: {exc}"

    async def submit(
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
            self._batch or self._queued or others_ready(loop) or self._inline is None
        ):
            # Nothing else is ready: waiting for a loop iteration would only add latency, so
            # commit now, on this call.
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

    async def submit_to_thread(
        self, fn: Callable[[sqlite3.Connection], T], *, write: bool, label: str = ""
    ) -> T:
        """Like submit, but always run by the writer thread, never on the event loop: for
        operations that take a while (retention's batches), so the loop goes on meanwhile.
        Operations submitted while it runs wait for it, then commit."""
        if self._thread is None:
            raise StoreUnavailable(f"the SQLite store {self.path!r} is not open; call open() first")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        op = _Op(fn, write, label, True, loop, future)
        if loop is self._loop:
            self._hand_over([op])
        else:
            self._queue.put(op)
        return await future

    def apply_pragma(self, pragma: str) -> None:
        """Run `PRAGMA <pragma>` on every open connection of the file, for settings SQLite
        keeps per connection (a test fills the database with `max_page_count = N`). It takes
        effect between two statements of the writer thread."""
        for conn in (self._conn, self._inline):
            if conn is not None:
                conn.execute(f"PRAGMA {pragma}")

    async def poll_changes(self) -> bool:
        """Whether another connection committed since the last call (PRAGMA data_version:
        cheap, so read directly, without a trip through the batching)."""
        conn = self._inline
        if conn is None:
            return False
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        changed = version != self._data_version
        self._data_version = version
        return bool(changed)

"""The engine's shared parts: the store, serializer, clock, settings and registered workflows.

One Engine per App. It wires things together and holds no execution logic; the runner, the
worker and the step machinery receive it. It never imports a backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tether.clock import Clock, DatabaseClock
from tether.core.observe import Observer, combine
from tether.serde import Serde
from tether.store.port import QueueLimits, RunRecord, Store

log = logging.getLogger("tether.worker")

if TYPE_CHECKING:
    from tether.core.keepalive import Fence
    from tether.core.worker import Worker
    from tether.core.workflow import Workflow


@dataclass(frozen=True, slots=True)
class Settings:
    lease_duration: float = 15.0  # seconds a lease lasts without a heartbeat
    inline_wait_max: float = 2.0  # waits up to this long hold the lease; longer ones suspend
    max_held_waits: int = 1000  # waits held in memory at once; beyond, waiting runs suspend
    store_outage: float = 60.0  # how long a run retries its writes while the database is away
    poll_interval: float = 1.0  # fallback for work created by other processes
    concurrency: int = 1000  # runs one worker executes at once
    force_replay: bool = False  # replay the run from the store after every new checkpoint
    queues: tuple[str, ...] | None = None  # the queues this worker serves (None: all)
    # Poison runs (docs/semantics.md, "Dead letters"): executions of a run that fail outside
    # the workflow's code (an undecodable checkpoint...) are tried again after failure_backoff
    # seconds, doubled each time up to max_failure_backoff; the max_executions-th in a row
    # leaves the run dead. A run due for unserved_grace seconds whose workflow no live worker
    # serves is dead too (None: never); each worker looks every unserved_check seconds.
    max_executions: int = 5
    failure_backoff: float = 1.0
    max_failure_backoff: float = 60.0
    unserved_grace: float | None = 600.0
    unserved_check: float = 60.0
    # A held run (its replay diverged) is tried again after failure_backoff seconds, doubled
    # each time up to held_retry_max, and at once whenever a worker starts.
    held_retry_max: float = 300.0
    # How long a stopping worker waits for sync step bodies (threads cannot be interrupted).
    shutdown_grace: float = 15.0
    # How long a stopping worker first drains (docs/versions.md): it claims nothing more, lets
    # the step attempts in flight finish and record, and gives each run back once nothing of
    # it is in flight; 0 (the library's default) interrupts at once. `tether worker`: 30.
    drain_timeout: float = 0.0
    # The application version this worker declares (docs/versions.md): a run is pinned to the
    # version of its first claim and executed only by workers of it. None: a digest of the
    # registered workflows' code (tether.core.versions.code_version). Runs of a version that
    # has no live worker left are taken over by the others (version_handoff; False: they wait
    # for a worker of their version, or for `tether runs move-version`).
    version: str | None = None
    version_handoff: bool = True
    # Leases are extended from a thread of the worker's own (on a second database handle),
    # unless the event loop has not run for max_loop_stall seconds (then it is taken for stuck).
    keepalive_thread: bool = True
    max_loop_stall: float = 60.0
    # A worker about to lose its leases while an at-most-once body still runs in it ends its
    # process first (keepalive.Fence); False only logs, and gives that guarantee up.
    fail_stop: bool = True


@dataclass(slots=True)
class Engine:
    store: Store
    serde: Serde
    clock: Clock
    settings: Settings
    workflows: dict[str, Workflow[..., object]] = field(default_factory=dict)
    queues: dict[str, QueueLimits] = field(default_factory=dict)  # limits by queue name
    # Futures of local callers waiting for a run to end, so they wake without polling.
    wakeups: dict[str, list[asyncio.Future[RunRecord | None]]] = field(default_factory=dict)

    # Futures of waits held in memory, by run: resolved when the run may have news (an event,
    # a child's end), so the wait looks again at once instead of at its next timer.
    wake_futures: dict[str, set[asyncio.Future[object]]] = field(default_factory=dict)
    worker: Worker | None = None  # this process's worker, while it runs
    # Told of approvals asked and decided (tether.approvals.Notifier); kept here so workflow
    # code finds them through its run, the engine itself never calls them.
    notifiers: list[Any] = field(default_factory=list)

    held_waits: int = 0  # runs holding a wait in memory now (at most settings.max_held_waits)

    # Told of run executions and step attempts (tether.telemetry's spans and metrics); None
    # while nothing watches, so the hot path pays one lookup. Install with observe().
    observer: Observer | None = None

    # Futures of this process's stream readers waiting at the end of a stream, by (run, key):
    # resolved when something is appended here, or when the run stops executing here.
    stream_waiters: dict[tuple[str, str], set[asyncio.Future[None]]] = field(default_factory=dict)

    # Background loops a worker runs beside its claims while it runs (the outbox's delivery,
    # schedules, retention): each is called with the worker and loops until cancelled.
    services: dict[str, Callable[[Worker], Awaitable[None]]] = field(default_factory=dict)

    # Threads running sync step bodies now, by (run id, checkpoint name): see track().
    threads: dict[tuple[str, str], Body] = field(default_factory=dict)
    # At-most-once attempts whose body runs now, by (run id, checkpoint name): when each is
    # over for certain (its marker's retry_at). Read from the keepalive's thread (its fence).
    in_flight: dict[tuple[str, str], float] = field(default_factory=dict)
    # The fence of the worker executing here (None: no worker): no step body starts while its
    # leases are not known to hold.
    fence: Fence | None = None
    _skew_told: float = 0.0  # the clock skew last logged

    async def sync_clock(self) -> None:
        """Measure the database's clock again (a DatabaseClock; other clocks are left alone)."""
        if isinstance(self.clock, DatabaseClock):
            await self.clock.sync(self.store.database_time)
            skew = self.clock.skew
            if skew is not None and abs(skew) > 1.0 and abs(skew - self._skew_told) > 1.0:
                self._skew_told = skew
                log.warning("this machine's clock is %+.1fs off the database server's; "
                            "Tether keeps to the server's (leases, timers)", skew)  # fmt: skip

    def track(self, key: tuple[str, str]) -> Body:
        """A sync step body starts in a thread for (run id, checkpoint name): threads cannot
        be stopped, so shutdown and at-most-once reconciliation wait for them. The thread
        calls the Body's end() when the body returns or raises."""
        body = self.threads[key] = Body(self, key, asyncio.get_running_loop())
        return body

    async def thread_over(self, key: tuple[str, str]) -> None:
        """Until the thread running the body of (run id, checkpoint name) here, if any, ended."""
        body = self.threads.get(key)
        if body is not None:
            await asyncio.shield(body.ended)

    def observe(self, observer: Observer) -> None:
        """Tell `observer` of every run execution and step attempt from now on (after the
        observers installed before it)."""
        self.observer = combine(self.observer, observer)

    def wake_future(self, run_id: str) -> asyncio.Future[object]:
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.wake_futures.setdefault(run_id, set()).add(future)
        return future

    def drop_wake_future(self, run_id: str, future: asyncio.Future[object]) -> None:
        futures = self.wake_futures.get(run_id)
        if futures is not None:
            futures.discard(future)
            if not futures:
                del self.wake_futures[run_id]

    def wake(self, run_id: str) -> None:
        """The run may have news: wake its waits held here, or let the worker claim it."""
        for future in self.wake_futures.get(run_id, ()):
            if not future.done():
                future.set_result(None)
        if run_id not in self.wake_futures and self.worker is not None:
            self.worker.notify()

    def stream_future(self, run_id: str, key: str) -> asyncio.Future[None]:
        """A future resolved at the next append to the stream (or stop of its run) here."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.stream_waiters.setdefault((run_id, key), set()).add(future)
        return future

    def drop_stream_future(self, run_id: str, key: str, future: asyncio.Future[None]) -> None:
        futures = self.stream_waiters.get((run_id, key))
        if futures is not None:
            futures.discard(future)
            if not futures:
                del self.stream_waiters[(run_id, key)]

    def stream_appended(self, run_id: str, key: str) -> None:
        """Entries were appended to the stream: wake its readers in this process."""
        for future in list(self.stream_waiters.get((run_id, key), ())):
            _wake_reader(future)

    def executing_here(self, run_id: str) -> bool:
        """Whether this process executes the run now: its end (or stop) here will call
        run_ended, the last thing its execution does, so a waiter registered before need not
        read the run first."""
        runner = self.worker.runners.get(run_id) if self.worker is not None else None
        return runner is not None and runner.task is not None and not runner.task.done()

    def run_ended(self, run_id: str, record: RunRecord | None) -> None:
        """Wake this process's callers waiting on the run; `record` is its final state, when
        known (else they read it). Its stream readers look again too."""
        for (run, _), readers in list(self.stream_waiters.items()):
            if run == run_id:
                for reader in list(readers):
                    _wake_reader(reader)
        futures = self.wakeups.pop(run_id, [])
        if not futures:
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for future in futures:
            if future.get_loop() is running:
                _resolve(future, record)
            else:
                future.get_loop().call_soon_threadsafe(_resolve, future, record)


def _resolve(future: asyncio.Future[RunRecord | None], record: RunRecord | None) -> None:
    if not future.done():
        future.set_result(record)


def _wake_reader(future: asyncio.Future[None]) -> None:
    """Resolve a stream reader's future from any thread (through its own loop if need be)."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if future.get_loop() is running:
        if not future.done():
            future.set_result(None)
    else:
        future.get_loop().call_soon_threadsafe(_wake_reader, future)


class Body:
    """A sync step body running in a thread: when it ended, seen from the worker's loop (a
    future) and from any thread (an Event), whatever became of the task that awaited it."""

    def __init__(self, engine: Engine, key: tuple[str, str], loop: asyncio.AbstractEventLoop):
        self.engine, self.key, self.loop = engine, key, loop
        self.ended: asyncio.Future[None] = loop.create_future()
        self.over = threading.Event()

    def end(self) -> None:
        """Called by the body's thread as it finishes."""
        self.engine.in_flight.pop(self.key, None)
        self.over.set()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            self.loop.call_soon_threadsafe(self._ended)

    def _ended(self) -> None:
        if self.engine.threads.get(self.key) is self:
            del self.engine.threads[self.key]
        if not self.ended.done():
            self.ended.set_result(None)

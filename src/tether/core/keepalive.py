"""The worker's keepalive: its leases extended from a thread of its own, on a store handle of its
own, so that an event loop blocked by a sync call (in a step, or in user code) does not let
another worker take runs that this live one still executes; and its fence, which never lets a
lease run out under an at-most-once body that still runs here.

A loop stalled far longer than that (settings.max_loop_stall) is taken for stuck: the thread
stops extending, and the leases run out as if the worker had died. What it hears back (leases
lost, cancel requests) is handed to the worker on its loop. It executes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tether.core.positions import internal
from tether.store.port import Lease, Store

if TYPE_CHECKING:
    from tether.core.engine import Body
    from tether.core.worker import Worker

log = logging.getLogger("tether.worker")

FAIL_STOP_EXIT = 70  # the exit status of a process its fence ended (EX_SOFTWARE)


def _exit() -> None:
    """End this process at once, as a crash would (the runs are recovered elsewhere)."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    sys.stderr.flush()
    os._exit(FAIL_STOP_EXIT)


class Fence:
    """While an at-most-once body runs in this process, another worker must not take its run:
    it would reconcile the attempt while the body may still make its effect (a sync body past
    its timeout, a loop blocked inside an async one). Leases are extended by heartbeats; when
    they cannot be (the database is away, the loop is stuck) and would run out with such a
    body still running, the process ends itself (settings.fail_stop) first: its bodies stop
    for certain, and the next owner reconciles them as after any crash."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._clock = worker.engine.clock  # read before every step attempt (holds)
        # No lease of this worker runs out before this (on the database's clock): it started
        # now, and every heartbeat that succeeds extends all of its leases.
        self.valid_until = worker.engine.clock.now() + worker.lease_duration
        self._told = False
        # The same, as far as the worker's loop has heard (the lost runs stopped first).
        self.confirmed_until = self.valid_until
        # The heartbeat made for step bodies waiting to start (see confirmed).
        self._beat: asyncio.Task[None] | None = None

    def extended(self, until: float) -> None:
        self.valid_until = max(self.valid_until, until)

    def holds(self) -> bool:
        """Whether this worker's loop knows its leases to hold now."""
        return self._clock.now() < self.confirmed_until

    async def confirmed(self) -> None:
        """Until a heartbeat confirms the leases (a run lost meanwhile is stopped instead:
        its task is cancelled here). A worker that was stopped (SIGSTOP) or whose loop was
        blocked for longer than its lease must not start a step body another worker may
        have run since: one heartbeat, made now and shared by every body that waits, tells
        which runs are still its own."""
        while not self.holds():
            if self._beat is None or self._beat.done():
                self._beat = internal(self.worker.beat())
            try:
                await asyncio.shield(self._beat)
            except Exception:
                log.exception("heartbeat failed; a step body waits for the next one")
                await asyncio.sleep(min(1.0, self.worker.lease_duration / 10))

    def heard(self, until: float) -> None:
        """The reply of a heartbeat that extended the leases to `until` was handled (its lost
        runs stopped)."""
        self.confirmed_until = max(self.confirmed_until, until)

    def _margin(self) -> float:
        # The heartbeat's own trip, and how far this clock may be off the database's.
        uncertainty = getattr(self.worker.engine.clock, "uncertainty", 0.0)
        return self.worker.lease_duration / 10 + 2 * uncertainty

    def due(self) -> float | None:
        """When the fence acts unless a heartbeat succeeds first (None: nothing in flight)."""
        if not self.worker.engine.in_flight:
            return None
        return self.valid_until - self._margin()

    def check(self) -> None:
        due = self.due()
        engine = self.worker.engine
        if due is None or engine.clock.now() < due:
            return
        steps = ", ".join(f"{name!r} of run {run!r}" for run, name in sorted(engine.in_flight))
        if engine.settings.fail_stop:
            log.critical("this worker's leases run out (heartbeats fail, or its event loop is "
                         "stuck) while at-most-once step bodies still run: %s. The process ends "
                         "now (exit status %d) so that no other worker reconciles a body that "
                         "could still make its effect; their runs are recovered and reconciled "
                         "elsewhere", steps, FAIL_STOP_EXIT)  # fmt: skip
            _exit()
        elif not self._told:
            self._told = True
            log.error("this worker's leases run out while at-most-once step bodies still run "
                      "(%s), and fail_stop is off: another worker may reconcile them while "
                      "they run", steps)  # fmt: skip


class Keepalive:
    def __init__(self, worker: Worker, store: Store) -> None:
        self.worker = worker
        self.store = store
        self.fence = worker.fence
        self.loop = asyncio.get_running_loop()  # the worker's
        # When the worker's loop last ran our callback, on the loops' monotonic clock.
        self.answered = self.loop.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tether-keepalive", daemon=True)
        self._stuck = False
        # After the worker stopped: the leases of runs whose sync bodies still run, kept until
        # those bodies end; then the worker's row is released.
        self._linger: tuple[list[Lease], list[Body]] | None = None

    def start(self) -> None:
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 10.0)

    def linger(self, leases: Sequence[Lease], bodies: Sequence[Body]) -> None:
        """The worker stopped, but `bodies` still run: keep `leases` until they end, then
        release the worker (from this thread, which outlives the worker's loop)."""
        self._linger = (list(leases), list(bodies))
        self._stop.set()

    def _run(self) -> None:
        # Its first heartbeat is due a third of a lease on: only then are its loop and its
        # database handle made, so a short-lived worker (a test, a command) pays nothing.
        if not self._stop.wait(self.worker.lease_duration / 3) or self._linger is not None:
            asyncio.run(self._main())

    async def _main(self) -> None:
        try:
            await self.store.open()
        except Exception:
            log.exception("the keepalive cannot open the database; heartbeats stay on the loop")
            self._post(self.worker.keepalive_failed)
            return
        try:
            await self._loop()
        except Exception:  # never silently: the worker's loop takes the heartbeats over
            log.exception("the keepalive failed; heartbeats go back to the event loop")
            self._post(self.worker.keepalive_failed)
        finally:
            with contextlib.suppress(Exception):
                await self.store.close()

    async def _loop(self) -> None:
        while True:
            await self._beat()
            self.fence.check()
            if self._linger is not None:
                if all(body.over.is_set() for body in self._linger[1]):
                    await self._release()
                    return
                time.sleep(self._pause())  # blocking is fine: this loop has nothing else
                continue
            if self._stop.wait(self._pause()) and self._linger is None:
                return

    def _pause(self) -> float:
        pause = self.worker.lease_duration / 3
        due = self.fence.due()
        if due is not None:  # wake in time to act, should the heartbeats keep failing
            pause = min(pause, max(0.01, due - self.worker.engine.clock.now()))
        if self._linger is not None:
            pause = min(pause, 0.05)  # notice soon that the bodies ended
        return pause

    async def _beat(self) -> None:
        worker = self.worker
        lingering = self._linger is not None
        if not lingering:  # the worker's loop is done once it lingers: not a stall
            stalled = asyncio.get_running_loop().time() - self.answered
            self._post(self._touch)
            if stalled > worker.engine.settings.max_loop_stall:
                if not self._stuck:
                    log.error("the event loop has not run for %.0fs (a sync call blocks it?): "
                              "no more lease extensions; other workers take its runs once the "
                              "leases run out", stalled)  # fmt: skip
                self._stuck = True
                return
            self._stuck = False
        leases = self._linger[0] if self._linger is not None else worker.leases()
        now = worker.engine.clock.now()
        until = now + worker.lease_duration
        try:
            reply = await self.store.heartbeat(worker.id, leases, until, now)
        except Exception:
            log.exception("heartbeat failed; retrying")
            return
        self.fence.extended(until)
        if not lingering:
            self._post(lambda: worker.heard(reply, leases, until))

    def _touch(self) -> None:
        self.answered = self.loop.time()

    def _post(self, callback: Callable[[], Any]) -> None:
        with contextlib.suppress(RuntimeError):  # the worker's loop is closed
            self.loop.call_soon_threadsafe(callback)

    async def _release(self) -> None:
        worker = self.worker
        try:
            await self.store.release_worker(worker.id, worker.engine.clock.now())
        except Exception:
            log.exception("could not release worker %s; its leases run out instead", worker.id)
        else:
            log.info("the sync step bodies ended; worker %s released its runs", worker.id)

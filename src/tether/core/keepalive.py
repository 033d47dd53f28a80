"""The worker's keepalive: its leases extended from a thread of its own, on a store handle of its
own, so that an event loop blocked by a sync call (in a step, or in user code) does not let
another worker take runs that this live one still executes.

A loop stalled far longer than that (settings.max_loop_stall) is taken for stuck: the thread
stops extending, and the leases run out as if the worker had died. What it hears back (leases
lost, cancel requests) is handed to the worker on its loop. It executes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING

from tether.store.base import HeartbeatReply, Store

if TYPE_CHECKING:
    from tether.core.worker import Worker

log = logging.getLogger("tether.worker")


class Keepalive:
    def __init__(self, worker: Worker, store: Store) -> None:
        self.worker = worker
        self.store = store
        self.loop = asyncio.get_running_loop()  # the worker's
        # When the worker's loop last ran our callback, on the loops' monotonic clock.
        self.answered = self.loop.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tether-keepalive", daemon=True)
        self._stuck = False

    def start(self) -> None:
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 10.0)

    def _run(self) -> None:
        # Its first heartbeat is due a third of a lease on: only then are its loop and its
        # database handle made, so a short-lived worker (a test, a command) pays nothing.
        if not self._stop.wait(self.worker.lease_duration / 3):
            asyncio.run(self._main())

    async def _main(self) -> None:
        engine = self.worker.engine
        try:
            await self.store.open()
        except Exception:
            log.exception("the keepalive cannot open the database; heartbeats stay on the loop")
            self.loop.call_soon_threadsafe(self.worker.keepalive_failed)
            return
        try:
            # Blocking between heartbeats is fine: this loop has nothing else to do.
            while True:
                await self._beat(engine.settings.max_loop_stall)
                if self._stop.wait(self.worker.lease_duration / 3):
                    break
        finally:
            await self.store.close()

    async def _beat(self, max_stall: float) -> None:
        stalled = asyncio.get_running_loop().time() - self.answered
        if stalled > max_stall:
            if not self._stuck:
                log.error("the event loop has not run for %.0fs (a sync call blocks it?): no "
                          "more lease extensions; other workers take its runs once the leases "
                          "run out", stalled)  # fmt: skip
            self._stuck = True
            return
        self._stuck = False
        worker = self.worker
        leases = worker.leases()
        now = worker.engine.clock.now()
        try:
            reply = await self.store.heartbeat(worker.id, leases, now + worker.lease_duration, now)
        except Exception:
            log.exception("heartbeat failed; retrying")
            return
        self.loop.call_soon_threadsafe(self._answer, reply)

    def _answer(self, reply: HeartbeatReply) -> None:
        self.answered = self.loop.time()
        self.worker.heard(reply)

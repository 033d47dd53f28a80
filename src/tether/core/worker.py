"""The worker: claims runnable runs, executes each with a Runner, and keeps their leases alive.

At start it recovers the runs of dead workers on the same host at once; while it runs, a
heartbeat extends its leases, learns which it lost and which were asked to cancel, and looks
for newly dead local workers. Its row names the workflows it serves and its version (it claims
only runs pinned to it, or not pinned yet); every settings.unserved_check seconds it
dead-letters the runs whose workflow no live worker has served for settings.unserved_grace. On
stop it drains first (settings.drain_timeout). It never executes workflow code itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Sequence

from tether.core.engine import Engine
from tether.core.keepalive import Fence, Keepalive
from tether.core.lease import dead_here, this_worker
from tether.core.runner import Runner
from tether.core.signals import Suspend
from tether.core.versions import declared_version
from tether.errors import ConfigurationError, LeaseLost
from tether.serde import encode_error
from tether.store.port import Checkpoint, HeartbeatReply, Lease, RunRecord

log = logging.getLogger("tether.worker")

# How often an idle worker asks the database whether another process wrote (cheap on SQLite):
# the bound on how late a cross-process wake-up arrives.
CHANGE_POLL = 0.01
HISTORIES = 100  # claimed runs whose histories one read loads (a bound on what it holds)
# How often a draining worker looks for runs that reached a point where nothing of theirs is
# in flight (their executions are told at once; this catches those that started meanwhile).
DRAIN_LOOK = 0.05


class Worker:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.info = this_worker(engine.clock.now())
        self.id = self.info.id
        self.runners: dict[str, Runner] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._events_seen = 0  # the newest event id this worker has looked at
        self._stopped = False
        self._swept_at: float | None = None  # when it last looked for unserved runs
        self._keepalive: Keepalive | None = None  # extends leases from a thread of its own
        self.fence = Fence(self)  # its leases never run out under an at-most-once body
        engine.fence = self.fence
        self._register: asyncio.Task[None] | None = None  # registering again (its row was gone)
        self.draining = False  # stop() drains: nothing more is claimed or started here
        self._hurry = asyncio.Event()  # hurry(): the drain ends now
        self.version: str | None = None  # the version it declares, known from start()

    @property
    def stopped(self) -> bool:
        """Whether stop() was called: a service's loop ends on it, not on its cancellation
        alone (3.11's asyncio.timeout can swallow a cancel that meets its deadline)."""
        return self._stopped

    @property
    def lease_duration(self) -> float:
        return self.engine.settings.lease_duration

    async def start(self) -> None:
        store, now = self.engine.store, self.engine.clock.now()
        self.version = declared_version(self.engine)
        self.info = dataclasses.replace(
            self.info, workflows=tuple(sorted(self.served())), version=self.version
        )
        await store.register_worker(self.info, now)
        self._events_seen = await store.last_event_id()
        await self.recover_local()
        # New code may replay runs that diverged under the old: try the held ones now.
        if self.info.workflows and await store.wake_held(self.info.workflows, now):
            self._wake.set()
        other = store.another() if self.engine.settings.keepalive_thread else None
        if other is not None:
            self._keepalive = Keepalive(self, other)
            self._keepalive.start()
        self._tasks = [
            asyncio.create_task(self._claim_loop(), name="tether-claim"),
            asyncio.create_task(self._heartbeat_loop(), name="tether-heartbeat"),
        ]
        for name, service in self.engine.services.items():
            self._tasks.append(asyncio.create_task(self._service(name, service), name=name))

    async def stop(self, drain: float | None = None) -> None:
        """Stop executing. First it drains for up to `drain` seconds (settings.drain_timeout
        when None; see drain()), unless hurry() is called. Then in-flight runs are interrupted
        and released for the next worker. Sync step bodies cannot be interrupted: they get up
        to settings.shutdown_grace seconds to end first; the runs of those that still run stay
        leased, from a thread that outlives this call, until they end (an at-most-once body is
        then reconciled by the next owner, never while it runs)."""
        timeout = self.engine.settings.drain_timeout if drain is None else drain
        if timeout > 0 and not self._stopped:
            await self.drain(timeout)
        # The flag as well as the cancellation: 3.11's asyncio.timeout can swallow a cancel
        # that coincides with its deadline, and the loops must end all the same.
        self._stopped = True
        if self.engine.threads:
            await self._let_threads_end()
        for task in self._tasks:
            task.cancel()
        if self._register is not None:
            self._register.cancel()
        leases = {run_id: r.lease for run_id, r in self.runners.items()}
        runner_tasks = [r.task for r in self.runners.values() if r.task is not None]
        for runner in self.runners.values():
            runner.stop()
        await asyncio.gather(*self._tasks, *runner_tasks, return_exceptions=True)
        self._tasks = []
        bodies = [body for body in self.engine.threads.values() if not body.over.is_set()]
        keepalive, self._keepalive = self._keepalive, None
        if bodies:
            kept = [leases[b.key[0]] for b in bodies if b.key[0] in leases]
            if keepalive is None and (other := self.engine.store.another()) is not None:
                keepalive = Keepalive(self, other)
                keepalive.start()
            log.warning("%d sync step bodies still run; their runs stay leased to this "
                        "process until they end, then are released", len(bodies))  # fmt: skip
            if keepalive is not None:
                keepalive.linger(kept, bodies)
                return
            # No second handle on this database (in memory): kept from here, until they end.
            while not all(body.over.is_set() for body in bodies):
                now = self.engine.clock.now()
                with contextlib.suppress(Exception):
                    await self.engine.store.heartbeat(self.id, kept, now + self.lease_duration, now)
                await asyncio.wait([body.ended for body in bodies], timeout=self.lease_duration / 3)
        if keepalive is not None:
            await keepalive.stop()
        try:
            await self.engine.store.release_worker(self.id, self.engine.clock.now())
        except Exception as exc:
            log.warning("worker %s could not give back its runs (%s); they wait for their "
                        "leases to run out", self.id, exc)  # fmt: skip

    async def drain(self, timeout: float) -> None:
        """Up to `timeout` seconds (or until hurry()): claim nothing more, start nothing more
        here, and give each run back once nothing of it is in flight: the step attempts in
        flight finish and record how they ended first, then the execution ends as a suspension
        claimable at once (by any worker of its version). Heartbeats go on meanwhile, so the
        leases hold while the attempts finish."""
        self.draining = True
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout
        log.info("draining: %d run(s) in flight, up to %gs", len(self.runners), timeout)
        while self.runners and not self._hurry.is_set() and loop.time() < give_up:
            now = self.engine.clock.now()
            for runner in list(self.runners.values()):
                ctx = runner.ctx
                if runner.stopping or runner.releasing:
                    continue
                if ctx is None:  # not executing yet: nothing of it is in flight
                    runner.stop()
                elif ctx.ending is None:
                    # Reaches the workflow's tasks once nothing is busy: attempts in flight
                    # record first, no new one starts (step.py's _before_attempt).
                    ctx.end(Suspend(now))
            tasks = [r.task for r in self.runners.values() if r.task is not None]
            hurry = asyncio.ensure_future(self._hurry.wait())
            try:
                await asyncio.wait([*tasks, hurry], timeout=min(DRAIN_LOOK, give_up - loop.time()),
                                   return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            finally:
                hurry.cancel()
        if self.runners:
            log.warning("drain ended with %d run(s) still in flight; interrupting them",
                        len(self.runners))  # fmt: skip

    def hurry(self) -> None:
        """End a drain now (a second SIGTERM): stop() goes on to interrupt what is left."""
        self._hurry.set()

    async def _let_threads_end(self) -> None:
        """Up to settings.shutdown_grace seconds for the sync step bodies running now (and
        any that start meanwhile) to end, and for their runs to record how they ended."""
        grace = self.engine.settings.shutdown_grace
        log.info("waiting up to %ss for %d sync step bodies to end", grace,
                 len(self.engine.threads))  # fmt: skip
        loop = asyncio.get_running_loop()
        give_up = loop.time() + grace
        runs: set[str] = set()
        while (bodies := list(self.engine.threads.values())) and loop.time() < give_up:
            runs.update(body.key[0] for body in bodies)
            await asyncio.wait([body.ended for body in bodies],
                               timeout=max(0.0, give_up - loop.time()))  # fmt: skip
        settling = [asyncio.ensure_future(r.ctx.settled())
                    for run_id, r in self.runners.items()
                    if run_id in runs and r.ctx is not None]  # fmt: skip
        if settling:
            await asyncio.wait(settling, timeout=max(0.0, give_up - loop.time()))
            for waiter in settling:
                waiter.cancel()

    async def _service(self, name: str, service: Callable[[Worker], Awaitable[None]]) -> None:
        """Run a background service until the worker stops; one that fails is restarted after
        settings.poll_interval, so a database outage does not end it for good."""
        while not self._stopped:
            try:
                await service(self)
                return
            except Exception:
                log.exception("service %s failed; restarting it", name)
                await asyncio.sleep(self.engine.settings.poll_interval)

    def notify(self) -> None:
        """Look for work now (a run was created or released somewhere in this process)."""
        self._wake.set()

    def served(self) -> list[str]:
        """The workflows whose runs this worker claims: all, or those of its queues."""
        queues = self.engine.settings.queues
        return [name for name, wf in self.engine.workflows.items()
                if queues is None or wf.queue in queues]  # fmt: skip

    def capacity(self) -> int:
        """How many more runs this worker may execute now. Runs holding a short wait in
        memory while nothing of theirs runs (no step body, no I/O) do not count: they execute
        nothing, and they are few (max_held_waits)."""
        if self.draining:  # in-process starts are left pending for another worker
            return 0
        if not self.engine.held_waits:  # no run parks a wait: nothing to look for
            return self.engine.settings.concurrency - len(self.runners)
        runners = self.runners.values()
        waiting = sum(
            1 for r in runners if (ctx := r.ctx) is not None and ctx.parks and not ctx.busy
        )
        return self.engine.settings.concurrency - len(self.runners) + waiting

    def has_capacity(self) -> bool:
        return self.capacity() > 0

    def launch(self, record: RunRecord, history: list[Checkpoint] | None = None) -> None:
        """Execute a run this worker has just claimed (epoch in the record)."""
        lease = Lease(record.id, self.id, record.epoch)
        running = self.runners.get(record.id)
        # Our own live execution, claimed again with nobody else's claim in between (the epoch
        # is the next one): its history in memory is still the run's, so it goes on. After
        # another owner's epoch it may not be: a new execution replays, the old one is fenced.
        # One giving the run back (it suspended, say, and news came at once) goes on no more:
        # adopted, the claim would end with it and the run stay ours until the lease ran out.
        if (
            running is not None
            and not running.stopping
            and not running.releasing
            and running.task
            and not running.task.done()
            and record.epoch == running.lease.epoch + 1
        ):
            running.adopt(lease)
            return
        runner = Runner(self.engine, record, lease, history)
        self.runners[record.id] = runner
        runner.task = asyncio.create_task(runner.run(), name=f"tether-run-{record.id}")
        runner.task.add_done_callback(lambda _: self._finished(record.id, runner))

    def _finished(self, run_id: str, runner: Runner) -> None:
        if self.runners.get(run_id) is runner:
            del self.runners[run_id]
            if (
                runner.lost is not None
                and runner.adopted
                and not (self._stopped or self.draining or runner.stopping)
            ):
                # A write made under the old epoch while the run was claimed again was fenced
                # off after the adoption: this worker still holds the run (new epoch), so a new
                # execution replays it now instead of leaving it until the lease runs out.
                self.launch(dataclasses.replace(runner.record, epoch=runner.lease.epoch))
                return
        # Look again only when a claim may have been cut short by capacity, or a released run
        # may be due before the claim loop's next look.
        if runner.suspended or self.capacity() == 1 or runner.record.queue in self.engine.queues:
            self._wake.set()

    def cancel(self, run_id: str) -> bool:
        runner = self.runners.get(run_id)
        if runner is None:
            return False
        runner.request_cancel()
        return True

    async def recover_local(self) -> None:
        """Release the runs of dead workers on this host, so they resume without waiting."""
        store = self.engine.store
        for worker in await store.list_workers(self.info.host):
            if worker.id != self.id and dead_here(worker):
                released = await store.release_worker(worker.id, self.engine.clock.now())
                if released:
                    log.info("recovered %d run(s) of dead worker %s", len(released), worker.id)
                    self._wake.set()

    async def _claim_loop(self) -> None:
        engine = self.engine
        store, clock, settings = engine.store, engine.clock, engine.settings
        while not self._stopped:
            self._wake.clear()
            names = self.served()
            try:
                capacity = self.capacity()
                if capacity > 0 and names:
                    now = clock.now()
                    claimed = await store.claim_runs(
                        self.id, names, now, now + self.lease_duration, capacity, engine.queues,
                        version=self.version, live_since=self.live_since(now),
                    )  # fmt: skip
                    # Their histories in a read per HISTORIES runs, not one read per run.
                    for at in range(0, len(claimed), HISTORIES):
                        some = claimed[at : at + HISTORIES]
                        histories = await store.load_histories([r.id for r in some])
                        for record in some:
                            self.launch(record, histories.get(record.id, []))
                wake_at = None
                if names:
                    wake_at = await store.next_wake_at(
                        names, version=self.version, live_since=self.live_since(clock.now())
                    )
            except Exception:
                log.exception("claiming runs failed; retrying in %ss", settings.poll_interval)
                wake_at = None
            timeout = settings.poll_interval
            if wake_at is not None:
                timeout = min(timeout, max(0.0, wake_at - clock.now()) + 0.001)
            await self._idle(timeout)

    def live_since(self, now: float) -> float | None:
        """Since when a version's workers must have heartbeated for its runs to stay its own
        (their leases run out after as long); None: runs never change version by themselves."""
        if not self.engine.settings.version_handoff:
            return None
        return now - self.lease_duration

    async def _idle(self, timeout: float) -> None:
        """Until notified in-process, `timeout` passes, or another process changes the
        database (looked at every CHANGE_POLL seconds): then the waits held here whose runs
        got events wake, and the claim loop looks for due runs."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not self._wake.is_set() and not self._stopped:
            left = end - loop.time()
            if left <= 0:
                return
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, CHANGE_POLL)):
                    await self._wake.wait()
            if not self._wake.is_set() and await self.engine.store.poll_changes():
                refs = await self.engine.store.events_after(self._events_seen)
                if refs:
                    self._events_seen = refs[-1].id
                for ref in refs:
                    self.engine.wake(ref.run_id)
                return

    def leases(self) -> list[Lease]:
        """The leases of the runs it executes now (read from the keepalive's thread too)."""
        return [r.lease for r in list(self.runners.values())]

    def heard(self, reply: HeartbeatReply, sent: Sequence[Lease], until: float) -> None:
        """What a heartbeat that extended the leases `sent` to `until` answered: leases lost
        (their runs stop executing here), cancel requests, and whether this worker's row is
        gone (it registers again)."""
        epochs = {lease.run_id: lease.epoch for lease in sent}
        for run_id in reply.lost:
            runner = self.runners.get(run_id)
            # A run its execution is giving back is not lost: its lease goes with it; nor is
            # one claimed again since (a newer epoch than the one that was sent).
            if (runner is not None and not runner.releasing
                    and runner.lease.epoch == epochs.get(run_id)):  # fmt: skip
                log.warning("lost the lease on run %r; stopped executing it", run_id)
                runner.stop(
                    LeaseLost(
                        f"worker {self.id!r} lost the lease on run {run_id!r} at epoch "
                        f"{runner.lease.epoch}: its heartbeat found the run taken over or ended"
                    )
                )
        for run_id in reply.cancel:
            self.cancel(run_id)
        if reply.unknown and not self._stopped and self._register is None:
            # Its row was deleted (someone took it for dead): it lives, so it says so.
            log.warning("worker %s had no row any more; registering it again", self.id)
            self._register = asyncio.create_task(self._register_again())
        self.fence.heard(until)

    async def _register_again(self) -> None:
        try:
            await self.engine.store.register_worker(self.info, self.engine.clock.now())
        except Exception:
            log.exception("registering worker %s again failed; the next heartbeat retries",
                          self.id)  # fmt: skip
        finally:
            self._register = None

    def keepalive_failed(self) -> None:
        self._keepalive = None  # the heartbeat loop extends the leases itself

    async def _heartbeat_loop(self) -> None:
        engine = self.engine
        while not self._stopped:
            pause = self.lease_duration / 3
            if self._keepalive is None and (due := self.fence.due()) is not None:
                pause = min(pause, max(0.01, due - engine.clock.now()))  # the fence in time
            await asyncio.sleep(pause)
            try:
                await engine.sync_clock()
                if self._keepalive is None:
                    await self.beat()
                await self.recover_local()
                await self.dead_letter_unserved()
            except Exception:
                log.exception("heartbeat failed; retrying")
            if self._keepalive is None:
                self.fence.check()

    async def beat(self) -> None:
        """One heartbeat from the loop: the leases extended, what it answered heard."""
        now, leases = self.engine.clock.now(), self.leases()
        until = now + self.lease_duration
        reply = await self.engine.store.heartbeat(self.id, leases, until, now)
        self.fence.extended(until)
        self.heard(reply, leases, until)

    async def dead_letter_unserved(self, *, force: bool = False) -> list[str]:
        """Every settings.unserved_check seconds (or now, with `force`): end dead the runs
        due for settings.unserved_grace seconds whose workflow no worker that was alive in
        that time serves (its code was removed, or all its workers are gone). Returns their
        ids."""
        engine = self.engine
        settings, now = engine.settings, engine.clock.now()
        grace = settings.unserved_grace
        due = self._swept_at is None or now - self._swept_at >= settings.unserved_check
        if grace is None or not (due or force):
            return []
        self._swept_at = now
        served = tuple(sorted(self.served()))
        if served != self.info.workflows:  # workflows registered after the worker started
            self.info = dataclasses.replace(self.info, workflows=served)
            await engine.store.register_worker(self.info, now)

        def error(run_id: str, workflow: str) -> str:
            return json.dumps(encode_error(ConfigurationError(
                f"no worker serves workflow {workflow!r}: none that was alive in the last "
                f"{grace:g}s registers it, and the run was due all that time (its code was "
                f"removed or renamed, or its workers are down). Deploy a worker with its code, "
                f"then `tether runs resume {run_id}`"
            )))  # fmt: skip

        buried = await engine.store.dead_letter_unserved(now - grace, error, now)
        for run_id in buried:
            log.error("run %r is dead: no live worker serves its workflow", run_id)
            engine.run_ended(run_id, None)
        return buried

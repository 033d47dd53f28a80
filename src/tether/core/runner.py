"""Executes one claimed run: replays its history, runs the workflow, records how it ended.

The workflow runs in the runner's own task; flags tell a user's cancel request, the worker
stopping (shutdown, lost lease) and the deadline watchdog apart. The runner writes only through
the Store port with its Lease; it never claims runs (the worker does).

An execution that fails outside the workflow's own code (a checkpoint this code cannot decode,
no code for the workflow, a corrupt row) is not the run's failure: the runner records it on the
run (fail_execution), which is tried again after a backoff, and is dead once
settings.max_executions such executions came in a row. Arguments the workflow's signature or
hints refuse (a run started by name, or under other code) make it dead at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tether.core.context import _RUN
from tether.core.engine import Engine
from tether.core.execution import RunContext
from tether.core.observe import RunOutcome, recorded_trace, run_trace
from tether.core.outage import MISSING, retry_store
from tether.core.positions import _FRAME, install, internal
from tether.core.signals import Abandon, ReplayNow, Signal, Suspend
from tether.core.workflow import Workflow
from tether.errors import (
    ArgumentsRefused,
    ConfigurationError,
    LeaseLost,
    NonDeterminismError,
    SerializationError,
    StoreUnavailable,
    WorkflowTimeout,
)
from tether.serde import encode_error
from tether.store.port import Checkpoint, Lease, RunRecord, RunStatus

log = logging.getLogger("tether.runner")

CANCELLED_ERROR = json.dumps({"type": "RunCancelled", "message": "the run was cancelled"})


class Runner:
    def __init__(
        self, engine: Engine, record: RunRecord, lease: Lease, history: list[Checkpoint] | None
    ) -> None:
        self.engine = engine
        self.record = record
        self.lease = lease
        self.history = history
        self.cancel_requested = record.cancel_requested
        self.task: asyncio.Task[None] | None = None
        self.suspended = False  # the run was released to wait, and may be due again soon
        self.final: RunRecord | None = None  # the run as this runner ended it
        self.stopping = False  # the worker stops: leave the run for the next one
        self.timed_out = False  # the workflow's deadline passed while it ran
        self._in_workflow = False  # workflow code (not the runner's own bookkeeping) runs now
        self.outcome = RunOutcome.ABANDONED  # how this execution stopped, for the observer
        self.failure: BaseException | None = None  # what failed the run, if it failed
        self.progressed = False  # this execution wrote a checkpoint
        self.ctx: RunContext | None = None  # the workflow's context while it executes
        self.adopted = False  # its worker claimed the run again and it went on (adopt)
        self.lost: LeaseLost | None = None  # a write of this execution was fenced off
        self.stopped_by: BaseException | None = None  # why stop() was called, if it says
        self.releasing = False  # it is giving the run back (finish, suspend): leases go with it

    def request_cancel(self) -> None:
        """End the run as cancelled: the workflow (and the step it awaits) sees CancelledError."""
        self.cancel_requested = True
        if self._in_workflow and self.task is not None:
            self.task.cancel()

    def adopt(self, lease: Lease) -> None:
        """Go on executing under `lease`: this worker claimed its own run again, because the
        lease looked expired (its clock jumped past it, or heartbeats were late). The run keeps
        this one execution, its writes fenced by the new epoch, instead of a second beside it."""
        self.lease = lease
        self.adopted = True
        if self.ctx is not None:
            self.ctx.lease = lease

    def stop(self, reason: BaseException | None = None) -> None:
        """Stop executing without ending the run (worker shutdown, lost lease); `reason` is
        what the observer is told stopped it (a LeaseLost the heartbeat found)."""
        self.stopping = True
        self.stopped_by = reason
        if self.task is not None:
            self.task.cancel()

    async def run(self) -> None:
        run_id = self.record.id
        observer = self.engine.observer
        watch = None
        if observer is not None:
            run_trace.set(recorded_trace(self.record.trace_context))  # this task's own context
            watch = observer.run_started(run_id, self.record.workflow, self.lease.epoch)
        stopped: BaseException | None = None  # what stopped this execution short, if anything
        try:
            await self._run()
        except LeaseLost as exc:
            stopped = self.lost = exc
            log.warning("%s", exc)
        except asyncio.CancelledError as exc:
            stopped = exc
            raise
        except StoreUnavailable as exc:
            stopped = exc
            # The database stayed away; the lease runs out and another attempt (here or
            # elsewhere) resumes the run from its checkpoints.
            log.exception("run %r stopped on a store error; it will be resumed", run_id)
        except Exception as exc:
            stopped = exc
            await self._failed_execution(exc)
        finally:
            if observer is not None:
                observer.run_ended(watch, self.outcome, self.stopped_by or stopped or self.failure)
            self.engine.run_ended(run_id, self.final)

    async def _run(self) -> None:
        engine, record = self.engine, self.record
        workflow = engine.workflows.get(record.workflow)
        if workflow is None:
            raise ConfigurationError(
                f"run {record.id!r} is of workflow {record.workflow!r}, which this process does "
                f"not register; deploy its code, then `tether runs resume {record.id}`"
            )
        history = self.history
        if history is None and not self.cancel_requested:
            history = await engine.store.load_history(record.id)
        install(asyncio.get_running_loop())  # places the tasks workflow code creates
        while True:
            if self.cancel_requested:  # asked before the workflow (re)started
                await self._finish(RunStatus.CANCELLED, None, CANCELLED_ERROR)
                return
            assert history is not None
            ctx = self.ctx = RunContext(
                engine, record.id, workflow.name, self.lease, {c.at: c for c in history}
            )
            # The workflow runs in this task (no task of its own: one less loop turn per run);
            # the flags tell a user's cancel from the worker stopping.
            token, frame = _RUN.set(ctx), _FRAME.set(None)
            ctx.begin()
            self._in_workflow = True
            failure: BaseException | None = None
            try:
                result = await self._execute(ctx, workflow)
            except BaseException as exc:  # sorted out below, once workflow code is done
                failure = exc
            finally:
                self._in_workflow = False
                _FRAME.reset(frame)
                _RUN.reset(token)
            await ctx.close()  # its other tasks are done (replayed writes settled first)
            self.progressed = self.progressed or ctx.writes > 0
            failure = self._sort_out(ctx, failure)
            if failure is None:
                await self._finish(RunStatus.SUCCEEDED, result, None)
                return
            if isinstance(failure, ReplayNow):
                history = await engine.store.load_history(record.id)
                continue
            await self._conclude(ctx, failure)
            return

    def _sort_out(self, ctx: RunContext, failure: BaseException | None) -> BaseException | None:
        """What ended this execution: the worker stopping, the run's cancellation, the end the
        execution decided as a whole (suspension.py), or what the workflow returned or raised.
        Cancellations the execution made of this task to unwind it are taken back."""
        task = asyncio.current_task()
        if task is not None:
            for _ in range(ctx.root_cancels):
                task.uncancel()
        if isinstance(failure, asyncio.CancelledError) and self.stopping:
            raise failure
        if self.cancel_requested and (failure is None or isinstance(failure, ReplayNow)):
            return failure
        if self.cancel_requested and isinstance(failure, asyncio.CancelledError):
            return failure
        if self.cancel_requested and isinstance(failure, BaseExceptionGroup):
            _, rest = failure.split((asyncio.CancelledError, Signal))
            if rest is None:  # a TaskGroup that unwound for the execution's end, or the cancel
                return asyncio.CancelledError()
        if ctx.ending is not None and not self.cancel_requested:
            return ctx.ending  # what any task met: a result after it is not the run's
        return failure

    async def _conclude(self, ctx: RunContext, failure: BaseException) -> None:
        """Record what the workflow's exception means for the run."""
        engine, record = self.engine, self.record
        if isinstance(failure, Suspend):
            await ctx.flush()
            wake_at = failure.wake_at
            if record.deadline_at is not None:
                wake_at = (
                    record.deadline_at if wake_at is None else min(wake_at, record.deadline_at)
                )
            lease, wake_on = self.lease, failure.wake_on

            async def suspend() -> None:
                self.releasing = True
                await engine.store.suspend_run(lease, wake_at, engine.clock.now(), wake_on)

            await retry_store(engine, suspend, self._read_back(RunStatus.WAITING))
            self.suspended = True
            self.outcome = RunOutcome.SUSPENDED
        elif isinstance(failure, Abandon):
            if not isinstance(failure.cause, NonDeterminismError):
                # Not the run's failure: stop (it is resumed), or count a failed execution.
                raise failure.cause from None
            await self._hold(failure.cause)
        elif isinstance(failure, asyncio.CancelledError):
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # the cancellation was the run's, and it is handled here
            if self.cancel_requested:
                await self._finish(RunStatus.CANCELLED, None, CANCELLED_ERROR)
            else:  # the workflow's own code cancelled itself
                await self._fail(failure)
        elif isinstance(failure, Exception):
            await self._fail(failure)
        else:
            raise failure  # KeyboardInterrupt, SystemExit: not the run's to record

    def _read_back(self, status: RunStatus) -> Callable[[], Awaitable[object]]:
        """Whether a write that lost its acknowledgement left the run in `status` (released
        by this lease: its epoch unchanged)."""

        async def read() -> object:
            run = await self.engine.store.get_run(self.record.id)
            done = run is not None and run.status is status and run.epoch == self.lease.epoch
            return None if done else MISSING

        return read

    async def _execute(self, ctx: RunContext, workflow: Workflow[..., Any]) -> str:
        deadline = self.record.deadline_at
        if deadline is None:
            return await self._body(ctx, workflow)
        remaining = deadline - self.engine.clock.now()
        if remaining <= 0:
            raise self._timeout()
        # The watchdog sleeps on the engine's clock, so a test's fake clock moves it too.
        watchdog = internal(self._expire(remaining))  # not a workflow task: no place taken
        try:
            return await self._body(ctx, workflow)
        except asyncio.CancelledError:
            if not self.timed_out or self.stopping:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            raise self._timeout() from None
        finally:
            watchdog.cancel()

    async def _expire(self, seconds: float) -> None:
        await self.engine.clock.sleep(seconds)
        if self._in_workflow and self.task is not None:
            self.timed_out = True
            self.task.cancel()

    def _timeout(self) -> WorkflowTimeout:
        return WorkflowTimeout(
            f"run {self.record.id!r} went past the timeout of workflow "
            f"{self.record.workflow!r} and was failed; raise @app.workflow(timeout=...) "
            f"if it needs longer"
        )

    async def _body(self, ctx: RunContext, workflow: Workflow[..., Any]) -> str:
        serde = self.engine.serde
        try:
            args, kwargs = workflow.decode_args(serde, self.record.args)
        except Exception as exc:  # started by name, under other code, or changed in the database
            refused = ArgumentsRefused if isinstance(exc, ArgumentsRefused) else SerializationError
            raise Abandon(refused(
                f"the stored arguments of run {self.record.id!r} do not fit workflow "
                f"{workflow.name}{workflow.signature} ({exc}); start a run with arguments "
                f"that fit, or deploy code that takes them, then `tether runs resume "
                f"{self.record.id}`"
            )) from None  # fmt: skip
        result = await workflow.fn(*args, **kwargs)
        missing = ctx.unreplayed()
        if missing is not None:
            raise ctx.abandon(missing)
        # The recorded helpers still queued are written in the commit of the run's end.
        return serde.dumps(result, what=f"result of workflow {workflow.name!r}")

    async def _failed_execution(self, exc: Exception) -> None:
        """This execution failed outside the workflow's code: record it on the run, which
        waits out a backoff and is tried again, or is dead after max_executions in a row."""
        engine, settings, lease = self.engine, self.engine.settings, self.lease
        failures = (0 if self.progressed else self.record.failures) + 1
        error = json.dumps(encode_error(exc))
        now = engine.clock.now()
        retry_at: float | None = None
        if isinstance(exc, ArgumentsRefused):
            # Every execution of this code would refuse them the same way: dead at once.
            log.error("run %r is dead: %s", self.record.id, exc)
        elif failures < settings.max_executions:
            delay = settings.failure_backoff * 2 ** min(failures - 1, 32)
            retry_at = now + min(delay, settings.max_failure_backoff)
            log.error("run %r: execution %d of at most %d in a row failed outside the "
                      "workflow's code; tried again in %.1fs", self.record.id, failures,
                      settings.max_executions, retry_at - now, exc_info=exc)  # fmt: skip
        else:
            log.error("run %r is dead: %d executions in a row failed outside the workflow's "
                      "code; fix the cause, then `tether runs resume %s`", self.record.id,
                      failures, self.record.id, exc_info=exc)  # fmt: skip

        async def record() -> None:
            self.releasing = True
            await engine.store.fail_execution(lease, error, failures, retry_at, now)

        async def read_back() -> object:
            run = await engine.store.get_run(lease.run_id)
            done = (run is not None and run.epoch == lease.epoch and run.owner is None
                    and run.failures == failures)  # fmt: skip
            return None if done else MISSING

        try:
            await retry_store(engine, record, read_back)
        except (LeaseLost, StoreUnavailable) as lost:
            log.warning("run %r: its failed execution was not recorded (%s)", lease.run_id, lost)
            return
        except Exception:  # the lease runs out and the run is adopted, as after a crash
            log.exception("run %r: its failed execution was not recorded", lease.run_id)
            return
        if retry_at is not None:
            self.outcome, self.suspended = RunOutcome.ERRORED, True
            return
        self.outcome, self.failure = RunOutcome.DEAD, exc
        self.final = dataclasses.replace(
            self.record, status=RunStatus.DEAD, result=None, error=error, owner=None,
            lease_expires_at=None, wake_at=None, wake_on=(), cancel_requested=False,
            updated_at=now, finished_at=now, failures=failures,
        )  # fmt: skip
        if self.record.parent_id is not None:
            engine.wake(self.record.parent_id)

    async def _hold(self, exc: NonDeterminismError) -> None:
        """Replay diverged (a deploy changed the workflow's code): hold the run, unfinished,
        until code that replays it comes, trying again after a backoff and whenever a worker
        starts. Its approvals stay pending and its parent is not told."""
        engine, settings, lease = self.engine, self.engine.settings, self.lease
        failures = (0 if self.progressed else self.record.failures) + 1
        # The exponent capped: a run held for long is tried again ever so often, not overflowed.
        delay = min(settings.failure_backoff * 2 ** min(failures - 1, 32), settings.held_retry_max)
        now = engine.clock.now()
        error = json.dumps(encode_error(exc) | {"position": exc.position})
        log.error("run %r is held: %s", self.record.id, exc)

        async def hold() -> None:
            self.releasing = True
            await engine.store.hold_run(lease, error, failures, now + delay, now)

        await retry_store(engine, hold, self._read_back(RunStatus.HELD))
        self.outcome, self.failure, self.suspended = RunOutcome.HELD, exc, True

    async def _fail(self, exc: BaseException) -> None:
        self.failure = exc
        error = encode_error(exc)
        ctx = self.ctx
        position = None if ctx is None else ctx.position_of(exc)
        if position is not None:  # the step whose failure this is: `app.resume` retries it
            error["position"] = position
        await self._finish(RunStatus.FAILED, None, json.dumps(error))

    async def _finish(self, status: RunStatus, result: str | None, error: str | None) -> None:
        now = self.engine.clock.now()
        # A run that succeeded writes its recorded helpers still queued in the commit of its
        # end. Those of a run that failed came on its failure path, which `app.resume` may not
        # take again: kept, they would be asked for where the resumed code asks for others.
        ctx = self.ctx
        done = ctx.unwritten() if ctx is not None and status is RunStatus.SUCCEEDED else []

        async def finish() -> None:
            self.releasing = True
            await self.engine.store.finish_run(self.lease, status, result, error, now,
                                               checkpoints=done)  # fmt: skip

        await retry_store(self.engine, finish, self._read_back(status))
        self.outcome = RunOutcome(status.value)
        if self.record.parent_id is not None:
            self.engine.wake(self.record.parent_id)  # a parent waiting here learns at once
        self.final = dataclasses.replace(
            self.record,
            status=status,
            result=result,
            error=error,
            owner=None,
            lease_expires_at=None,
            wake_at=None,
            cancel_requested=False,
            updated_at=now,
            finished_at=now,
            epoch=self.lease.epoch,
        )

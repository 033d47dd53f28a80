"""Executes one claimed run: replays its history, runs the workflow, records how it ended.

The workflow coroutine runs in a task of its own so that cancelling the run (a user's request)
and stopping the worker (shutdown, lost lease) are told apart. The runner writes only through the
Store port with its Lease; it never claims runs (the worker does).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import Any

from tether.core.context import _RUN, Abandon, ReplayNow, RunContext, Suspend
from tether.core.engine import Engine
from tether.core.workflow import Workflow
from tether.errors import LeaseLost, WorkflowTimeout
from tether.serde import encode_error
from tether.store.base import Checkpoint, Lease, RunRecord, RunStatus

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
        self._wf_task: asyncio.Task[str] | None = None

    def request_cancel(self) -> None:
        """End the run as cancelled: the workflow (and the step it awaits) sees CancelledError."""
        self.cancel_requested = True
        if self._wf_task is not None:
            self._wf_task.cancel()

    async def run(self) -> None:
        run_id = self.record.id
        try:
            await self._run()
        except LeaseLost as exc:
            log.warning("%s", exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The store failed while recording the outcome; the lease runs out and another
            # attempt (here or elsewhere) resumes the run from its checkpoints.
            log.exception("run %r stopped on a store error; it will be resumed", run_id)
        finally:
            self.engine.run_ended(run_id, self.final)

    async def _run(self) -> None:
        engine, record = self.engine, self.record
        workflow = engine.workflows[record.workflow]
        if self.cancel_requested:
            await self._finish(RunStatus.CANCELLED, None, CANCELLED_ERROR)
            return
        history = (
            self.history
            if self.history is not None
            else (await engine.store.load_history(record.id))
        )
        while True:
            ctx = RunContext(
                engine, record.id, workflow.name, self.lease, {c.seq: c for c in history}
            )
            self._wf_task = asyncio.create_task(self._body(ctx, workflow))
            try:
                result = await self._await_with_deadline(self._wf_task)
            except ReplayNow:
                await ctx.settled.wait()
                history = await engine.store.load_history(record.id)
                continue
            except Suspend as suspend:
                await ctx.settled.wait()
                await ctx.flush()
                wake_at = suspend.wake_at
                if record.deadline_at is not None:
                    wake_at = (
                        record.deadline_at if wake_at is None else min(wake_at, record.deadline_at)
                    )
                await engine.store.suspend_run(self.lease, wake_at, engine.clock.now())
                self.suspended = True
            except Abandon as abandon:
                await ctx.settled.wait()
                if isinstance(abandon.cause, LeaseLost):
                    raise abandon.cause from None
                await self._fail(abandon.cause)
            except asyncio.CancelledError as exc:
                if self._stopping():
                    raise  # the worker is stopping: the run stays for the next one
                await ctx.settled.wait()
                if self.cancel_requested:
                    await self._finish(RunStatus.CANCELLED, None, CANCELLED_ERROR)
                else:  # the workflow's own code cancelled itself
                    await self._fail(exc)
            except Exception as exc:
                await ctx.settled.wait()
                await self._fail(exc)
            else:
                await self._finish(RunStatus.SUCCEEDED, result, None)
            return

    def _stopping(self) -> bool:
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0

    async def _await_with_deadline(self, task: asyncio.Task[str]) -> str:
        deadline = self.record.deadline_at
        if deadline is None:
            return await task
        remaining = deadline - self.engine.clock.now()
        if remaining > 0:
            done, _ = await asyncio.wait({task}, timeout=remaining)
            if done:
                return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise WorkflowTimeout(
            f"run {self.record.id!r} went past the timeout of workflow {self.record.workflow!r} "
            f"and was failed; raise @app.workflow(timeout=...) if it needs longer"
        )

    async def _body(self, ctx: RunContext, workflow: Workflow[..., Any]) -> str:
        _RUN.set(ctx)
        serde = self.engine.serde
        args, kwargs = workflow.decode_args(serde, self.record.args)
        result = await workflow.fn(*args, **kwargs)
        missing = ctx.unreplayed()
        if missing is not None:
            raise Abandon(ctx.divergence(missing))
        await ctx.flush()
        return serde.dumps(result, what=f"result of workflow {workflow.name!r}")

    async def _fail(self, exc: BaseException) -> None:
        await self._finish(RunStatus.FAILED, None, json.dumps(encode_error(exc)))

    async def _finish(self, status: RunStatus, result: str | None, error: str | None) -> None:
        now = self.engine.clock.now()
        await self.engine.store.finish_run(self.lease, status, result, error, now)
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

"""A handle on one run, for callers outside it: its status, its result, cancelling it.

It reads the run through the Store and waits on this process's wake-ups, with polling as the
fallback for runs that another process executes. It never executes or writes checkpoints.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar, cast

from tether.clock import to_datetime
from tether.core.engine import Engine
from tether.core.runner import CANCELLED_ERROR
from tether.errors import (
    ConfigurationError,
    RunCancelled,
    RunDead,
    RunFailed,
    RunNotFound,
    WaitTimeout,
)
from tether.store.port import Checkpoint, RunRecord, RunStatus
from tether.store.port.values import ForkRecord

R = TypeVar("R")

_POLL = 0.25  # seconds between looks at a run that another process executes


@dataclass(frozen=True, slots=True)
class ForkInfo:
    """A fork link: run `run_id` was forked from run `source_run_id`, reusing its checkpoints
    before step `from_step` (`app.fork`)."""

    run_id: str
    source_run_id: str
    from_step: str
    created_at: datetime

    @classmethod
    def of(cls, record: ForkRecord) -> ForkInfo:
        return cls(record.run_id, record.source_run_id, record.from_step,
                   to_datetime(record.created_at))  # fmt: skip


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What is known of a run, for listings."""

    id: str
    workflow: str
    status: RunStatus
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    error: dict[str, Any] | None
    owner: str | None
    attempt: int  # how many times a worker has claimed the run (its lease epoch)
    failures: int = 0  # executions in a row that failed outside the workflow's code
    # Where the run was forked from, if it is a fork: filled by `handle.info()` (listings
    # leave it None, to read one row per run).
    fork: ForkInfo | None = None
    # Where a listing goes on after this run: `app.list_runs(cursor=...)` lists older ones.
    cursor: str = ""
    # Where it runs, the version it is pinned to and who started it (None when not known).
    queue: str | None = None
    version: str | None = None
    started_by: str | None = None

    @classmethod
    def of(cls, record: RunRecord) -> RunInfo:
        return cls(
            id=record.id,
            workflow=record.workflow,
            status=record.status,
            created_at=to_datetime(record.created_at),
            updated_at=to_datetime(record.updated_at),
            finished_at=None if record.finished_at is None else to_datetime(record.finished_at),
            error=None if record.error is None else json.loads(record.error),
            owner=record.owner,
            attempt=record.epoch,
            failures=record.failures,
            cursor=page_cursor(record.created_at, record.id),
            queue=record.queue,
            version=record.version,
            started_by=record.started_by,
        )


# A listing's cursor: base64url (unpadded) of the JSON [created_at, id] of the last run of a
# page. The float itself, not the datetime shown (microseconds would lose ties' order).


def page_cursor(created_at: float, run_id: str) -> str:
    """The opaque cursor of the page after the run (created_at, run_id)."""
    text = json.dumps([created_at, run_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def read_cursor(cursor: str) -> tuple[float, str]:
    """(created_at, id) of a cursor that page_cursor made; ConfigurationError otherwise."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_at, run_id = json.loads(text)
    except (binascii.Error, UnicodeDecodeError, ValueError, TypeError):
        created_at = run_id = None
    number = isinstance(created_at, int | float) and not isinstance(created_at, bool)
    if not (number and math.isfinite(created_at) and isinstance(run_id, str)):
        raise ConfigurationError(
            f"invalid cursor {cursor[:80]!r}: a cursor is the `cursor` of a listed run (the "
            f"X-Next-Cursor of a page of GET /api/runs), passed back unchanged"
        )
    return float(created_at), run_id


class RunHandle(Generic[R]):
    """A run, by id. `await handle.result()` waits for it to end."""

    def __init__(self, engine: Engine, run_id: str, *, cancel_local: Any = None) -> None:
        self._engine = engine
        self.id = run_id
        self._cancel_local = cancel_local

    def __repr__(self) -> str:
        return f"<tether run {self.id!r}>"

    async def _record(self) -> RunRecord:
        record = await self._engine.store.get_run(self.id)
        if record is None:
            raise RunNotFound(f"no run has id {self.id!r}; check the id with `tether runs list`")
        return record

    async def info(self) -> RunInfo:
        """What is known of the run, with the fork it was made as (`.fork`), if any."""
        info = RunInfo.of(await self._record())
        link = await self._engine.store.get_fork(self.id)
        return info if link is None else dataclasses.replace(info, fork=ForkInfo.of(link))

    async def forks(self) -> list[ForkInfo]:
        """The runs forked from this one (`app.fork`), oldest first."""
        await self._record()
        return [ForkInfo.of(f) for f in await self._engine.store.list_forks(self.id)]

    async def status(self) -> RunStatus:
        return (await self._record()).status

    async def checkpoints(self) -> list[Checkpoint]:
        """The run's recorded history, in the order its checkpoints were first recorded (each
        with its position: concurrent tasks of the workflow record in the order they end)."""
        await self._record()
        return await self._engine.store.load_history(self.id)

    async def result(self, timeout: float | timedelta | None = None) -> R:
        """Wait for the run to end and return its result. Raises RunFailed, RunDead (a
        RunFailed) or RunCancelled for runs that ended so, and WaitTimeout (the run goes on) if
        `timeout` runs out first."""
        engine = self._engine
        limit = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        loop = asyncio.get_running_loop()
        deadline = None if limit is None else loop.time() + limit
        record: RunRecord | None = None
        while True:
            # Register before reading, so an end in between still wakes us.
            future: asyncio.Future[RunRecord | None] = loop.create_future()
            engine.wakeups.setdefault(self.id, []).append(future)
            try:
                # A run this process executes wakes us when it ends here: no read needed.
                if record is None and not engine.executing_here(self.id):
                    record = await self._record()
                if record is not None and record.status.terminal:
                    return self._outcome(record)
                wait = _POLL if deadline is None else min(_POLL, deadline - loop.time())
                if wait <= 0:
                    state = "running here" if record is None else f"it is {record.status}"
                    raise WaitTimeout(
                        f"run {self.id!r} did not end within {limit}s ({state}); "
                        f"it goes on: wait again or check `tether runs show {self.id}`"
                    )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await future
                # The run's final state when this process ended it; else read it again (a
                # timed-out wait cancels the future).
                ended = future.done() and not future.cancelled()
                record = future.result() if ended else None
            finally:
                waiters = engine.wakeups.get(self.id)
                if waiters is not None and future in waiters:
                    waiters.remove(future)
                    if not waiters:
                        del engine.wakeups[self.id]

    def _outcome(self, record: RunRecord) -> R:
        if record.status is RunStatus.SUCCEEDED:
            workflow = self._engine.workflows.get(record.workflow)
            hint = workflow.return_hint if workflow is not None else Any
            value = self._engine.serde.loads(
                record.result or "null", hint, what=f"result of run {self.id!r}"
            )
            return cast(R, value)
        error = json.loads(record.error) if record.error else None
        if record.status is RunStatus.CANCELLED:
            raise RunCancelled(self.id, error)
        if record.status is RunStatus.DEAD:
            raise RunDead(self.id, error)
        raise RunFailed(self.id, error)

    async def cancel(self) -> None:
        """Cancel the run: a waiting or pending run ends at once; a running one at its next
        await. Cancelling a finished run changes nothing."""
        record = await self._engine.store.cancel_run(
            self.id, CANCELLED_ERROR, self._engine.clock.now()
        )
        if record.status.terminal:
            self._engine.run_ended(self.id, record)
        elif record.cancel_requested and self._cancel_local is not None:
            self._cancel_local(self.id)

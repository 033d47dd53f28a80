"""The blocking twin of App and RunHandle, for callers without an event loop.

One implementation: each blocking call runs the async one on a private event loop in a
background thread (a portal) and waits for it. Use either the async App or its `.sync` twin on
one App, not both. This module adds no behaviour of its own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Coroutine, Iterator, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tether.core.handle import ForkInfo, RunHandle, RunInfo
from tether.store.port import Checkpoint, RunStatus

if TYPE_CHECKING:
    from tether.app import App
    from tether.approvals.model import Approval, Decision, HistoryEntry, Reviewer
    from tether.core.workflow import Workflow
    from tether.retention import GcReport, StorageStatus
    from tether.schedules import ScheduleInfo
    from tether.store.port.outbox import OutboxMessage
    from tether.values import ValueInfo

T = TypeVar("T")
R = TypeVar("R")


class _Portal:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._serve, args=(self._loop,), name="tether-sync", daemon=True
                )
                self._thread.start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.run_forever()
        finally:
            loop.close()

    def stop(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
            thread, self._thread = self._thread, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()


_PORTALS: dict[int, _Portal] = {}


class SyncRunHandle(Generic[R]):
    def __init__(self, portal: _Portal, handle: RunHandle[R]) -> None:
        self._portal = portal
        self._handle = handle
        self.id = handle.id

    def status(self) -> RunStatus:
        return self._portal.call(self._handle.status())

    def info(self) -> RunInfo:
        return self._portal.call(self._handle.info())

    def result(self, timeout: float | timedelta | None = None) -> R:
        return self._portal.call(self._handle.result(timeout))

    def cancel(self) -> None:
        self._portal.call(self._handle.cancel())

    def checkpoints(self) -> list[Checkpoint]:
        return self._portal.call(self._handle.checkpoints())

    def forks(self) -> list[ForkInfo]:
        return self._portal.call(self._handle.forks())


class SyncApp:
    """`with app.sync as s: s.start(wf, ...).result()` runs the worker in the background."""

    def __init__(self, app: App) -> None:
        self._app = app
        self._portal = _PORTALS.setdefault(id(app), _Portal())

    def __enter__(self) -> SyncApp:
        self._portal.call(self._app.__aenter__())
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._portal.call(self._app.close())
        self._portal.stop()
        _PORTALS.pop(id(self._app), None)

    def start(
        self,
        workflow: Workflow[..., R] | str,
        *args: Any,
        id: str | None = None,
        **kwargs: Any,
    ) -> SyncRunHandle[R]:
        handle = self._portal.call(self._app.start(workflow, *args, id=id, **kwargs))
        return SyncRunHandle(self._portal, handle)

    def start_at(
        self,
        when: datetime | timedelta,
        workflow: Workflow[..., R] | str,
        *args: Any,
        id: str | None = None,
        **kwargs: Any,
    ) -> SyncRunHandle[R]:
        handle = self._portal.call(self._app.start_at(when, workflow, *args, id=id, **kwargs))
        return SyncRunHandle(self._portal, handle)

    def list_schedules(self) -> list[ScheduleInfo]:
        return self._portal.call(self._app.list_schedules())

    def fork(self, run_id: str, from_step: str, *, id: str | None = None) -> SyncRunHandle[Any]:
        handle = self._portal.call(self._app.fork(run_id, from_step, id=id))
        return SyncRunHandle(self._portal, handle)

    def get_value(self, run_id: str, key: str, **options: Any) -> object:
        """`app.get_value` (wait=, default=, after_version=)."""
        return self._portal.call(self._app.get_value(run_id, key, **options))

    def list_values(self, run_id: str) -> list[ValueInfo]:
        return self._portal.call(self._app.list_values(run_id))

    def watch_value(self, run_id: str, key: str, *, after_version: int = 0) -> Iterator[ValueInfo]:
        """`app.watch_value` as a blocking iterator."""
        return self._blocking(self._app.watch_value(run_id, key, after_version=after_version))

    def list_outbox(
        self, *, status: str | None = None, run_id: str | None = None, limit: int = 100
    ) -> list[OutboxMessage]:
        return self._portal.call(self._app.list_outbox(status=status, run_id=run_id, limit=limit))

    def retry_outbox(self, message_id: str) -> OutboxMessage:
        return self._portal.call(self._app.retry_outbox(message_id))

    def gc(self, **options: Any) -> GcReport:
        """`app.gc` (retention=, dry_run=, vacuum=, now=)."""
        return self._portal.call(self._app.gc(**options))

    def storage_status(self) -> StorageStatus:
        return self._portal.call(self._app.storage_status())

    def send(self, run_id: str, key: str, payload: object = None) -> None:
        self._portal.call(self._app.send(run_id, key, payload))

    def get(self, run_id: str) -> SyncRunHandle[Any]:
        return SyncRunHandle(self._portal, self._portal.call(self._app.get(run_id)))

    def list_runs(
        self,
        *,
        status: RunStatus | str | Sequence[RunStatus | str] | None = None,
        workflow: str | None = None,
        limit: int = 100,
        queue: str | None = None,
        version: str | None = None,
        started_by: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        id_prefix: str | None = None,
        cursor: str | None = None,
    ) -> list[RunInfo]:
        return self._portal.call(self._app.list_runs(
            status=status, workflow=workflow, limit=limit, queue=queue, version=version,
            started_by=started_by, since=since, until=until, id_prefix=id_prefix, cursor=cursor,
        ))  # fmt: skip

    def list_approvals(
        self, status: str | None = "pending", *, run_id: str | None = None,
        reviewer: Reviewer | str | None = None, limit: int = 100,
    ) -> list[Approval]:  # fmt: skip
        listed = self._app.list_approvals(status, run_id=run_id, reviewer=reviewer, limit=limit)
        return self._portal.call(listed)

    def get_approval(self, approval_id: str, *, viewer: Reviewer | str | None = None) -> Approval:
        return self._portal.call(self._app.get_approval(approval_id, viewer=viewer))

    def decide(
        self, approval_id: str, option: str, *, reviewer: Reviewer | str, operation_digest: str,
        comment: str | None = None, response: object = None,
    ) -> Decision:  # fmt: skip
        return self._portal.call(self._app.decide(
            approval_id, option, reviewer=reviewer, operation_digest=operation_digest,
            comment=comment, response=response,
        ))  # fmt: skip

    def cancel_approval(
        self, approval_id: str, *, actor: str | None = None, reason: str = "cancelled"
    ) -> Decision:
        return self._portal.call(self._app.cancel_approval(approval_id, actor=actor,
                                                           reason=reason))  # fmt: skip

    def approval_history(self, approval_id: str) -> list[HistoryEntry]:
        return self._portal.call(self._app.approval_history(approval_id))

    def verify_approvals(self, approval_id: str | None = None) -> dict[str, list[str]]:
        return self._portal.call(self._app.verify_approvals(approval_id))

    def read_stream(
        self, run_id: str, key: str, offset: int = 0, *, follow: bool = True
    ) -> Iterator[tuple[int, object]]:
        """`app.read_stream` as a blocking iterator."""
        return self._blocking(self._app.read_stream(run_id, key, offset, follow=follow))

    def _blocking(self, items: AsyncGenerator[T, None]) -> Iterator[T]:
        """An async generator of the App as a blocking iterator: each step waits on the
        portal's loop."""

        async def step() -> tuple[bool, T | None]:
            try:
                return True, await items.__anext__()
            except StopAsyncIteration:
                return False, None

        try:
            while True:
                more, item = self._portal.call(step())
                if not more:
                    return
                yield item  # type: ignore[misc]
        finally:
            self._portal.call(items.aclose())

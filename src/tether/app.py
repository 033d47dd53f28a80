"""The App: where workflows and steps are registered, runs are started and looked up, and the
in-process worker lives (`async with app:`).

A thin facade over the engine: it validates what callers pass, then calls the store, the worker
and the handles. It holds no execution logic and imports no backend directly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast, overload

from tether.agents.tools import NeedsApproval, Tool, make_tool
from tether.approvals.manage import ApprovalsMixin
from tether.approvals.notify import Notifier
from tether.clock import Clock, DatabaseClock
from tether.core.engine import Engine, Settings
from tether.core.handle import RunHandle, RunInfo, read_cursor
from tether.core.replay import ReplayMixin
from tether.core.resume import resume
from tether.core.retry import Retry
from tether.core.start import check_run_id, create_run, new_run_id
from tether.core.step import IN_DOUBT, Step
from tether.core.versions import VersionsMixin, check_version
from tether.core.waits import check_key
from tether.core.worker import Worker
from tether.core.workflow import Named, Workflow
from tether.errors import ConfigurationError, EventRefused, RunNotFound
from tether.forks import ForkMixin
from tether.outbox import OutboxMixin, Sender
from tether.retention import Retention, RetentionMixin
from tether.schedules import ScheduleMixin
from tether.serde import DEFAULT_MAX_PAYLOAD, Serde
from tether.store import default_url, store_from_url
from tether.store.port import QueueLimits, RunStatus, Store
from tether.streams import StreamsMixin
from tether.values import ValuesMixin

if TYPE_CHECKING:
    from tether.sync import SyncApp

P = ParamSpec("P")
R = TypeVar("R")


def _env_flag(name: str) -> bool:
    import os

    return os.environ.get(name, "").lower() in ("1", "true", "yes")


@dataclass(frozen=True, slots=True)
class Rate:
    """A rate limit: at most `count` starts per `per`."""

    count: int
    per: timedelta = timedelta(minutes=1)

    def __post_init__(self) -> None:
        if not isinstance(self.count, int) or self.count < 1 or self.per <= timedelta(0):
            raise ConfigurationError(f"a Rate needs count >= 1 and a positive period: {self!r}")


class _WorkflowDecorator:
    """What `@app.workflow(...)` with options returns; typed so the workflow keeps its types."""

    def __init__(self, register: Callable[[Callable[..., Any]], Workflow[..., Any]]) -> None:
        self._register = register

    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> Workflow[P, R]:
        return cast("Workflow[P, R]", self._register(fn))


class _StepDecorator:
    """What `@app.step(...)` with options returns; typed so the step keeps its types."""

    def __init__(self, register: Callable[[Callable[..., Any]], Step[..., Any]]) -> None:
        self._register = register

    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> Step[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Step[P, R]: ...
    def __call__(self, fn: Callable[..., Any], /) -> Step[..., Any]:
        return self._register(fn)


class App(ApprovalsMixin, StreamsMixin, ReplayMixin, OutboxMixin, ScheduleMixin, ValuesMixin,
          ForkMixin, RetentionMixin, VersionsMixin):  # fmt: skip
    """A Tether application on one database: `App()` uses ./tether.db or $TETHER_DATABASE_URL."""

    def __init__(
        self,
        url: str | None = None,
        *,
        store: Store | None = None,
        clock: Clock | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        lease_duration: timedelta = timedelta(seconds=15),
        concurrency: int = 1000,
        max_executions: int = 5,
        force_replay: bool | None = None,
        notifiers: Sequence[Notifier] = (),
        telemetry: bool | None = None,
        senders: Mapping[str, Sender] | None = None,
        retention: Retention | None = None,
        version: str | None = None,
    ) -> None:
        if lease_duration <= timedelta(0) or concurrency < 1 or max_executions < 1:
            raise ConfigurationError(
                f"lease_duration must be positive, concurrency and max_executions >= 1 "
                f"(got {lease_duration!r}, {concurrency!r}, {max_executions!r})"
            )
        self.url = store.url if store is not None else (url or default_url())
        settings = Settings(
            lease_duration=lease_duration.total_seconds(),
            concurrency=concurrency,
            max_executions=max_executions,
            force_replay=_env_flag("TETHER_FORCE_REPLAY") if force_replay is None else force_replay,
            version=None if version is None else check_version(version),
        )
        self.engine = Engine(
            store=store if store is not None else store_from_url(self.url),
            serde=Serde(max_payload=max_payload),
            clock=clock or DatabaseClock(),
            settings=settings,
        )
        for notifier in notifiers:
            if not isinstance(notifier, Notifier):
                raise ConfigurationError(
                    f"{notifier!r} is not a notifier: give it async approval_requested(approval) "
                    f"and approval_decided(approval, decision) methods"
                )
        self.engine.notifiers = list(notifiers)
        # OpenTelemetry spans and metrics (docs/observability.md): off unless asked, since even
        # without an SDK each span costs a few microseconds on the hot path. None:
        # $TETHER_OTEL decides.
        if _env_flag("TETHER_OTEL") if telemetry is None else telemetry:
            from tether.telemetry import meters, spans

            spans.enable(self.engine, required=telemetry is not None)
            meters.enable(self.engine, required=telemetry is not None)
        self._init_outbox(senders)
        self._init_retention(retention)
        self._opened = False

    def __repr__(self) -> str:
        return f"<tether.App {self.url!r}>"

    # -- registration -----------------------------------------------------------------------

    @overload
    def workflow(self, fn: Callable[P, Awaitable[R]], /) -> Workflow[P, R]: ...
    @overload
    def workflow(
        self,
        /,
        *,
        name: str | None = None,
        timeout: timedelta | None = None,
        queue: str | None = None,
    ) -> _WorkflowDecorator: ...

    def workflow(
        self,
        fn: Any = None,
        /,
        *,
        name: str | None = None,
        timeout: timedelta | None = None,
        queue: str | None = None,
    ) -> Any:
        """Register an `async def` as a workflow: deterministic code that calls steps. Its runs
        go to `queue`, if given (see `app.queue` for its limits)."""

        def register(f: Callable[..., Awaitable[Any]]) -> Workflow[..., Any]:
            wf: Workflow[..., Any] = Workflow(
                f, name=name or f.__name__, timeout=timeout, queue=queue
            )
            known = self.engine.workflows.get(wf.name)
            if known is not None and not _redefined(known.fn, f):
                raise ConfigurationError(
                    f"two workflows are named {wf.name!r} ({_where(known.fn)} and "
                    f"{_where(f)}); pass name= to tell them apart"
                )
            self.engine.workflows[wf.name] = wf
            return wf

        return register(fn) if fn is not None else _WorkflowDecorator(register)

    @overload
    def step(self, fn: Callable[P, Awaitable[R]], /) -> Step[P, R]: ...
    @overload
    def step(self, fn: Callable[P, R], /) -> Step[P, R]: ...
    @overload
    def step(
        self,
        /,
        *,
        name: str | None = None,
        retry: Retry | None = None,
        timeout: timedelta | None = None,
        at_most_once: bool = False,
        reconcile: Callable[..., object] | None = None,
        in_doubt: tuple[type[BaseException], ...] = IN_DOUBT,
    ) -> _StepDecorator: ...

    def step(
        self,
        fn: Any = None,
        /,
        *,
        name: str | None = None,
        retry: Retry | None = None,
        timeout: timedelta | None = None,
        at_most_once: bool = False,
        reconcile: Callable[..., object] | None = None,
        in_doubt: tuple[type[BaseException], ...] = IN_DOUBT,
    ) -> Any:
        """Register a function (def or async def) as a step: its result is checkpointed. An
        `at_most_once` step needs a `timeout` shorter than the lease; an attempt that raises
        one of `in_doubt` (or times out) may have had its effect, so it is reconciled, never
        retried blindly."""
        lease = self.engine.settings.lease_duration
        if at_most_once and timeout is not None and timeout.total_seconds() >= lease:
            raise ConfigurationError(
                f"at-most-once step {name or getattr(fn, '__name__', '?')!r} has timeout="
                f"{timeout}, not shorter than the lease ({lease:g}s): another worker could "
                f"reconcile it while an attempt still runs. Shorten the timeout or raise "
                f"App(lease_duration=...)"
            )

        def register(f: Callable[..., Any]) -> Step[..., Any]:
            return Step(
                f,
                name=name or f.__name__,
                retry=retry,
                timeout=timeout,
                at_most_once=at_most_once,
                reconcile=reconcile,
                in_doubt=in_doubt,
            )

        return register(fn) if fn is not None else _StepDecorator(register)

    def tool(
        self,
        fn: Any = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        needs_approval: NeedsApproval = False,
        reviewers: Sequence[str] = ("*",),
        approval_expires_in: timedelta = timedelta(hours=1),
        retry: Retry | None = None,
        timeout: timedelta | None = None,
    ) -> Any:
        """Register a function as a tool for `tether.Agent`: a step whose JSON schema comes
        from its signature and description from its docstring. With `needs_approval` (True, or
        a function of the call's arguments) the agent asks `reviewers` before each call."""

        def register(f: Callable[..., Any]) -> Tool[..., Any]:
            return make_tool(f, name=name, description=description, needs_approval=needs_approval,
                             reviewers=reviewers, approval_expires_in=approval_expires_in,
                             retry=retry, timeout=timeout)  # fmt: skip

        return register(fn) if fn is not None else register

    def queue(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        worker_concurrency: int | None = None,
        rate: Rate | None = None,
    ) -> None:
        """Set the limits of a queue: runs running at once across all workers, on one worker,
        and starts per period (`tether.Rate(100, per=timedelta(minutes=1))`)."""
        for label, value in (("concurrency", concurrency),
                             ("worker_concurrency", worker_concurrency)):  # fmt: skip
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigurationError(f"queue {name!r}: {label} must be an int >= 1")
        if rate is not None and not isinstance(rate, Rate):
            raise ConfigurationError(f"queue {name!r}: rate takes a tether.Rate, not {rate!r}")
        self.engine.queues[name] = QueueLimits(
            concurrency=concurrency, worker_concurrency=worker_concurrency,
            rate=None if rate is None else rate.count,
            period=60.0 if rate is None else rate.per.total_seconds(),
        )  # fmt: skip

    # -- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect to the database and migrate its schema (done on first use anyway)."""
        if not self._opened:
            await self.engine.store.open()
            self._opened = True
            await self.engine.sync_clock()

    async def close(self) -> None:
        worker = self.engine.worker
        if worker is not None:
            self.engine.worker = None
            await worker.stop()
        if self._opened:
            await self.engine.store.close()
            self._opened = False

    async def __aenter__(self) -> App:
        await self.open()
        if self.engine.worker is None:
            worker = Worker(self.engine)
            self.engine.worker = worker
            await worker.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def worker_id(self) -> str | None:
        """The id of this App's in-process worker while it runs (`async with app:`)."""
        return None if self.engine.worker is None else self.engine.worker.id

    @property
    def sync(self) -> SyncApp:
        """The blocking twin of this App, for callers without an event loop."""
        from tether.sync import SyncApp

        return SyncApp(self)

    # -- runs -------------------------------------------------------------------------------

    def _workflow(self, workflow: Workflow[..., Any] | str) -> Workflow[..., Any]:
        name = workflow if isinstance(workflow, str) else getattr(workflow, "name", None)
        found = self.engine.workflows.get(name) if isinstance(name, str) else None
        if found is None or (not isinstance(workflow, str) and found is not workflow):
            raise ConfigurationError(
                f"{workflow!r} is not a workflow of this App; decorate it with @app.workflow() "
                f"(known: {sorted(self.engine.workflows)})"
            )
        return found

    def _handle(self, run_id: str) -> RunHandle[Any]:
        return RunHandle(self.engine, run_id, cancel_local=self._cancel_local)

    def _cancel_local(self, run_id: str) -> None:
        if self.engine.worker is not None:
            self.engine.worker.cancel(run_id)

    @overload
    async def start(
        self, workflow: Workflow[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> RunHandle[R]: ...
    # Start options cannot sit between P.args and P.kwargs (PEP 612): a call that passes one
    # is checked for its result type and options, not for the workflow's arguments.
    # fmt: off
    @overload
    async def start(self, workflow: Workflow[..., R], /, *args: Any, id: str | None,
                    priority: int = 0, dedup_key: str | None = None,
                    started_by: str | None = None, **kwargs: Any) -> RunHandle[R]: ...
    @overload
    async def start(self, workflow: Workflow[..., R], /, *args: Any, priority: int,
                    dedup_key: str | None = None, started_by: str | None = None,
                    **kwargs: Any) -> RunHandle[R]: ...
    @overload
    async def start(self, workflow: Workflow[..., R], /, *args: Any, dedup_key: str | None,
                    started_by: str | None = None, **kwargs: Any) -> RunHandle[R]: ...
    @overload
    async def start(self, workflow: Workflow[..., R], /, *args: Any, started_by: str | None,
                    **kwargs: Any) -> RunHandle[R]: ...
    @overload
    async def start(self, workflow: str | Named, /, *args: Any, id: str | None = None,
                    priority: int = 0, dedup_key: str | None = None,
                    started_by: str | None = None, **kwargs: Any) -> RunHandle[Any]: ...
    # fmt: on

    # Options typed Any: the first overload's workflow arguments may use these names.
    async def start(self, workflow: Workflow[..., Any] | Named | str, /, *args: Any,
                    id: Any = None, priority: Any = 0, dedup_key: Any = None,
                    started_by: Any = None, **kwargs: Any) -> RunHandle[Any]:  # fmt: skip
        """Start a run; `id` is its idempotency key: the same id returns the same run. A higher
        `priority` is claimed sooner; `dedup_key` admits one unfinished run per key in the
        workflow's queue (DuplicateRun otherwise). `started_by` names who asked for the run:
        approvals with `separate_duties=True` refuse that person as a reviewer.

        A registered workflow's arguments are checked against its signature and type hints
        before anything is written (ConfigurationError). A name this App does not register
        (or a `Named`, which also gives its queue) starts a run for a worker that has the
        code: the arguments are stored as given, and arguments that do not fit make the run
        dead at once, with the reason as its error."""
        wf = self._to_start(workflow)
        check_run_id(id)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ConfigurationError(f"priority must be an int, not {priority!r}")
        for label, given in (("dedup_key", dedup_key), ("started_by", started_by)):
            if given is not None and not isinstance(given, str):
                raise ConfigurationError(f"{label} must be a str or None, not {given!r}")
        run_id = id or new_run_id(self.engine)
        await self.open()
        await create_run(self.engine, wf, args, kwargs, run_id, priority=priority,
                         dedup_key=dedup_key, started_by=started_by)  # fmt: skip
        return self._handle(run_id)

    def _to_start(self, workflow: Workflow[..., Any] | Named | str) -> Workflow[..., Any] | Named:
        """What a start names: a registered workflow (by object or name), else a Named."""
        if isinstance(workflow, Named):
            found = self.engine.workflows.get(workflow.name)
            return workflow if found is None else found
        if isinstance(workflow, str) and workflow not in self.engine.workflows:
            return Named(workflow)
        return self._workflow(workflow)

    async def send(self, run_id: str, key: str, payload: object = None) -> None:
        """Deliver an event to the run's mailbox; `tether.wait_for_event(key)` takes it (an
        event sent before the run waits is kept for it). Raises RunNotFound, and EventRefused
        for a run that has finished: nothing would ever read the event."""
        check_key(key)
        text = self.engine.serde.dumps(payload, what=f"the payload of event {key!r}")
        await self.open()
        record = await self.engine.store.deliver_event(run_id, key, text, self.engine.clock.now())
        if record.status.terminal:
            raise EventRefused(
                f"run {run_id!r} has finished ({record.status.value}); the event {key!r} was "
                f"not stored, since nothing would ever read it"
            )
        self.engine.wake(run_id)

    async def resume(self, run_id: str) -> RunHandle[Any]:
        """Give a failed, dead or held run another go once its cause is fixed: completed steps
        replay from their checkpoints, the step whose failure ended the run gets one more
        attempt under the current code (failures the workflow caught stay as recorded), a
        dead run's count of failed executions starts over, and a held run is tried again at
        once. Its workflow's timeout counts again from now. Raises RunNotFound,
        ConfigurationError unless the run failed, is dead or held, and DuplicateRun if an
        unfinished run of its queue now holds its dedup key."""
        await self.open()
        await resume(self.engine, run_id)
        if self.engine.worker is not None:
            self.engine.worker.notify()
        return self._handle(run_id)

    async def get(self, run_id: str) -> RunHandle[Any]:
        """A handle on an existing run; raises RunNotFound."""
        await self.open()
        if await self.engine.store.get_run(run_id) is None:
            raise RunNotFound(f"no run has id {run_id!r}; check the id with `tether runs list`")
        return self._handle(run_id)

    async def list_runs(
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
        """Runs, newest first: of any of these statuses, this workflow, queue, version and
        starter, created at or after `since` and before `until` (aware datetimes), whose id
        starts with `id_prefix` (literally). A page of at most `limit`; the `cursor` of its
        last run (`RunInfo.cursor`) lists the next one. Raises ConfigurationError for an
        unknown status, a naive datetime or a cursor that is not one."""
        wanted = [] if status is None else [status] if isinstance(status, str) else status
        try:
            statuses = [RunStatus(s) for s in wanted]
        except ValueError:
            raise ConfigurationError(
                f"unknown status in {wanted!r}; use {[s.value for s in RunStatus]}"
            ) from None
        bounds = []
        for name, moment in (("since", since), ("until", until)):
            if moment is not None and moment.utcoffset() is None:
                raise ConfigurationError(
                    f"{name}={moment!r} has no time zone; pass an aware datetime "
                    f"(datetime.now(timezone.utc), or one with tzinfo)"
                )
            bounds.append(None if moment is None else moment.timestamp())
        before = None if cursor is None else read_cursor(cursor)
        await self.open()
        records = await self.engine.store.list_runs(
            statuses=statuses, workflow=workflow, limit=limit, before=before, queue=queue,
            version=version, started_by=started_by, created_after=bounds[0],
            created_before=bounds[1], id_prefix=id_prefix or None,
        )  # fmt: skip
        return [RunInfo.of(r) for r in records]


def _redefined(before: Callable[..., Any], after: Callable[..., Any]) -> bool:
    """Whether `after` is `before` defined again (a notebook cell run twice, a module
    reloaded): the same qualified name in the same module. The new code replaces the old."""
    return (before.__module__, before.__qualname__) == (after.__module__, after.__qualname__)


def _where(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"

"""Schedules: `@app.schedule("cron expr", tz=...)` starts one run per slot, and
`app.start_at(when, ...)` starts a run later; the worker service that starts due slots.

The decisions (which slots are due, which of them to start after downtime) are made here, once;
the store only moves a schedule's cursor by compare-and-set together with the slot's runs. It
must not import a backend, the server or the CLI.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from tether.clock import to_datetime
from tether.core.engine import Engine
from tether.core.start import check_run_id, check_same_run, create_run, new_run_id
from tether.core.workflow import Workflow
from tether.errors import ConfigurationError
from tether.store.port import NewRun, RunRecord
from tether.store.port.schedules import CATCH_UP, ScheduleSpec

if TYPE_CHECKING:
    from tether.core.handle import RunHandle
    from tether.core.worker import Worker

log = logging.getLogger("tether.schedules")

R = TypeVar("R")
W = TypeVar("W", bound=Workflow[..., Any])

SERVICE = "tether-schedules"  # its name in engine.services
# catch_up="skip" still starts a slot that is at most this late (a worker waking a moment
# after its slot, a short restart); an older missed slot is skipped.
SKIP_GRACE = 60.0
# catch_up="all" starts at most this many missed slots (the latest ones) in one go.
MAX_CATCH_UP = 1000
# The service looks again at least this often (wall-clock jumps, a laptop waking up).
MAX_SLEEP = 60.0
# How far past now a backward search for due slots starts: cron in a local time zone counts in
# local time, and "now" during a repeated (DST) hour would otherwise hide a slot of its first
# occurrence.
_LOOKAHEAD = 3 * 3600
_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}  # fmt: skip


def zone(tz: str | tzinfo) -> tuple[str, tzinfo]:
    """(the time zone's IANA name, the zone) for a name or a ZoneInfo; ConfigurationError for
    anything else."""
    if tz in ("UTC", UTC):
        return "UTC", UTC
    if isinstance(tz, ZoneInfo):
        return tz.key, tz
    if isinstance(tz, str) and tz:
        try:
            return tz, ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    raise ConfigurationError(
        f"unknown time zone {tz!r}: give an IANA name such as 'Europe/Paris' or 'UTC' (on "
        f"Windows, `pip install tzdata` provides them)"
    )


class Cron:
    """A cron expression (five fields: minute hour day-of-month month day-of-week, or a macro
    such as @daily) read in a time zone; slots are float seconds since the epoch."""

    def __init__(self, expr: str, tz: str | tzinfo = "UTC") -> None:
        if not isinstance(expr, str) or not expr.strip():
            raise ConfigurationError(f"a cron expression is a non-empty str, not {expr!r}")
        self.expr = expr
        self.tz, self.zone = zone(tz)
        self.fields = _MACROS.get(expr.strip().lower(), expr.strip())
        from cronsim import CronSim, CronSimError

        problem = None
        if len(self.fields.split()) != 5:
            problem = f"it has {len(self.fields.split())} fields, not 5"
        else:
            try:
                CronSim(self.fields, datetime(2000, 1, 1, tzinfo=self.zone))
            except CronSimError as exc:
                problem = str(exc)
        if problem is not None:
            raise ConfigurationError(
                f"invalid cron expression {expr!r}: {problem}. Use five fields (minute hour "
                f"day-of-month month day-of-week), e.g. '*/5 * * * *' or '0 9 * * MON-FRI', "
                f"or @hourly, @daily, @weekly, @monthly, @yearly"
            )

    def __repr__(self) -> str:
        return f"Cron({self.expr!r}, tz={self.tz!r})"

    def due(self, after: float, upto: float, limit: int) -> tuple[list[float], bool]:
        """The slots in (after, upto], newest first, at most `limit` of them; and whether
        older ones were left out."""
        from cronsim import CronSim

        lookahead = 0 if self.zone is UTC else _LOOKAHEAD
        start = datetime.fromtimestamp(math.floor(upto) + 1 + lookahead, self.zone)
        found: list[float] = []
        for moment in CronSim(self.fields, start, reverse=True):
            slot = moment.timestamp()
            if slot > upto:
                continue
            if slot <= after:
                return found, False
            if len(found) >= limit:
                return found, True
            found.append(slot)
        return found, False

    def next_after(self, moment: float) -> float | None:
        """The first slot after `moment` (None if there is none in the next 50 years)."""
        from cronsim import CronSim

        start = datetime.fromtimestamp(math.floor(moment), self.zone)
        for tries, found in enumerate(CronSim(self.fields, start)):
            if found.timestamp() > moment:
                return found.timestamp()
            if tries > 1000:  # only DST's repeated hour gives slots at or before `moment`
                break
        return None

    def local(self, slot: float) -> datetime:
        """The slot as an aware datetime in the schedule's time zone."""
        return datetime.fromtimestamp(slot, self.zone)


def slot_run_id(name: str, slot: float) -> str:
    """The id of the run of schedule `name` for this slot: the same in every worker."""
    return f"schedule:{name}:{datetime.fromtimestamp(slot, UTC):%Y-%m-%dT%H:%M:%SZ}"


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule registered on an App: its definition, workflow and parsed cron."""

    spec: ScheduleSpec
    workflow: Workflow[..., Any]
    cron: Cron

    def new_run(self, engine: Engine, slot: float, now: float) -> NewRun:
        """The run of one slot, called with scheduled_at = the slot in the schedule's zone."""
        wf = self.workflow
        text = wf.encode_args(engine.serde, (), {"scheduled_at": self.cron.local(slot)})
        deadline = None if wf.timeout is None else now + wf.timeout.total_seconds()
        return NewRun(slot_run_id(self.spec.name, slot), wf.name, text, deadline, queue=wf.queue)


def choose(due: Sequence[float], catch_up: str, now: float) -> list[float]:
    """Which of the due slots (newest first) to start, oldest first: all of them, the latest,
    or (skip) the latest only if it is at most SKIP_GRACE seconds late."""
    if not due:
        return []
    if catch_up == "all":
        return sorted(due)
    if catch_up == "latest" or now - due[0] <= SKIP_GRACE:
        return [due[0]]
    return []


@dataclass(slots=True)
class TickResult:
    started: list[str] = field(default_factory=list)  # ids of the runs this tick created
    next_at: float | None = None  # the earliest next slot among the schedules


async def tick(engine: Engine, schedules: Sequence[Schedule]) -> TickResult:
    """Start the due slots of these schedules: for each, read its cursor (registering it at
    now the first time), choose among the slots since the cursor by its catch-up policy, and
    move the cursor to the latest due slot by compare-and-set together with the chosen slots'
    runs. A worker that loses the compare-and-set writes nothing: another one decided."""
    store, now = engine.store, engine.clock.now()
    result = TickResult()
    stored = {r.name: r for r in await store.list_schedules()} if schedules else {}
    for schedule in schedules:
        spec = schedule.spec
        row = stored.get(spec.name)
        if row is None or row.spec != spec:
            row = await store.put_schedule(spec, now)
        limit = MAX_CATCH_UP if spec.catch_up == "all" else 2
        due, more = schedule.cron.due(row.last_slot, now, limit)
        if due:
            chosen = choose(due, spec.catch_up, now)
            runs = [schedule.new_run(engine, slot, now) for slot in chosen]
            if await store.advance_schedule(spec.name, row.last_slot, due[0], runs, now):
                result.started += [run.id for run in runs]
                _log_missed(spec, due, more, chosen, row.last_slot)
        following = schedule.cron.next_after(max(now, row.last_slot))
        if following is not None and (result.next_at is None or following < result.next_at):
            result.next_at = following
    return result


def _log_missed(
    spec: ScheduleSpec, due: list[float], more: bool, chosen: list[float], since: float
) -> None:
    if more and spec.catch_up == "all":
        log.warning(
            "schedule %r missed more than %d slots since %s; started the latest %d (catch_up="
            "'all' is bounded by MAX_CATCH_UP), the older ones are skipped",
            spec.name, MAX_CATCH_UP, to_datetime(since).isoformat(), len(chosen),
        )  # fmt: skip
    elif more or len(due) > len(chosen):
        log.info(
            "schedule %r missed slots since %s; catch_up=%r started %s",
            spec.name, to_datetime(since).isoformat(), spec.catch_up,
            [to_datetime(s).isoformat() for s in chosen] or "none",
        )  # fmt: skip


def schedule_service(schedules: dict[str, Schedule]) -> Callable[[Worker], Awaitable[None]]:
    """The worker service: tick the schedules whose workflow the worker serves, then sleep on
    the engine's clock until the next slot (at most MAX_SLEEP), until cancelled."""

    async def serve(worker: Worker) -> None:
        engine = worker.engine
        while not worker.stopped:
            served = set(worker.served())
            mine = [s for s in schedules.values() if s.workflow.name in served]
            if not mine:
                return
            result = await tick(engine, mine)
            if result.started:
                worker.notify()
            wait = MAX_SLEEP if result.next_at is None else result.next_at - engine.clock.now()
            await engine.clock.sleep(min(max(wait, 0.0), MAX_SLEEP))

    return serve


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A schedule, for listings: its definition, and its cursor when the database has it."""

    name: str
    workflow: str
    cron: str
    tz: str
    catch_up: str
    defined: bool  # this App's code defines it (else only the database knows it)
    registered: bool  # a worker has registered it in the database
    # Every slot up to this one was handled (started, or skipped by the catch-up policy);
    # before its first slot, when the schedule was first registered. None: not registered.
    last_slot: datetime | None
    next_slot: datetime | None  # the next slot after max(now, last_slot), in UTC


def _aware_time(when: datetime | timedelta, now: float) -> float:
    if isinstance(when, timedelta):
        return now + when.total_seconds()
    if isinstance(when, datetime):
        if when.tzinfo is None or when.utcoffset() is None:
            raise ConfigurationError(
                f"start_at needs an aware datetime, not the naive {when!r}: add a time zone, "
                f"e.g. datetime(..., tzinfo=ZoneInfo('Europe/Paris')) or UTC"
            )
        return when.timestamp()
    raise ConfigurationError(
        f"start_at takes an aware datetime or a timedelta from now, not {when!r}"
    )


async def create_later(
    engine: Engine,
    wf: Workflow[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    run_id: str,
    at: float,
) -> RunRecord:
    """Create the run waiting until `at` (or find the existing one with this id: the same
    arguments return it, others raise IdempotencyConflict)."""
    text = wf.encode_args(engine.serde, args, kwargs)
    deadline = None if wf.timeout is None else at + wf.timeout.total_seconds()
    new = NewRun(run_id, wf.name, text, deadline, queue=wf.queue, wake_at=at)
    record, created = await engine.store.create_run(new, engine.clock.now())
    if created:
        if engine.worker is not None:
            engine.worker.notify()  # its claim loop looks at the new wake-up time
        return record
    check_same_run(engine, record, wf, text)
    return record


class ScheduleMixin:
    """The App's schedule methods (App inherits them)."""

    engine: Engine

    if TYPE_CHECKING:

        def _workflow(self, workflow: Workflow[..., Any] | str) -> Workflow[..., Any]: ...
        def _handle(self, run_id: str) -> RunHandle[Any]: ...
        async def open(self) -> None: ...

    @property
    def _schedules(self) -> dict[str, Schedule]:
        table: dict[str, Schedule] | None = self.__dict__.get("_schedule_table")
        if table is None:
            table = self.__dict__["_schedule_table"] = {}
        return table

    def schedule(
        self,
        cron: str,
        /,
        *,
        tz: str | tzinfo = "UTC",
        catch_up: str = "latest",
        name: str | None = None,
    ) -> Callable[[W], W]:
        """Start the workflow below once per slot of `cron` (five fields, read in time zone
        `tz`), with `scheduled_at` = the slot. Stack it on `@app.workflow()`. After downtime,
        `catch_up` says which missed slots start: "latest" (the most recent only), "all"
        (each, up to MAX_CATCH_UP), or "skip" (none, unless at most SKIP_GRACE late). Each
        slot starts exactly one run, with id `schedule:<name>:<slot in UTC>`, however many
        workers run. See docs/schedules.md."""
        parsed = Cron(cron, tz)
        if catch_up not in CATCH_UP:
            raise ConfigurationError(
                f"catch_up must be one of {', '.join(map(repr, CATCH_UP))}, not {catch_up!r}"
            )
        if name is not None and (not isinstance(name, str) or not name or len(name) > 200):
            raise ConfigurationError(f"a schedule name is a non-empty str, not {name!r}")

        def register(wf: W) -> W:
            if not isinstance(wf, Workflow) or self.engine.workflows.get(wf.name) is not wf:
                raise ConfigurationError(
                    f"@app.schedule({cron!r}) decorates a workflow of this App: put it above "
                    f"@app.workflow(), not on {wf!r}"
                )
            try:
                wf.signature.bind(scheduled_at=to_datetime(0.0))
            except TypeError:
                raise ConfigurationError(
                    f"workflow {wf.name!r} is scheduled, so it is called with scheduled_at="
                    f"<the slot>; its signature {wf.name}{wf.signature} does not accept that: "
                    f"add a parameter `scheduled_at: datetime` (other parameters need defaults)"
                ) from None
            if self.engine.worker is not None:
                raise ConfigurationError(
                    f"schedule on {wf.name!r} defined while this App's worker runs: define "
                    f"schedules before `async with app:` (or `tether worker`) starts it"
                )
            key = name or wf.name
            if key in self._schedules:
                raise ConfigurationError(
                    f"two schedules are named {key!r}; give one another name=..."
                )
            spec = ScheduleSpec(key, wf.name, cron, parsed.tz, catch_up)
            self._schedules[key] = Schedule(spec, wf, parsed)
            self.engine.services[SERVICE] = schedule_service(self._schedules)
            return wf

        return register

    async def start_at(
        self,
        when: datetime | timedelta,
        workflow: Workflow[..., R] | str,
        *args: Any,
        id: str | None = None,
        **kwargs: Any,
    ) -> RunHandle[R]:
        """Start a run at `when` (an aware datetime, or a timedelta from now); until then it
        is waiting, and cancelling it ends it without it ever starting. A `when` in the past
        starts it now. `id` is its idempotency key, as for `app.start`."""
        wf = self._workflow(workflow)
        check_run_id(id)
        at = _aware_time(when, self.engine.clock.now())
        await self.open()
        run_id = id or new_run_id(self.engine)
        if at <= self.engine.clock.now():
            await create_run(self.engine, wf, args, kwargs, run_id)
        else:
            await create_later(self.engine, wf, args, kwargs, run_id, at)
        return self._handle(run_id)

    async def list_schedules(self) -> list[ScheduleInfo]:
        """The schedules this App defines and those its database holds, by name."""
        await self.open()
        now = self.engine.clock.now()
        stored = {r.name: r for r in await self.engine.store.list_schedules()}
        infos = []
        for key in sorted(set(stored) | set(self._schedules)):
            mine, row = self._schedules.get(key), stored.get(key)
            spec = mine.spec if mine is not None else stored[key].spec
            last = None if row is None else row.last_slot
            try:
                cron = mine.cron if mine is not None else Cron(spec.cron, spec.tz)
                following = cron.next_after(max(now, last or now))
            except ConfigurationError:  # stored by other code, unreadable here
                following = None
            infos.append(ScheduleInfo(
                key, spec.workflow, spec.cron, spec.tz, spec.catch_up, defined=mine is not None,
                registered=row is not None, last_slot=None if last is None else to_datetime(last),
                next_slot=None if following is None else to_datetime(following),
            ))  # fmt: skip
        return infos

"""Durable waits inside a workflow: timers, events from the mailbox, child runs, and the first of
several. A wait is a checkpoint like a step: its outcome is recorded once and replayed.

A wait holds its run in memory (and its lease) for at most a couple of seconds, so an answer
that comes quickly resumes at once; after that, once every task of the workflow waits, the
run is suspended and holds nothing: the store wakes it when the earliest timer of its waits is
due or an event any of them waits on arrives (suspension.py). This module never executes step
bodies and touches the store only through the run's context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from tether.core.context import current_run
from tether.core.execution import RunContext
from tether.core.suspension import park, turn
from tether.errors import ConfigurationError, RunCancelled, RunDead, RunFailed
from tether.store.keys import child_key
from tether.store.port import Checkpoint, CheckpointStatus, RunStatus

TIMEOUT = "tether:timeout"  # the key recorded when a wait's timeout won
_RESERVED = "tether:"


@dataclass(frozen=True, slots=True)
class Winner:
    """Which wait of `wait_any` finished first (`name`, None when the timeout won), and its
    value: an event's payload, a child's result, None for a timer."""

    name: str | None
    value: Any = None


@dataclass(frozen=True, slots=True)
class EventWait:
    """Wait for the next event sent to this run under `key`."""

    key: str


@dataclass(frozen=True, slots=True)
class TimerWait:
    """Wait until `seconds` after the wait began, or until the absolute time `at`."""

    seconds: float | None = None
    at: float | None = None

    def due(self, started: float) -> float:
        return self.at if self.at is not None else started + (self.seconds or 0.0)


@dataclass(frozen=True, slots=True)
class ChildWait:
    """Wait for a child run to end."""

    run_id: str
    workflow: str


WaitSpec = EventWait | TimerWait | ChildWait


def event(key: str) -> EventWait:
    """A wait for `wait_any`: the next event sent to this run under `key`."""
    return EventWait(check_key(key))


def timer(duration: timedelta) -> TimerWait:
    """A wait for `wait_any`: `duration` after the wait began."""
    return TimerWait(seconds=check_duration(duration, "timer"))


def timer_until(when: datetime) -> TimerWait:
    """A wait for `wait_any`: the absolute time `when` (timezone-aware)."""
    return TimerWait(at=check_time(when))


def check_key(key: str) -> str:
    if not isinstance(key, str) or not key or key.startswith(_RESERVED) or len(key) > 256:
        raise ConfigurationError(
            f"an event key must be a non-empty str of <= 256 chars not starting with "
            f"{_RESERVED!r}, not {key!r}"
        )
    return key


def check_duration(duration: timedelta, what: str) -> float:
    if not isinstance(duration, timedelta) or duration < timedelta(0):
        raise ConfigurationError(f"{what} takes a timedelta >= 0, not {duration!r}")
    return duration.total_seconds()


def check_time(when: datetime) -> float:
    if not isinstance(when, datetime) or when.tzinfo is None:
        raise ConfigurationError(
            f"a wake-up time must be a timezone-aware datetime (with tzinfo, e.g. UTC), "
            f"not {when!r}"
        )
    return when.timestamp()


@dataclass(slots=True)
class Plan:
    names: dict[str, WaitSpec] = field(default_factory=dict)  # wait name -> spec
    timeout: float | None = None  # seconds after the start

    def mailbox(self) -> list[str]:
        keys = [s.key for s in self.names.values() if isinstance(s, EventWait)]
        return keys + [child_key(s.run_id) for s in self.names.values() if isinstance(s, ChildWait)]

    def deadline(self, started: float) -> float | None:
        times = [s.due(started) for s in self.names.values() if isinstance(s, TimerWait)]
        if self.timeout is not None:
            times.append(started + self.timeout)
        return min(times, default=None)

    def knows(self, key: str) -> bool:
        """Whether `key` (a recorded winner) is one of this plan's waits."""
        if key == TIMEOUT:
            return self.timeout is not None
        timers = {f"tether:timer:{n}" for n, s in self.names.items() if isinstance(s, TimerWait)}
        return key in timers or key in self.mailbox()

    def needs_start(self) -> bool:
        """Whether the wait's start time must be recorded (relative timers, a timeout)."""
        relative = any(isinstance(s, TimerWait) and s.at is None for s in self.names.values())
        return relative or self.timeout is not None


async def wait(ctx: RunContext, base: str, kind: str, plan: Plan) -> tuple[str, Any]:
    """Run one durable wait; returns (the recorded key that won, its value as JSON data)."""
    slot = ctx.slot(base, kind)
    recorded = slot.recorded
    if recorded is not None and recorded.status is CheckpointStatus.COMPLETED:
        won, value = _decode(ctx, recorded, recorded.result)
        if not plan.knows(won):  # the code changed what it waits for: not this history's
            raise ctx.abandon(ctx.divergence(
                f"the recorded {recorded.name!r} at position {recorded.at} was won by {won!r}, "
                f"which this code does not wait for there", recorded.at,
                (recorded.name, slot.name),
            ))  # fmt: skip
        await turn(ctx, slot.seq)  # in the order outcomes reached the tasks (turns.py)
        return won, value
    clock = ctx.engine.clock
    if recorded is not None and recorded.started_at is not None:
        started = recorded.started_at  # a restart keeps the time left, it does not restart it
    else:
        started = clock.now()
        if plan.needs_start():
            await ctx.write(slot.checkpoint(CheckpointStatus.STARTED, attempts=1,
                                            started_at=started,
                                            retry_at=plan.deadline(started)))  # fmt: skip
    deadline = plan.deadline(started)
    keys = plan.mailbox()
    done = slot.checkpoint(CheckpointStatus.COMPLETED, attempts=1, started_at=started)
    since = clock.now()  # the run is held in memory for a while from here, not from each park
    engine = ctx.engine
    while True:
        # Registered before the mailbox is read: news that comes meanwhile is not lost.
        news = engine.wake_future(ctx.run_id)
        try:
            outcome = await _ready(ctx, plan, keys, done, started)
            if outcome is not None:
                await _replay_if_forced(ctx)
                await turn(ctx, slot.seq)
                return outcome
            # Until news for the run (an event, a child's end) or the deadline; held in memory
            # a short while, then suspended with the other waits of the run (suspension.py).
            await park(ctx, keys=keys, deadline=deadline, since=since, news=news)
        finally:
            engine.drop_wake_future(ctx.run_id, news)


async def _ready(
    ctx: RunContext, plan: Plan, keys: list[str], done: Checkpoint, started: float
) -> tuple[str, Any] | None:
    """The outcome if some wait of the plan is over now (and then it is recorded)."""
    clock = ctx.engine.clock
    if keys:  # events, and the ends of child runs, both come through the mailbox
        taken = await ctx.take_event(keys, done, clock.now())
        if taken is not None:
            return _decode(ctx, done, taken)
    now = clock.now()
    due = sorted((s.due(started), n) for n, s in plan.names.items() if isinstance(s, TimerWait))
    if due and due[0][0] <= now:
        return await _record(ctx, done, f"tether:timer:{due[0][1]}", None)
    if plan.timeout is not None and started + plan.timeout <= now:
        return await _record(ctx, done, TIMEOUT, None)
    return None


async def _record(ctx: RunContext, done: Checkpoint, key: str, value: Any) -> tuple[str, Any]:
    text = json.dumps({"key": key, "value": value})
    await ctx.write(replace(done, result=text, finished_at=ctx.engine.clock.now()))
    return key, value


def _decode(ctx: RunContext, recorded: Checkpoint, text: str | None) -> tuple[str, Any]:
    serde = ctx.engine.serde
    data = ctx.decode(recorded, lambda: _object(serde.loads(text or "{}")))
    return str(data.get("key")), data.get("value")


def _object(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"a wait's outcome is a JSON object, not {value!r:.100}")
    return value


async def _replay_if_forced(ctx: RunContext) -> None:
    if ctx.engine.settings.force_replay:
        await ctx.replay_now()


# -- the helpers workflows call ---------------------------------------------------------------


async def sleep(duration: timedelta) -> None:
    """Sleep durably: the timer survives restarts and fires once, keeping the time left."""
    seconds = check_duration(duration, "tether.sleep()")
    ctx = current_run("sleep")
    await wait(ctx, "sleep", "sleep", Plan({"timer": TimerWait(seconds=seconds)}))


async def sleep_until(when: datetime) -> None:
    """Sleep durably until `when` (a timezone-aware datetime)."""
    at = check_time(when)
    ctx = current_run("sleep_until")
    await wait(ctx, "sleep", "sleep", Plan({"timer": TimerWait(at=at)}))


async def wait_for_event(key: str, *, timeout: timedelta | None = None) -> Any:
    """The payload of the next event sent to this run under `key` (one sent before the wait
    counts); None if `timeout` passes first. Each event is taken once, in order per key."""
    check_key(key)
    limit = None if timeout is None else check_duration(timeout, "wait_for_event timeout")
    ctx = current_run("wait_for_event")
    won, value = await wait(ctx, f"event:{key}", "event", Plan({key: EventWait(key)}, limit))
    return None if won == TIMEOUT else value


async def wait_any(waits: dict[str, WaitSpec], *, timeout: timedelta | None = None) -> Winner:
    """The first of several waits to finish, by name: `tether.event(key)`, `tether.timer(...)`,
    `tether.timer_until(...)` or a child run's handle. Winner(None) if `timeout` passes first."""
    if not waits or not isinstance(waits, dict):
        raise ConfigurationError("wait_any takes a non-empty dict of name -> wait")
    specs: dict[str, WaitSpec] = {}
    for name, given in waits.items():
        spec = getattr(given, "wait_spec", given)  # a child run's handle waits for the child
        if not isinstance(spec, EventWait | TimerWait | ChildWait):
            raise ConfigurationError(
                f"wait_any: {name!r} is {spec!r}; use tether.event(), tether.timer(), "
                f"tether.timer_until() or a child run's handle"
            )
        specs[str(name)] = spec
    limit = None if timeout is None else check_duration(timeout, "wait_any timeout")
    ctx = current_run("wait_any")
    won, value = await wait(ctx, "wait_any", "any", Plan(specs, limit))
    if won == TIMEOUT:
        return Winner(None)
    for name, spec in specs.items():
        if (isinstance(spec, EventWait) and spec.key == won) or (
            isinstance(spec, ChildWait) and child_key(spec.run_id) == won
        ):
            return Winner(name, _child_value(ctx, spec, value))
        if won == f"tether:timer:{name}":
            return Winner(name)
    raise AssertionError(f"wait_any: {won!r} matches none of {list(specs)}")  # see Plan.knows


async def join(ctx: RunContext, spec: ChildWait) -> Any:
    """Wait for a child run to end: its result, or its RunFailed / RunCancelled raised here."""
    _, value = await wait(ctx, f"join:{spec.workflow}", "join", Plan({"child": spec}))
    return _child_value(ctx, spec, value)


def _child_value(ctx: RunContext, spec: WaitSpec, value: Any) -> Any:
    """An event's payload as it is; a child's end (see store.keys.child_outcome) as its
    result, or its failure raised."""
    if not isinstance(spec, ChildWait):
        return value
    what = f"the recorded end of child run {spec.run_id!r}"
    status, error = ctx.decode(what, lambda: _child_end(value))
    if status is RunStatus.DEAD:
        raise RunDead(spec.run_id, error)
    if status is RunStatus.FAILED:
        raise RunFailed(spec.run_id, error)
    if status is RunStatus.CANCELLED:
        raise RunCancelled(spec.run_id, error)
    workflow = ctx.engine.workflows.get(spec.workflow)
    hint = workflow.return_hint if workflow is not None else Any
    serde = ctx.engine.serde
    return ctx.decode(what, lambda: serde.loads(value["result"] or "null", hint,
                                                what=f"result of {spec.run_id}"))  # fmt: skip


def _child_end(value: Any) -> tuple[RunStatus, dict[str, Any] | None]:
    """(status, error) of a child's end as its parent's mailbox recorded it."""
    status = RunStatus(value["status"])
    return status, json.loads(value["error"]) if value.get("error") else None

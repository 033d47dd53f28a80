"""The observer hook: what the engine tells watchers (spans, metrics) about executions.

The runner calls `run_started` when it begins executing a run (one call per claim, so a run
that suspends and resumes is observed once per execution) and `run_ended` when that execution
stops; the step machinery calls `step_started` and `step_ended` around each step attempt.
What a `*_started` call returns is handed back to its `*_ended` call, in the same task, so an
observer may keep state (a span, a context token) without a lookup of its own.

Observers receive identifiers (run id, workflow, step and checkpoint names, attempt), never
arguments or results; a failure comes as its exception so that its type can be named, but its
message may hold payloads and must not be exported.

A run is started under a trace context (W3C traceparent and tracestate): the caller's current
span, as an observer that knows spans reads it (`trace_context`), else one handed in from
outside (`given_trace`: the traceparent header of POST /api/runs). It is stored with the run,
and the runner sets `run_trace` in the run's task before `run_started`, so a run span can name
its parent. Checked here (`valid_trace`); a malformed one is dropped, as W3C asks.

`engine.observer` is None unless something watches: the hot path then pays one attribute
lookup and a comparison per run and per step attempt. Observers run in the event loop and must
not block; one that raises is logged and skipped (Guarded), never fails a run.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from contextvars import ContextVar
from enum import StrEnum
from types import MappingProxyType

log = logging.getLogger("tether.observe")

NO_TRACE: Mapping[str, str] = MappingProxyType({})
# The trace context of the run executed in this task (set by the runner), for run spans.
run_trace: ContextVar[Mapping[str, str]] = ContextVar("tether_run_trace", default=NO_TRACE)
# A trace context handed in for the runs started in this context (a request's traceparent).
given_trace: ContextVar[Mapping[str, str]] = ContextVar("tether_given_trace", default=NO_TRACE)

# W3C Trace Context, level 1: version-traceid-parentid-flags in lowercase hex; a version other
# than 00 (never ff) may add fields after a dash.
_TRACEPARENT = re.compile(
    r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
)
_TRACESTATE = re.compile(r"[\x20-\x7e]{0,512}")  # printable ASCII, at most 512 characters


class RunOutcome(StrEnum):
    """How one execution of a run stopped."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DEAD = "dead"  # dead-lettered: the engine could not execute it, max_executions in a row
    SUSPENDED = "suspended"  # released to wait (a timer, an event, a durable retry delay)
    ERRORED = "errored"  # failed outside the workflow's code; released to be tried again
    HELD = "held"  # replay diverged from the history: held for code that replays it
    ABANDONED = "abandoned"  # stopped without an outcome: lease lost, store gone, worker stop


class StepOutcome(StrEnum):
    """How one step attempt ended."""

    COMPLETED = "completed"
    RETRYING = "retrying"  # failed; another attempt is due
    FAILED = "failed"  # failed for good
    INTERRUPTED = "interrupted"  # cancelled, or the run was abandoned mid-attempt


class Observer:
    """Told of run executions and step attempts; every method does nothing. Subclass it and
    override what you need; install with `engine.observe(observer)`."""

    __slots__ = ()

    def run_started(self, run_id: str, workflow: str, epoch: int) -> object:
        """An execution of the run begins (`epoch`: the how-manyth claim of the run)."""
        return None

    def run_ended(self, state: object, outcome: RunOutcome, error: BaseException | None) -> None:
        """The execution stopped; `state` is what run_started returned, `error` the
        exception that failed the run or stopped the execution, if any."""

    def step_started(
        self, run_id: str, workflow: str, step: str, name: str, attempt: int
    ) -> object:
        """An attempt of a step begins: `step` is the registered step name, `name` the
        checkpoint name in this run (`step`, `step#2`, ...)."""
        return None

    def step_ended(
        self,
        state: object,
        outcome: StepOutcome,
        duration: float,
        error: BaseException | None,
    ) -> None:
        """The attempt ended: `duration` is its checkpoint's finished_at - started_at on the
        engine's clock (for an interrupted one, until now). Its outcome is recorded by the
        time this is called, unless it was interrupted."""

    def trace_context(self) -> Mapping[str, str] | None:
        """The trace context (traceparent, tracestate) of the caller's current span, to store
        with a run it starts now; None when this observer knows no spans or none is current."""
        return None


def valid_trace(carrier: Mapping[str, str]) -> dict[str, str]:
    """The W3C trace context in `carrier` ({} when it has no valid traceparent; a malformed
    tracestate is dropped and the traceparent kept, as the specification asks)."""
    parent = carrier.get("traceparent")
    if not isinstance(parent, str):
        return {}
    parent = parent.strip()
    version = parent[:2]
    if not _TRACEPARENT.match(parent) or (
        len(parent) != 55 if version == "00" else len(parent) > 55 and parent[55] != "-"
    ):
        return {}
    found = {"traceparent": parent}
    state = carrier.get("tracestate")
    if isinstance(state, str) and state.strip() and _TRACESTATE.fullmatch(state.strip()):
        found["tracestate"] = state.strip()
    return found


def trace_to_record(observer: Observer | None) -> str | None:
    """The trace context to store with a run started now, as JSON: the current span's (when
    an observer knows spans), else the one given to this context; None without either."""
    current = observer.trace_context() if observer is not None else None
    found = valid_trace(current or given_trace.get())
    return json.dumps(found, sort_keys=True) if found else None


def recorded_trace(text: str | None) -> Mapping[str, str]:
    """The trace context stored with a run (NO_TRACE when none was, or it is unreadable)."""
    if not text:
        return NO_TRACE
    try:
        stored = json.loads(text)
    except ValueError:
        return NO_TRACE
    return valid_trace(stored) if isinstance(stored, dict) else NO_TRACE


class Guarded(Observer):
    """One observer whose exceptions are logged and swallowed: watching must never fail a run.
    An observer whose started call raised is not told of that end."""

    __slots__ = ("observer",)

    def __init__(self, observer: Observer) -> None:
        self.observer = observer

    def __repr__(self) -> str:
        return repr(self.observer)

    def run_started(self, run_id: str, workflow: str, epoch: int) -> object:
        try:
            return self.observer.run_started(run_id, workflow, epoch)
        except Exception:
            log.exception("observer %r failed in run_started", self.observer)
            return _BROKEN

    def run_ended(self, state: object, outcome: RunOutcome, error: BaseException | None) -> None:
        if state is not _BROKEN:
            try:
                self.observer.run_ended(state, outcome, error)
            except Exception:
                log.exception("observer %r failed in run_ended", self.observer)

    def step_started(
        self, run_id: str, workflow: str, step: str, name: str, attempt: int
    ) -> object:
        try:
            return self.observer.step_started(run_id, workflow, step, name, attempt)
        except Exception:
            log.exception("observer %r failed in step_started", self.observer)
            return _BROKEN

    def step_ended(
        self, state: object, outcome: StepOutcome, duration: float, error: BaseException | None
    ) -> None:
        if state is not _BROKEN:
            try:
                self.observer.step_ended(state, outcome, duration, error)
            except Exception:
                log.exception("observer %r failed in step_ended", self.observer)

    def trace_context(self) -> Mapping[str, str] | None:
        try:
            return self.observer.trace_context()
        except Exception:
            log.exception("observer %r failed in trace_context", self.observer)
            return None


_BROKEN = object()  # the state of an observer whose started call raised


class Observers(Observer):
    """Several guarded observers as one: started calls go to each in order, ended calls in
    reverse order (so context tokens they set nest)."""

    __slots__ = ("observers",)

    def __init__(self, observers: tuple[Guarded, ...]) -> None:
        self.observers = observers

    def run_started(self, run_id: str, workflow: str, epoch: int) -> object:
        return [o.run_started(run_id, workflow, epoch) for o in self.observers]

    def run_ended(self, state: object, outcome: RunOutcome, error: BaseException | None) -> None:
        assert isinstance(state, list)
        for observer, own in zip(reversed(self.observers), reversed(state), strict=True):
            observer.run_ended(own, outcome, error)

    def step_started(
        self, run_id: str, workflow: str, step: str, name: str, attempt: int
    ) -> object:
        return [o.step_started(run_id, workflow, step, name, attempt) for o in self.observers]

    def step_ended(
        self, state: object, outcome: StepOutcome, duration: float, error: BaseException | None
    ) -> None:
        assert isinstance(state, list)
        for observer, own in zip(reversed(self.observers), reversed(state), strict=True):
            observer.step_ended(own, outcome, duration, error)

    def trace_context(self) -> Mapping[str, str] | None:
        for observer in self.observers:
            found = observer.trace_context()
            if found:
                return found
        return None


def combine(current: Observer | None, added: Observer) -> Guarded | Observers:
    """`current` (what engine.observer holds) with `added` after it, guarded."""
    if current is None:
        return Guarded(added)
    if isinstance(current, Observers):
        before = current.observers
    else:
        before = (current if isinstance(current, Guarded) else Guarded(current),)
    return Observers((*before, Guarded(added)))


def installed(current: Observer | None) -> list[Observer]:
    """The observers that `current` (what engine.observer holds) tells, in order."""
    if isinstance(current, Guarded):
        return [current.observer]
    if isinstance(current, Observers):
        return [o.observer for o in current.observers]
    return [] if current is None else [current]

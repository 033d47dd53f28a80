"""OpenTelemetry spans of run executions (`tether.run`) and step attempts (`tether.step`).

A run span is one per execution (a run that suspends and resumes has one per claim), a child
of the span that was current where the run was started (its W3C trace context is stored with
the run: `app.start` in a traced request, the traceparent header of POST /api/runs, a parent
run's span for a child run), else the root of a trace of its own. It is the current span while
the workflow runs, so the step spans started in its task
(and in tasks it starts, which copy the context) are its children, and a step span is current
while the step's body runs (sync bodies too: their thread gets a copy of the context), so spans
your own code or instrumented libraries make inside a step nest under it.

Attributes are identifiers only: tether.run_id, tether.workflow, tether.step (the checkpoint
name), tether.attempt (a step's attempt; a run's epoch, the how-manyth claim), tether.outcome,
and tether.error_type (the exception's class name). Never arguments, results or messages:
`record_exception` is not used, since it stores the message and the traceback.

opentelemetry-api is imported when a Spans is made, never by `import tether`. Off by default:
with no SDK configured every span is a no-op that still costs a few microseconds per step
attempt; turn it on where an SDK exports spans (`tether.App(telemetry=True)`, TETHER_OTEL=1).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, cast

from tether.core.engine import Engine
from tether.core.observe import Observer, RunOutcome, StepOutcome, run_trace
from tether.errors import ConfigurationError

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.trace import Span, TracerProvider

    State = tuple[Span, Token[Context]]

log = logging.getLogger("tether.telemetry")

_FAILED_RUN = frozenset({RunOutcome.FAILED, RunOutcome.DEAD, RunOutcome.ERRORED, RunOutcome.HELD})
_FAILED_STEP = frozenset({StepOutcome.RETRYING, StepOutcome.FAILED})
_MISSING = (
    "OpenTelemetry spans need opentelemetry-api: pip install 'tether[otel]' (and an SDK with "
    "an exporter, opentelemetry-sdk, to send them somewhere)"
)


class HasEngine(Protocol):
    engine: Engine


class Spans(Observer):
    """Makes the spans described in the module docstring with the tracer of `tracer_provider`
    (default: the global one, looked up at each span, so a provider set later is used)."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        try:
            from opentelemetry import context, trace
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            raise ConfigurationError(_MISSING) from None
        # W3C Trace Context always, whatever propagator the process set: it is what is stored.
        self._w3c = TraceContextTextMapPropagator()
        self._span = trace.get_current_span
        self._attach = context.attach
        self._detach = context.detach
        self._current = trace.set_span_in_context
        self._root = context.Context()  # a run span starts a trace of its own
        self._error = trace.Status(trace.StatusCode.ERROR)
        self._tracer = trace.get_tracer("tether", tracer_provider=tracer_provider)

    def run_started(self, run_id: str, workflow: str, epoch: int) -> object:
        carrier = run_trace.get()
        span = self._tracer.start_span(
            "tether.run",
            context=self._w3c.extract(carrier, self._root) if carrier else self._root,
            attributes={
                "tether.run_id": run_id,
                "tether.workflow": workflow,
                "tether.attempt": epoch,
            },
        )
        return span, self._attach(self._current(span))

    def run_ended(self, state: object, outcome: RunOutcome, error: BaseException | None) -> None:
        span, token = cast("State", state)
        self._detach(token)
        self._end(span, outcome.value, error, outcome in _FAILED_RUN)

    def step_started(
        self, run_id: str, workflow: str, step: str, name: str, attempt: int
    ) -> object:
        span = self._tracer.start_span(
            "tether.step",
            attributes={
                "tether.run_id": run_id,
                "tether.workflow": workflow,
                "tether.step": name,
                "tether.attempt": attempt,
            },
        )
        return span, self._attach(self._current(span))

    def step_ended(
        self, state: object, outcome: StepOutcome, duration: float, error: BaseException | None
    ) -> None:
        span, token = cast("State", state)
        self._detach(token)
        self._end(span, outcome.value, error, outcome in _FAILED_STEP)

    def trace_context(self) -> Mapping[str, str] | None:
        if not self._span().get_span_context().is_valid:
            return None
        carrier: dict[str, str] = {}
        self._w3c.inject(carrier)
        return carrier

    def _end(self, span: Span, outcome: str, error: BaseException | None, failed: bool) -> None:
        span.set_attribute("tether.outcome", outcome)
        if error is not None:
            span.set_attribute("tether.error_type", type(error).__name__)
        if failed:
            span.set_status(self._error)  # no description: it would be the error's message
        span.end()


def instrument(app: HasEngine, *, tracer_provider: TracerProvider | None = None) -> Spans:
    """Turn spans on for `app` (a tether.App) from now on; returns the observer."""
    spans = Spans(tracer_provider)
    app.engine.observe(spans)
    return spans


def enable(engine: Engine, *, required: bool) -> Spans | None:
    """Spans for a new App: `required` (telemetry=True) raises ConfigurationError without
    opentelemetry-api; asked by TETHER_OTEL=1, a warning is logged and spans stay off."""
    try:
        spans = Spans()
    except ConfigurationError:
        if required:
            raise
        log.warning("TETHER_OTEL is set but spans stay off: %s", _MISSING)
        return None
    engine.observe(spans)
    return spans

"""OpenTelemetry metrics of an App, for whatever MeterProvider the process configured (an OTLP
exporter, the SDK's Prometheus reader): the counts of tether.telemetry.Metrics as observable
counters, step attempt durations as a histogram, and the database's gauges (runs by status,
runs due by queue, the outbox's backlog, pending approvals).

opentelemetry-api is imported when a Meters is made, never by `import tether`. The gauges are
read when the SDK collects, on a short-lived thread with another handle on the database, never
on the event loop, and at most once per collection. Attributes are identifiers only.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, cast

from tether.core.engine import Engine
from tether.core.observe import Observer, StepOutcome
from tether.errors import ConfigurationError
from tether.redact import redact_text
from tether.store.port import StoreStats
from tether.telemetry.metrics import DURATION_BUCKETS, Metrics, metrics_of
from tether.telemetry.spans import HasEngine

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

log = logging.getLogger("tether.telemetry")

READ_TIMEOUT = 5.0  # seconds a collection waits for the database's counts
FRESH = 1.0  # seconds a read serves the gauges of one collection (their callbacks come in turn)
_MISSING = (
    "OpenTelemetry metrics need opentelemetry-api: pip install 'tether[otel]' (and an SDK with "
    "a reader, opentelemetry-sdk, to send them somewhere)"
)

Points = Mapping[tuple[str, ...], float]  # attribute values, in the order of the names: value
Instruments = dict[str, tuple[str, tuple[str, ...], Points]]  # name: (description, names, points)


def _counters(m: Metrics) -> Instruments:
    """The counters read from `m`."""
    return {
        "tether.runs.started": ("Runs whose first execution began in this process.",
                                ("tether.workflow",), {(w,): n for w, n in m.runs_started.items()}),
        "tether.runs.finished": ("Runs this process ended, by workflow and status.",
                                 ("tether.workflow", "tether.status"),
                                 {(w, o.value): n for (w, o), n in m.runs_finished.items()}),
        "tether.run.executions": ("Executions of runs in this process, by how they stopped.",
                                  ("tether.workflow", "tether.outcome"),
                                  {(w, o.value): n for (w, o), n in m.run_executions.items()}),
        "tether.lease.losses": ("Executions in this process stopped because their lease was "
                                "lost.", ("tether.workflow",),
                                {(w,): n for w, n in m.lease_losses.items()}),
        "tether.step.attempts": ("Step attempts in this process, by step and outcome.",
                                 ("tether.step", "tether.outcome"),
                                 {(s, o.value): n for (s, o), n in m.step_attempts.items()}),
    }  # fmt: skip


def _gauges(s: StoreStats, now: float) -> Instruments:
    """The gauges read from the database's counts at `now`."""
    oldest = s.oldest_pending_approval_at
    return {
        "tether.runs": ("Runs in the database by status.", ("tether.status",),
                        {(k.value,): n for k, n in s.runs.items()}),
        "tether.queue.depth": ("Runs a worker would claim now, by queue ('' outside queues).",
                               ("tether.queue",), {(q,): n for q, n in s.due.items()}),
        "tether.outbox.messages": ("Outbox messages not delivered, by status.",
                                   ("tether.status",), {(k,): n for k, n in s.outbox.items()}),
        "tether.outbox.in_doubt": ("Outbox messages sent again after a send of unknown outcome.",
                                   (), {(): s.outbox_in_doubt}),
        "tether.approvals.pending": ("Approvals waiting for a decision.", (),
                                     {(): s.pending_approvals}),
        "tether.approval.oldest_pending_age": (
            "Seconds since the oldest pending approval was asked (0 when none is pending).", (),
            {(): 0.0 if oldest is None else max(0.0, now - oldest)}),
    }  # fmt: skip


class Meters(Observer):
    """Registers the instruments of the module docstring on the meter of `meter_provider`
    (default: the global one) and records step durations as they end."""

    def __init__(self, engine: Engine, meter_provider: MeterProvider | None = None) -> None:
        try:
            from opentelemetry import metrics
        except ImportError:
            raise ConfigurationError(_MISSING) from None
        self._observation = metrics.Observation
        self._engine = engine
        self._counts = metrics_of(engine)
        self._stats = StatsReader(engine)
        meter = metrics.get_meter("tether", meter_provider=meter_provider)
        self._durations = meter.create_histogram(
            "tether.step.duration", unit="s",
            description="Durations of step attempts that completed, failed or will retry.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )  # fmt: skip
        for name, (doc, _, _) in _counters(Metrics()).items():
            read = self._reading(name, self._counted)
            meter.create_observable_counter(name, [read], unit="1", description=doc)
        for name, (doc, _, _) in _gauges(_EMPTY, 0.0).items():
            read = self._reading(name, self._gauged)
            meter.create_observable_gauge(name, [read], unit="s" if "age" in name else "1",
                                          description=doc)  # fmt: skip

    def _counted(self) -> Instruments:
        return _counters(self._counts.snapshot())

    def _gauged(self) -> Instruments | None:
        stats = self._stats.get()
        return None if stats is None else _gauges(stats, self._engine.clock.now())

    def _reading(
        self, name: str, read: Callable[[], Instruments | None]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            found = read()
            if found is None:
                return []
            _, names, points = found[name]
            return [self._observation(value, dict(zip(names, key, strict=True)))
                    for key, value in points.items()]  # fmt: skip

        return callback

    def step_started(
        self, run_id: str, workflow: str, step: str, name: str, attempt: int
    ) -> object:
        return step

    def step_ended(
        self, state: object, outcome: StepOutcome, duration: float, error: BaseException | None
    ) -> None:
        if outcome is not StepOutcome.INTERRUPTED:
            attributes = {"tether.step": cast(str, state), "tether.outcome": outcome.value}
            self._durations.record(max(duration, 0.0), attributes)


class StatsReader:
    """The database's counts for the gauges: read on a thread of its own with another handle
    on the database (what a collection's thread must not do is touch the event loop's), shared
    by the gauge callbacks of one collection, None when they cannot be read (a MemoryStore has
    no other handle; the database did not answer within READ_TIMEOUT: logged)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._stats: StoreStats | None = None

    def get(self) -> StoreStats | None:
        with self._lock:
            if time.monotonic() - self._read_at >= FRESH:
                self._stats = self._read()
                self._read_at = time.monotonic()
            return self._stats

    def _read(self) -> StoreStats | None:
        other = self._engine.store.another()
        if other is None:
            return None
        answers: queue.Queue[StoreStats | BaseException] = queue.Queue()

        async def read() -> StoreStats:
            await other.open()
            try:
                return await other.stats(self._engine.clock.now())
            finally:
                await other.close()

        def work() -> None:
            try:
                answers.put(asyncio.run(read()))
            except BaseException as exc:  # reported by the collecting thread
                answers.put(exc)

        # A daemon thread: a database that never answers must not hold the process at exit.
        threading.Thread(target=work, name="tether-meters", daemon=True).start()
        try:
            answer = answers.get(timeout=READ_TIMEOUT)
        except queue.Empty:
            log.warning("metrics: the database did not answer within %g s", READ_TIMEOUT)
            return None
        if isinstance(answer, BaseException):
            log.warning("metrics: reading the database's counts failed: %s",
                        redact_text(f"{type(answer).__name__}: {answer}"))  # fmt: skip
            return None
        return answer


_EMPTY = StoreStats(runs={}, pending_approvals=0, oldest_pending_approval_at=None, due={},
                    outbox={}, outbox_in_doubt=0)  # fmt: skip


def instrument_metrics(app: HasEngine, *, meter_provider: MeterProvider | None = None) -> Meters:
    """Turn OpenTelemetry metrics on for `app` (a tether.App) from now on; returns the
    observer."""
    meters = Meters(app.engine, meter_provider)
    app.engine.observe(meters)
    return meters


def enable(engine: Engine, *, required: bool) -> Meters | None:
    """Metrics for a new App, beside its spans: `required` (telemetry=True) raises
    ConfigurationError without opentelemetry-api; asked by TETHER_OTEL=1, a warning is logged
    and metrics stay off."""
    try:
        meters = Meters(engine)
    except ConfigurationError:
        if required:
            raise
        log.warning("TETHER_OTEL is set but metrics stay off: %s", _MISSING)
        return None
    engine.observe(meters)
    return meters

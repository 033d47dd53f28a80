"""Observability of an App: OpenTelemetry spans and metrics, metrics for /metrics, and log
records that say which run and step they come from (docs/observability.md).

- `install_logging()`: the one-liner that logs every record to stderr with `run=... step=...`;
  `format="json"` (TETHER_LOG_FORMAT=json) writes one JSON object a line (`JsonFormatter`);
  `RunContextFilter` adds `run_id`, `workflow` and `step` to records for handlers of your own.
- `Spans`: spans `tether.run` and `tether.step` (opentelemetry-api, the `otel` extra), on with
  `tether.App(telemetry=True)` or TETHER_OTEL=1; `instrument(app)` turns them on later. A run
  span is a child of the span that started the run (W3C trace context stored with the run).
- `Meters`: the same counts as OpenTelemetry instruments, with the database's gauges, on with
  spans; `instrument_metrics(app)` turns them on later.
- `Metrics`: in-process counters and a histogram of step durations, fed by the engine's
  observer; `tether serve` and `tether worker --metrics-port` publish it on /metrics.

Nothing here is imported by `import tether`, and nothing imports opentelemetry until spans are
turned on. Exported values are identifiers only, never arguments, results or error messages.
"""

from __future__ import annotations

from tether.telemetry.logs import (
    LOG_FORMAT,
    JsonFormatter,
    LogFormat,
    RunContextFilter,
    install_logging,
    log_format_from_env,
)
from tether.telemetry.meters import Meters, instrument_metrics
from tether.telemetry.metrics import Histogram, Metrics, metrics_of
from tether.telemetry.spans import Spans, instrument

__all__ = [
    "LOG_FORMAT",
    "Histogram",
    "JsonFormatter",
    "LogFormat",
    "Meters",
    "Metrics",
    "RunContextFilter",
    "Spans",
    "install_logging",
    "instrument",
    "instrument_metrics",
    "log_format_from_env",
    "metrics_of",
]

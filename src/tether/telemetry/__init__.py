"""Observability of an App: OpenTelemetry spans, metrics for /metrics, and log records that
say which run and step they come from (docs/observability.md).

- `install_logging()`: the one-liner that logs every record to stderr with `run=... step=...`;
  `RunContextFilter` adds `run_id`, `workflow` and `step` to records for handlers of your own.
- `Spans`: spans `tether.run` and `tether.step` (opentelemetry-api, the `otel` extra), on with
  `tether.App(telemetry=True)` or TETHER_OTEL=1; `instrument(app)` turns them on later.
- `Metrics`: in-process counters and a histogram of step durations, fed by the engine's
  observer; `tether serve` installs one and publishes it on /metrics.

Nothing here is imported by `import tether`, and nothing imports opentelemetry until spans are
turned on. Exported values are identifiers only, never arguments, results or error messages.
"""

from __future__ import annotations

from tether.telemetry.logs import LOG_FORMAT, RunContextFilter, install_logging
from tether.telemetry.metrics import Histogram, Metrics, metrics_of
from tether.telemetry.spans import Spans, instrument

__all__ = [
    "LOG_FORMAT",
    "Histogram",
    "Metrics",
    "RunContextFilter",
    "Spans",
    "install_logging",
    "instrument",
    "metrics_of",
]

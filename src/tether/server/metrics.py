"""/metrics: the App in the Prometheus text exposition format (version 0.0.4), for a bearer
token of group `admin` or `metrics` (401 without a valid token, 403 for other users).

Two kinds of figures. Gauges read from the database at scrape time, one consistent read
(Store.stats), true for every process sharing the database: runs by status, runs due by queue,
the outbox's backlog, pending approvals, the age of the oldest pending approval. Counters and a
histogram of what this process executed (tether.telemetry.Metrics, installed when the server
is made): the runs of the worker inside `tether serve`, or of `tether worker --metrics-port`,
which serves this route alone (`metrics_server`). The route is left out of the OpenAPI
document. prometheus_client writes the text (escaping included).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import TypeVar

from fastapi import APIRouter, FastAPI, HTTPException, Response
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tether.app import App
from tether.server.api import CurrentUser
from tether.server.auth import Auth
from tether.server.health import Probes, embedded_server
from tether.server.http import Hygiene
from tether.store.port import StoreStats
from tether.telemetry.metrics import Metrics, metrics_of

Outcome = TypeVar("Outcome", bound=StrEnum)

METRICS_GROUPS = frozenset({"admin", "metrics"})
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Scrape(Collector):
    """One scrape's figures: the store's counts read just before, and a snapshot of this
    process's metrics."""

    def __init__(self, stats: StoreStats, now: float, metrics: Metrics) -> None:
        self.stats, self.now, self.metrics = stats, now, metrics

    def collect(self) -> Iterator[Metric]:
        stats, metrics = self.stats, self.metrics
        runs = GaugeMetricFamily("tether_runs", "Runs in the database by status.",
                                 labels=["status"])  # fmt: skip
        for status, count in stats.runs.items():
            runs.add_metric([status.value], count)
        yield runs
        yield GaugeMetricFamily("tether_approvals_pending", "Approvals waiting for a decision.",
                                value=stats.pending_approvals)  # fmt: skip
        oldest = stats.oldest_pending_approval_at
        yield GaugeMetricFamily(
            "tether_approval_oldest_pending_age_seconds",
            "Seconds since the oldest pending approval was asked (0 when none is pending).",
            value=0.0 if oldest is None else max(0.0, self.now - oldest),
        )
        depth = GaugeMetricFamily(
            "tether_queue_depth",
            "Runs a worker would claim now (due, or their lease expired), by queue "
            '(queue="" outside queues).',
            labels=["queue"],
        )
        for queue, count in stats.due.items():
            depth.add_metric([queue], count)
        yield depth
        outbox = GaugeMetricFamily("tether_outbox_messages", "Outbox messages not delivered, "
                                   "by status (pending, sending, failed).",
                                   labels=["status"])  # fmt: skip
        for state, count in stats.outbox.items():
            outbox.add_metric([state], count)
        yield outbox
        yield GaugeMetricFamily("tether_outbox_in_doubt", "Outbox messages being sent again "
                                "after a send whose outcome is unknown.",
                                value=stats.outbox_in_doubt)  # fmt: skip
        yield _by_workflow("tether_runs_started", "Runs whose first execution began in this "
                           "process, by workflow.", metrics.runs_started)  # fmt: skip
        yield _by_workflow("tether_lease_losses", "Executions in this process stopped because "
                           "their lease was lost (the run was taken over or ended elsewhere).",
                           metrics.lease_losses)  # fmt: skip
        yield _counter("tether_runs_finished", "Runs this process ended, by workflow and status.",
                       ["workflow", "status"], metrics.runs_finished)  # fmt: skip
        yield _counter("tether_run_executions", "Executions of runs in this process, by workflow "
                       "and outcome (succeeded, failed, cancelled, dead, suspended, errored, "
                       "abandoned).",
                       ["workflow", "outcome"], metrics.run_executions)  # fmt: skip
        yield _counter("tether_step_attempts", "Step attempts in this process, by step and "
                       "outcome (completed, retrying, failed, interrupted).",
                       ["step", "outcome"], metrics.step_attempts)  # fmt: skip
        durations = HistogramMetricFamily(
            "tether_step_duration_seconds",
            "Durations of step attempts in this process that completed, failed or will retry.",
            labels=["step"],
        )
        for step, histogram in sorted(metrics.step_durations.items()):
            buckets = [(_le(bound), count) for bound, count in histogram.cumulative()]
            durations.add_metric([step], buckets, sum_value=histogram.sum)
        yield durations


def _counter(
    name: str, doc: str, labels: list[str], values: Mapping[tuple[str, Outcome], int]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for (first, outcome), count in sorted(values.items()):
        family.add_metric([first, outcome.value], count)
    return family


def _by_workflow(name: str, doc: str, values: Mapping[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["workflow"])
    for workflow, count in sorted(values.items()):
        family.add_metric([workflow], count)
    return family


def _le(bound: float) -> str:
    """A bucket bound as Prometheus writes it: `0.005`, `1.0`, `+Inf`."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


def build_metrics(app: App) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    metrics = metrics_of(app.engine)  # counting starts now

    @router.get("/metrics")
    async def scrape(user: CurrentUser) -> Response:
        if not user.groups & METRICS_GROUPS:
            raise HTTPException(403, "only users of group admin or metrics may read /metrics")
        stats = await app.engine.store.stats(app.engine.clock.now())
        body = generate_latest(Scrape(stats, app.engine.clock.now(), metrics.snapshot()))
        return Response(body, media_type=CONTENT_TYPE)

    return router


def metrics_server(
    app: App, host: str, port: int, *, probes: bool = False
) -> contextlib.AbstractAsyncContextManager[None]:
    """Serve GET /metrics of `app` on host:port until the block ends (`tether worker
    --metrics-port`), under the same token rule as on `tether serve`; with `probes`, /healthz
    and /readyz too (the health port is the same). ConfigurationError when the port cannot be
    bound."""
    server = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    server.state.auth = Auth.make(app, None, False)  # bearer tokens only: no cookie is signed
    server.include_router(build_metrics(app))
    server.add_middleware(Hygiene)
    asgi = Probes(server, app) if probes else server
    return embedded_server(asgi, host, port, "the metrics", "--metrics")

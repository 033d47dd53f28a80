"""Observable workers: a run's spans are children of the span that started it (W3C trace
context stored with the run: `app.start` inside a span, the traceparent header of POST
/api/runs, a parent run for its child), lost leases counted, OpenTelemetry metrics with the
database's gauges, and /metrics on `tether worker --metrics-port` (a real process, with JSON
logs), on real SQLite files and PostgreSQL.

Spans and metrics go to providers of each test's own (no global provider is set here).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from tests.postgres_server import with_schema

import tether
from tether.cli import cli
from tether.core.observe import RunOutcome, valid_trace
from tether.server import create_server
from tether.server.metrics import metrics_server
from tether.telemetry import instrument, instrument_metrics, metrics_of
from tether.telemetry.metrics import DURATION_BUCKETS
from tether.users import add_user

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # the W3C example
TRACE_ID, SPAN_ID = int("0af7651916cd43dd8448eb211c80319c", 16), int("b7ad6b7169203331", 16)


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/observed.db"
    postgres: str = request.getfixturevalue("postgres_url")
    return with_schema(postgres, f"t_{uuid.uuid4().hex[:12]}")


class Traced:
    """An App on `url` whose spans go to an in-memory exporter of its own."""

    def __init__(self, url: str) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.app = tether.App(url)
        instrument(self.app, tracer_provider=self.provider)

    def spans(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def run_spans(self, run_id: str) -> list[ReadableSpan]:
        return [s for s in self.spans("tether.run")
                if s.attributes and s.attributes["tether.run_id"] == run_id]  # fmt: skip


def build(url: str) -> Traced:
    traced = Traced(url)
    app = traced.app

    @app.step()
    async def fetch(n: int) -> int:
        return n + 1

    @app.workflow()
    async def leaf(n: int) -> int:
        return await fetch(n)

    @app.workflow()
    async def napper(n: int) -> int:
        first = await fetch(n)
        await tether.sleep(
            timedelta(seconds=0.3)
        )  # over inline_wait_max: the run suspends, a second execution
        return await fetch(first)

    @app.workflow()
    async def parent(n: int) -> int:
        child = await tether.start_child(leaf, n)
        return await child

    app.engine.settings = dataclasses.replace(app.engine.settings, inline_wait_max=0.05,
                                              poll_interval=0.05)  # fmt: skip
    return traced


# -- trace context ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ({"traceparent": PARENT}, {"traceparent": PARENT}),
        ({"traceparent": f"  {PARENT} ", "tracestate": "congo=t61rcWkgMzE"},
         {"traceparent": PARENT, "tracestate": "congo=t61rcWkgMzE"}),
        # A tracestate that is not printable ASCII is dropped; the traceparent is kept.
        ({"traceparent": PARENT, "tracestate": "a=1\r\nX-Injected: yes"}, {"traceparent": PARENT}),
        ({"traceparent": PARENT, "tracestate": "x" * 513}, {"traceparent": PARENT}),
        ({"traceparent": "00-" + "0" * 32 + "-b7ad6b7169203331-01"}, {}),  # all-zero trace id
        ({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01"}, {}),
        ({"traceparent": "ff" + PARENT[2:]}, {}),  # version ff is invalid
        ({"traceparent": PARENT.upper()}, {}),  # hex is lowercase
        ({"traceparent": PARENT + "-extra"}, {}),  # version 00 has exactly four fields
        ({"traceparent": "01" + PARENT[2:] + "-future"}, {"traceparent": "01" + PARENT[2:]
                                                          + "-future"}),
        ({"traceparent": "<script>"}, {}),
        ({"tracestate": "a=1"}, {}),
        ({}, {}),
    ],
)  # fmt: skip
def test_only_a_valid_w3c_trace_context_is_kept(
    given: dict[str, str], kept: dict[str, str]
) -> None:
    assert valid_trace(given) == kept


async def test_a_run_started_in_a_span_is_its_child_and_a_child_run_is_its_parents_child(
    url: str,
) -> None:
    traced = build(url)
    app = traced.app
    tracer = traced.provider.get_tracer("caller")
    async with app:
        with tracer.start_as_current_span("POST /orders") as request:
            handle = await app.start("parent", 1, id="p1")
        assert await handle.result(timeout=20) == 2
        stored = await app.engine.store.get_run("p1")
    caller = request.get_span_context()
    (run,) = traced.run_spans("p1")
    assert run.parent is not None
    assert (run.context.trace_id, run.parent.span_id) == (caller.trace_id, caller.span_id)
    # The child run was started inside the parent's execution: its span is the parent run's.
    (child,) = [s for s in traced.spans("tether.run") if s is not run]
    assert child.parent is not None
    assert (child.context.trace_id, child.parent.span_id) == (caller.trace_id,
                                                               run.context.span_id)  # fmt: skip
    assert stored is not None
    assert stored.trace_context is not None
    assert json.loads(stored.trace_context)["traceparent"].split("-")[2] == (
        f"{caller.span_id:016x}"
    )


async def test_without_a_span_a_run_is_the_root_of_a_trace_of_its_own(url: str) -> None:
    traced = build(url)
    async with traced.app:
        assert await (await traced.app.start("leaf", 1, id="alone")).result(timeout=20) == 2
        stored = await traced.app.engine.store.get_run("alone")
    (run,) = traced.run_spans("alone")
    assert run.parent is None
    assert stored is not None
    assert stored.trace_context is None


async def test_post_api_runs_with_a_traceparent_makes_every_execution_of_the_run_its_child(
    url: str,
) -> None:
    traced = build(url)
    app = traced.app
    async with app:
        _, token = await add_user(app.engine, "svc", frozenset({"starter"}))
        transport = httpx.ASGITransport(app=create_server(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            headers = {"Authorization": f"Bearer {token}", "traceparent": PARENT,
                       "tracestate": "congo=t61rcWkgMzE"}  # fmt: skip
            body = {"workflow": "napper", "args": [1], "id": "n1"}
            made = await http.post("/api/runs", json=body, headers=headers)
            assert made.status_code == 201, made.text
            # A malformed header is ignored: that run starts a trace of its own.
            bad = {"Authorization": f"Bearer {token}", "traceparent": "00-zz-zz-01"}
            other = await http.post("/api/runs", json={"workflow": "leaf", "args": [5],
                                                       "id": "l1"}, headers=bad)  # fmt: skip
            assert other.status_code == 201, other.text
        assert await (await app.get("n1")).result(timeout=20) == 3
        assert await (await app.get("l1")).result(timeout=20) == 6
    executions = traced.run_spans("n1")
    assert len(executions) == 2  # it slept: suspended, then resumed in a second execution
    for span in executions:
        assert span.parent is not None
        assert (span.context.trace_id, span.parent.span_id) == (TRACE_ID, SPAN_ID)
        assert span.parent.is_remote
        assert span.context.trace_state.to_header() == "congo=t61rcWkgMzE"
    (alone,) = traced.run_spans("l1")
    assert alone.parent is None
    assert alone.context.trace_id != TRACE_ID


def test_the_openapi_document_names_the_trace_headers_of_a_start(tmp_path: Path) -> None:
    server = create_server(tether.App(f"sqlite:///{tmp_path}/doc.db"))
    params = server.openapi()["paths"]["/api/runs"]["post"]["parameters"]
    assert {(p["name"], p["in"]) for p in params} >= {("traceparent", "header"),
                                                      ("tracestate", "header")}  # fmt: skip


# -- lease losses -----------------------------------------------------------------------------


async def test_a_lease_found_lost_by_the_heartbeat_is_counted_and_named_in_the_run_span(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/lost.db"
    traced = Traced(url)
    first = traced.app
    first.engine.settings = dataclasses.replace(first.engine.settings, lease_duration=0.9)
    counts = metrics_of(first.engine)
    entered = asyncio.Event()

    @first.step()
    async def hang() -> None:
        entered.set()
        await asyncio.sleep(3600)  # until the worker stops it

    @first.workflow(name="flow")
    async def flow() -> None:
        await hang()

    async with first:
        await first.start("flow", id="taken")
        await asyncio.wait_for(entered.wait(), 10)
        store = first.engine.store
        now = first.engine.clock.now()
        # Another worker claims it as after an expired lease (the epoch goes up), and keeps it.
        (taken,) = await store.claim_runs("thief", ["flow"], now + 3600, now + 7200, 1)
        assert taken.epoch == 2
        worker = first.engine.worker
        assert worker is not None
        async with asyncio.timeout(10):  # the next heartbeat tells this worker it lost it
            while "taken" in worker.runners:
                await asyncio.sleep(0.02)
    assert counts.lease_losses == {"flow": 1}
    assert counts.run_executions == {("flow", RunOutcome.ABANDONED): 1}
    (span,) = traced.run_spans("taken")
    assert span.attributes is not None
    assert (span.attributes["tether.outcome"], span.attributes["tether.error_type"]) == (
        "abandoned", "LeaseLost")  # fmt: skip


async def test_a_worker_that_stops_mid_step_loses_no_lease(tmp_path: Path) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/stop.db")
    counts = metrics_of(app.engine)
    entered = asyncio.Event()

    @app.step()
    async def hang() -> None:
        entered.set()
        await asyncio.sleep(3600)

    @app.workflow()
    async def flow() -> None:
        await hang()

    async with app:
        await app.start(flow, id="s1")
        await asyncio.wait_for(entered.wait(), 10)
    assert counts.run_executions == {("flow", RunOutcome.ABANDONED): 1}
    assert counts.lease_losses == {}
    assert counts.runs_started == {"flow": 1}


# -- OpenTelemetry metrics --------------------------------------------------------------------


def points(data: MetricsData | None, name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
    """{sorted attributes: data point} of the metric `name` (empty when it has none)."""
    assert data is not None
    found: dict[tuple[tuple[str, Any], ...], Any] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        found[tuple(sorted((point.attributes or {}).items()))] = point
    return found


async def test_opentelemetry_metrics_count_runs_and_steps_and_read_the_databases_gauges(
    url: str,
) -> None:
    traced = build(url)
    app = traced.app
    reader = InMemoryMetricReader()
    instrument_metrics(app, meter_provider=MeterProvider(metric_readers=[reader]))
    async with app:
        assert await (await app.start("leaf", 1, id="m1")).result(timeout=20) == 2
        assert await (await app.start("leaf", 2, id="m2")).result(timeout=20) == 3
        await app.start("absent", id="w1")  # no worker here has it: it stays due, pending
        data = await asyncio.to_thread(reader.get_metrics_data)
    started = points(data, "tether.runs.started")
    assert started[(("tether.workflow", "leaf"),)].value == 2
    finished = points(data, "tether.runs.finished")
    assert finished[(("tether.status", "succeeded"), ("tether.workflow", "leaf"))].value == 2
    attempts = points(data, "tether.step.attempts")
    assert attempts[(("tether.outcome", "completed"), ("tether.step", "fetch"))].value == 2
    (duration,) = points(data, "tether.step.duration").values()
    assert duration.count == 2
    assert list(duration.explicit_bounds) == list(DURATION_BUCKETS)
    assert points(data, "tether.queue.depth")[(("tether.queue", ""),)].value == 1
    runs = points(data, "tether.runs")
    assert runs[(("tether.status", "pending"),)].value == 1
    assert runs[(("tether.status", "succeeded"),)].value == 2
    assert points(data, "tether.outbox.messages")[(("tether.status", "pending"),)].value == 0
    assert points(data, "tether.approvals.pending")[()].value == 0


# -- /metrics of a worker ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples}  # fmt: skip


@pytest.fixture
async def open_app(tmp_path: Path) -> AsyncIterator[tether.App]:
    app = tether.App(f"sqlite:///{tmp_path}/m.db")
    await app.open()
    yield app
    await app.close()


async def test_the_metrics_port_asks_for_a_token_and_serves_no_probe_of_its_own(
    open_app: tether.App,
) -> None:
    _, prom = await add_user(open_app.engine, "prom", frozenset({"metrics"}))
    _, reviewer = await add_user(open_app.engine, "rev", frozenset())
    port = free_port()
    async with (
        metrics_server(open_app, "127.0.0.1", port),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):
        anonymous = await http.get("/metrics")
        refused = await http.get("/metrics", headers={"Authorization": f"Bearer {reviewer}"})
        served = await http.get("/metrics", headers={"Authorization": f"Bearer {prom}"})
        probe = await http.get("/healthz")
        other = await http.get("/api/runs", headers={"Authorization": f"Bearer {prom}"})
    assert anonymous.status_code == 401
    assert refused.status_code == 403
    assert served.status_code == 200
    assert "tether_queue_depth" in served.text
    assert "tether_outbox_in_doubt 0.0" in served.text.splitlines()
    assert probe.status_code == 404  # the probes live on the health port here
    assert other.status_code == 404
    with socket.socket() as s:  # the port was given back
        s.bind(("127.0.0.1", port))


WORKER_MODULE = """
import logging

import tether

app = tether.App({url!r})
log = logging.getLogger("shop")

@app.step()
async def charge(order: str) -> str:
    log.warning("charging %s\\nforged line", order)
    return "charged " + order

@app.workflow()
async def checkout(order: str) -> str:
    return await charge(order)
"""


async def prepare(url: str) -> str:
    app = tether.App(url)
    await app.open()
    _, token = await add_user(app.engine, "prom", frozenset({"metrics"}))
    await app.start("checkout", "o-1", id="c1")
    await app.start("checkout", "o-2", id="c2")
    await app.start("elsewhere", id="e1")  # a workflow no worker has: due, in queue ""
    await app.close()
    return token


async def scrape_until(base: str, token: str) -> tuple[str, int]:
    """/metrics once both checkouts finished, and /healthz's status, on the one port."""
    async with httpx.AsyncClient(base_url=base, timeout=2) as http:
        deadline = time.monotonic() + 30
        while True:
            try:
                text = (
                    await http.get("/metrics", headers={"Authorization": f"Bearer {token}"})
                ).text
                found = samples(text)
                done = (("status", "succeeded"), ("workflow", "checkout"))
                if found.get(("tether_runs_finished_total", done)) == 2.0:
                    return text, (await http.get("/healthz")).status_code
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the worker never finished both runs"
            await asyncio.sleep(0.1)


def test_tether_worker_serves_metrics_and_probes_on_one_port_and_logs_json(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/w.db"
    (tmp_path / "metrics_worker_mod.py").write_text(WORKER_MODULE.format(url=url))
    token = asyncio.run(prepare(url))
    port = free_port()
    command = [sys.executable, "-m", "tether", "worker", "metrics_worker_mod:app",
               "--metrics-port", str(port), "--health-port", str(port),
               "--log-format", "json"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        text, health = asyncio.run(scrape_until(f"http://127.0.0.1:{port}", token))
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert health == 200
    assert f"/metrics, /healthz and /readyz on http://127.0.0.1:{port}/" in out
    found = samples(text)
    assert found[("tether_runs_started_total", (("workflow", "checkout"),))] == 2.0
    assert found[("tether_step_attempts_total",
                  (("outcome", "completed"), ("step", "charge")))] == 2.0  # fmt: skip
    assert found[("tether_step_duration_seconds_count", (("step", "charge"),))] == 2.0
    assert found[("tether_queue_depth", (("queue", ""),))] == 1.0  # `elsewhere` waits
    assert found[("tether_outbox_messages", (("status", "pending"),))] == 0.0
    assert found[("tether_runs", (("status", "succeeded"),))] == 2.0
    assert ("tether_lease_losses_total", (("workflow", "checkout"),)) not in found
    records = [json.loads(line) for line in err.splitlines() if line.strip()]
    charged = [r for r in records if r["logger"] == "shop"]
    charged.sort(key=lambda r: str(r["run_id"]))
    assert [(r["run_id"], r["step"], r["message"]) for r in charged] == [
        ("c1", "charge", "charging o-1\nforged line"),
        ("c2", "charge", "charging o-2\nforged line"),
    ]
    assert all(r["level"] == "WARNING" and r["workflow"] == "checkout" for r in charged)


def test_a_log_format_that_is_neither_text_nor_json_is_refused_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner = CliRunner()
    monkeypatch.setenv("TETHER_LOG_FORMAT", "xml")
    answer = runner.invoke(cli, ["worker", "nowhere:app"])
    assert answer.exit_code == 2
    assert "TETHER_LOG_FORMAT" in answer.output
    assert "'xml'" in answer.output
    monkeypatch.delenv("TETHER_LOG_FORMAT")
    answer = runner.invoke(cli, ["serve", "nowhere:app", "--log-format", "yaml"])
    assert answer.exit_code == 2
    assert "'yaml' is not one of 'text', 'json'" in answer.output


def test_the_trace_of_a_script_reaches_tether_runs_start_through_traceparent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"

    async def stored(run_id: str) -> str | None:
        app = tether.App(url)
        await app.open()
        run = await app.engine.store.get_run(run_id)
        await app.close()
        return None if run is None else run.trace_context

    assert asyncio.run(stored("none")) is None  # the database exists now
    monkeypatch.setenv("TRACEPARENT", PARENT)
    answer = CliRunner().invoke(cli, ["-d", url, "runs", "start", "remote", "--id", "r1"])
    assert answer.exit_code == 0, answer.output
    assert asyncio.run(stored("r1")) == json.dumps({"traceparent": PARENT})
    assert trace.get_current_span().get_span_context().is_valid is False  # nothing leaked

"""Observability: OpenTelemetry spans per run execution and step attempt (ids as attributes,
never payloads; off by default), the engine's observer hook, the in-process metrics it feeds,
and log records that carry their run and step.

Spans go to an InMemorySpanExporter behind the global TracerProvider (set once for this
module, as an application would); apps run on a FakeClock with every wait suspending, so a
retried step makes a second execution of its run.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import tether
from tether.core.observe import Observer, RunOutcome, StepOutcome
from tether.errors import ConfigurationError
from tether.redact import REDACTED
from tether.telemetry import (
    LOG_FORMAT,
    Metrics,
    RunContextFilter,
    install_logging,
    instrument,
    metrics_of,
)
from tether.telemetry.logs import JsonFormatter, log_format_from_env
from tether.testing import fake_app, run_until_idle
from tether.text import hostile

SECRET = "sk-live-51HxSECRETvalue4242"  # what must never reach a span
EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def tracer_provider() -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    assert trace.get_tracer_provider() is provider, "another test set the global provider"
    return provider


@pytest.fixture(autouse=True)
def no_spans_yet(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> Iterator[None]:
    """A clean exporter, no TETHER_OTEL, and afterwards no complaint from OpenTelemetry (it
    logs "Failed to detach context" when a context token is reset out of order)."""
    monkeypatch.delenv("TETHER_OTEL", raising=False)
    EXPORTER.clear()
    yield
    EXPORTER.clear()
    complaints = [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")]
    assert complaints == []


def build(**options: object) -> tuple[tether.App, tether.Workflow[[str], str]]:
    """`deliver(secret)`: step `fetch` once, step `send` failing once (its error's message holds
    the secret) and succeeding on its second attempt, a second execution away."""
    app = fake_app(**options)  # type: ignore[arg-type]
    failures = [ConnectionError(f"upstream refused token {SECRET}")]

    @app.step()
    async def fetch(token: str) -> str:
        return f"page for {token}"

    @app.step(retry=tether.Retry(max_attempts=3, initial_delay=timedelta(seconds=30)))
    async def send(page: str) -> dict[str, str]:
        if failures:
            raise failures.pop()
        return {"sent": page}

    @app.workflow()
    async def deliver(token: str) -> str:
        page = await fetch(token)
        return (await send(page))["sent"]

    return app, deliver


def by_start(spans: tuple[ReadableSpan, ...]) -> list[ReadableSpan]:
    return sorted(spans, key=lambda s: s.start_time or 0)


def attrs(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def everything_recorded(span: ReadableSpan) -> str:
    """Every string a span carries: name, attributes, events, status, links, resource."""
    parts = [span.name, repr(dict(span.attributes or {})), str(span.status.description)]
    parts += [f"{e.name} {dict(e.attributes or {})}" for e in span.events]
    parts += [repr(dict(link.attributes or {})) for link in span.links]
    parts.append(repr(dict(span.resource.attributes)))
    return "\n".join(parts)


# serial: the module's fixture sets OpenTelemetry's global tracer provider, which can be set
# once per process and stays: FastAPI then makes a server span of each request, and a test
# file run after this one in the same process (pytest-xdist's order) sees it, as
# test_observable_workers.py's traceparent test did. Run alone, after the rest.
pytestmark = pytest.mark.serial


async def test_a_run_makes_one_run_span_per_execution_with_its_step_attempts_as_children() -> None:
    app, deliver = build(telemetry=True)
    async with app:
        handle = await app.start(deliver, SECRET, id="r1")
        await run_until_idle(app)
        assert await handle.result() == f"page for {SECRET}"

    spans = by_start(EXPORTER.get_finished_spans())
    assert [s.name for s in spans] == ["tether.run", "tether.step", "tether.step",
                                       "tether.run", "tether.step"]  # fmt: skip
    run1, fetch, send1, run2, send2 = spans
    assert attrs(run1) == {"tether.run_id": "r1", "tether.workflow": "deliver",
                           "tether.attempt": 1, "tether.outcome": "suspended"}  # fmt: skip
    assert attrs(run2) == {"tether.run_id": "r1", "tether.workflow": "deliver",
                           "tether.attempt": 2, "tether.outcome": "succeeded"}  # fmt: skip
    assert attrs(fetch) == {"tether.run_id": "r1", "tether.workflow": "deliver",
                            "tether.step": "fetch", "tether.attempt": 1,
                            "tether.outcome": "completed"}  # fmt: skip
    assert attrs(send1) == {"tether.run_id": "r1", "tether.workflow": "deliver",
                            "tether.step": "send", "tether.attempt": 1,
                            "tether.outcome": "retrying",
                            "tether.error_type": "ConnectionError"}  # fmt: skip
    assert attrs(send2) == {"tether.run_id": "r1", "tether.workflow": "deliver",
                            "tether.step": "send", "tether.attempt": 2,
                            "tether.outcome": "completed"}  # fmt: skip
    # Each run span starts a trace of its own; its step spans are its children.
    assert run1.parent is None
    assert run2.parent is None
    assert run1.context is not None
    assert run2.context is not None
    for step, run in ((fetch, run1), (send1, run1), (send2, run2)):
        assert step.parent is not None
        assert step.context is not None
        assert step.parent.span_id == run.context.span_id
        assert step.context.trace_id == run.context.trace_id
    assert run1.context.trace_id != run2.context.trace_id
    # A failed attempt is an error span, without the error's message anywhere.
    assert send1.status.status_code is StatusCode.ERROR
    assert send1.status.description is None
    assert send1.events == ()
    assert [s.status.status_code for s in (run1, fetch, run2, send2)] == [StatusCode.UNSET] * 4


async def test_no_span_holds_an_argument_a_result_or_an_error_message() -> None:
    app, deliver = build(telemetry=True)
    async with app:
        await app.start(deliver, SECRET, id=f"r-{len(SECRET)}")
        await run_until_idle(app)
    spans = EXPORTER.get_finished_spans()
    assert len(spans) == 5
    for span in spans:
        recorded = everything_recorded(span)
        assert SECRET not in recorded
        assert "page for" not in recorded
        assert "upstream refused" not in recorded


async def test_spans_are_off_by_default() -> None:
    app, deliver = build()
    assert app.engine.observer is None
    async with app:
        handle = await app.start(deliver, SECRET, id="quiet")
        await run_until_idle(app)
        assert await handle.status() == tether.RunStatus.SUCCEEDED
    assert EXPORTER.get_finished_spans() == ()


async def test_tether_otel_1_turns_spans_on_and_telemetry_false_wins_over_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TETHER_OTEL", "1")
    app, deliver = build()
    async with app:
        await app.start(deliver, "x", id="env")
        await run_until_idle(app)
    assert [s.name for s in by_start(EXPORTER.get_finished_spans())].count("tether.run") == 2
    EXPORTER.clear()
    off, deliver_off = build(telemetry=False)
    assert off.engine.observer is None
    async with off:
        await off.start(deliver_off, "x", id="env-off")
        await run_until_idle(off)
    assert EXPORTER.get_finished_spans() == ()


def test_telemetry_true_without_opentelemetry_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "opentelemetry", None)  # import fails
    with pytest.raises(ConfigurationError) as refused:
        tether.App("memory://", telemetry=True)
    assert "pip install 'tether[otel]'" in str(refused.value)
    monkeypatch.setenv("TETHER_OTEL", "1")
    assert tether.App("memory://").engine.observer is None  # asked by env: logged, left off


async def test_a_failed_run_is_an_error_span_naming_the_type_only() -> None:
    app = fake_app()
    instrument(app)

    @app.step(retry=tether.NO_RETRY)
    async def charge(card: str) -> None:
        raise tether.PermanentError(f"card {card} declined")

    @app.workflow()
    async def pay(card: str) -> None:
        await charge(card)

    async with app:
        handle = await app.start(pay, SECRET, id="p1")
        await run_until_idle(app)
        with pytest.raises(tether.RunFailed):
            await handle.result()
    run, step = by_start(EXPORTER.get_finished_spans())
    assert attrs(step)["tether.outcome"] == "failed"
    assert attrs(step)["tether.error_type"] == "PermanentError"
    assert attrs(run)["tether.outcome"] == "failed"
    assert attrs(run)["tether.error_type"] == "PermanentError"
    assert (run.status.status_code, run.status.description) == (StatusCode.ERROR, None)
    assert (step.status.status_code, step.status.description) == (StatusCode.ERROR, None)
    assert all(SECRET not in everything_recorded(s) for s in (run, step))


async def test_concurrent_steps_and_spans_made_inside_a_step_nest_where_they_ran() -> None:
    app = fake_app()
    provider = trace.get_tracer_provider()
    instrument(app, tracer_provider=provider)
    mine = provider.get_tracer("user-code")

    @app.step()
    def sync_call(n: int) -> int:  # runs in a thread: the context goes with it
        with mine.start_as_current_span("user.sync"):
            return n + 1

    @app.step()
    async def async_call(n: int) -> int:
        with mine.start_as_current_span("user.async"):
            await asyncio.sleep(0)
            return n * 2

    @app.workflow()
    async def fan(n: int) -> list[int]:
        return list(await asyncio.gather(sync_call(n), async_call(n)))

    async with app:
        handle = await app.start(fan, 3, id="fan")
        await run_until_idle(app)
        assert await handle.result() == [4, 6]
    spans = {s.name if s.name.startswith("user.") else
             f"{s.name}:{attrs(s).get('tether.step', '')}": s
             for s in EXPORTER.get_finished_spans()}  # fmt: skip
    assert sorted(spans) == ["tether.run:", "tether.step:async_call", "tether.step:sync_call",
                             "user.async", "user.sync"]  # fmt: skip

    def parent_of(name: str) -> int | None:
        parent = spans[name].parent
        return None if parent is None else parent.span_id

    def span_id(name: str) -> int:
        context = spans[name].context
        assert context is not None
        return context.span_id

    assert parent_of("tether.run:") is None
    assert parent_of("tether.step:sync_call") == span_id("tether.run:")
    assert parent_of("tether.step:async_call") == span_id("tether.run:")
    assert parent_of("user.sync") == span_id("tether.step:sync_call")
    assert parent_of("user.async") == span_id("tether.step:async_call")


async def test_a_worker_stop_mid_step_ends_the_spans_as_interrupted_and_abandoned() -> None:
    app = fake_app()
    instrument(app)
    entered = asyncio.Event()

    @app.step()
    async def hang() -> None:
        entered.set()
        await asyncio.Event().wait()

    @app.workflow()
    async def stuck() -> None:
        await hang()

    async with app:
        await app.start(stuck, id="s1")
        await asyncio.wait_for(entered.wait(), 5)
    run, step = by_start(EXPORTER.get_finished_spans())
    assert attrs(step)["tether.outcome"] == "interrupted"
    assert attrs(step)["tether.error_type"] == "CancelledError"
    assert attrs(run)["tether.outcome"] == "abandoned"
    assert attrs(run)["tether.error_type"] == "CancelledError"


async def test_metrics_count_executions_step_attempts_and_durations() -> None:
    app, deliver = build()
    metrics = metrics_of(app.engine)
    assert metrics_of(app.engine) is metrics  # one per engine
    async with app:
        await app.start(deliver, "x", id="m1")
        await run_until_idle(app)
    assert metrics.runs_finished == {("deliver", "succeeded"): 1}
    assert metrics.run_executions == {("deliver", "suspended"): 1, ("deliver", "succeeded"): 1}
    assert metrics.step_attempts == {("fetch", "completed"): 1, ("send", "retrying"): 1,
                                     ("send", "completed"): 1}  # fmt: skip
    assert sorted(metrics.step_durations) == ["fetch", "send"]
    send = metrics.step_durations["send"]
    # On the fake clock a step takes no time: both attempts in the first bucket.
    assert (send.count, send.sum, send.counts[0], sum(send.counts)) == (2, 0.0, 2, 2)
    assert send.cumulative()[-1] == (float("inf"), 2)
    snapshot = metrics.snapshot()
    metrics.step_durations["send"].observe(1.0)
    assert snapshot.step_durations["send"].count == 2


def test_a_histogram_counts_each_value_in_the_first_bucket_that_holds_it() -> None:
    from tether.telemetry import Histogram

    histogram = Histogram(bounds=(0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 1.0, 7.0):
        histogram.observe(value)
    assert histogram.counts == [2, 2, 1]  # <= 0.1, (0.1, 1.0], above
    assert histogram.cumulative() == [(0.1, 2), (1.0, 4), (float("inf"), 5)]
    assert (histogram.count, histogram.sum) == (5, 8.65)


async def test_an_observer_that_raises_is_logged_and_the_run_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(Observer):
        def step_started(self, run_id: str, workflow: str, step: str, name: str,
                         attempt: int) -> object:  # fmt: skip
            raise RuntimeError("observer bug")

    app, deliver = build()
    broken = Broken()
    app.engine.observe(broken)
    metrics = metrics_of(app.engine)
    with caplog.at_level(logging.ERROR, logger="tether.observe"):
        async with app:
            handle = await app.start(deliver, "x", id="b1")
            await run_until_idle(app)
            assert await handle.result() == "page for x"
    # The others still hear every attempt; the broken one is logged once per attempt.
    assert metrics.step_attempts == {("fetch", "completed"): 1, ("send", "retrying"): 1,
                                     ("send", "completed"): 1}  # fmt: skip
    assert [r.getMessage() for r in caplog.records if r.name == "tether.observe"] == [
        f"observer {broken!r} failed in step_started"
    ] * 3


async def test_an_observer_hears_outcomes_in_order() -> None:
    heard: list[tuple[str, ...]] = []

    class Recorder(Observer):
        def run_started(self, run_id: str, workflow: str, epoch: int) -> object:
            heard.append(("run", run_id, workflow, str(epoch)))
            return run_id

        def run_ended(self, state: object, outcome: RunOutcome,
                      error: BaseException | None) -> None:  # fmt: skip
            heard.append(("run-end", str(state), outcome.value, type(error).__name__))

        def step_started(self, run_id: str, workflow: str, step: str, name: str,
                         attempt: int) -> object:  # fmt: skip
            heard.append(("step", name, str(attempt)))
            return name

        def step_ended(self, state: object, outcome: StepOutcome, duration: float,
                       error: BaseException | None) -> None:  # fmt: skip
            heard.append(("step-end", str(state), outcome.value, str(duration)))

    app, deliver = build()
    app.engine.observe(Recorder())
    async with app:
        await app.start(deliver, "x", id="o1")
        await run_until_idle(app)
    assert heard == [
        ("run", "o1", "deliver", "1"),
        ("step", "fetch", "1"),
        ("step-end", "fetch", "completed", "0.0"),
        ("step", "send", "1"),
        ("step-end", "send", "retrying", "0.0"),
        ("run-end", "o1", "suspended", "NoneType"),
        ("run", "o1", "deliver", "2"),
        ("step", "send", "2"),
        ("step-end", "send", "completed", "0.0"),
        ("run-end", "o1", "succeeded", "NoneType"),
    ]


# -- logging ------------------------------------------------------------------------------------


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.addFilter(RunContextFilter())
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def collected() -> Iterator[Collect]:
    handler = Collect()
    user = logging.getLogger("my.app")
    user.addHandler(handler)
    user.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        user.removeHandler(handler)
        user.setLevel(logging.NOTSET)


async def test_the_filter_adds_run_and_step_inside_steps_and_empty_strings_outside(
    collected: Collect,
) -> None:
    user = logging.getLogger("my.app")
    app = fake_app()

    @app.step()
    async def async_part() -> None:
        user.info("in the async step")

    @app.step()
    def sync_part() -> None:
        user.info("in the sync step")

    @app.workflow()
    async def job() -> None:
        user.info("in the workflow")
        await async_part()
        await async_part()
        await sync_part()

    user.info("before")
    async with app:
        await app.start(job, id="job-1")
        await run_until_idle(app)
    user.info("after")
    seen = [(r.getMessage(), r.run_id, r.workflow, r.step)  # type: ignore[attr-defined]
            for r in collected.records]  # fmt: skip
    assert seen == [
        ("before", "", "", ""),
        ("in the workflow", "job-1", "job", ""),
        ("in the async step", "job-1", "job", "async_part"),
        ("in the async step", "job-1", "job", "async_part#2"),
        ("in the sync step", "job-1", "job", "sync_part"),
        ("after", "", "", ""),
    ]


def test_the_filter_keeps_what_a_record_already_says() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    record.run_id = "given"
    assert RunContextFilter().filter(record) is True
    assert record.run_id == "given"


async def greet_ada() -> None:
    """Run h1, whose step `greet` logs `greeting ada` on my.app; then log `outside` a run."""
    app = fake_app()

    @app.step()
    async def greet(name: str) -> str:
        logging.getLogger("my.app").info("greeting %s", name)
        return name

    @app.workflow()
    async def hello(name: str) -> str:
        return await greet(name)

    async with app:
        await app.start(hello, "ada", id="h1")
        await run_until_idle(app)
    logging.getLogger("my.app").warning("outside")


async def test_install_logging_prints_the_run_and_step_of_user_records() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = install_logging(stream=stream)
    try:
        assert install_logging(stream=stream) is handler  # once, however often it is called
        assert root.handlers.count(handler) == 1
        await greet_ada()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    lines = [line.split(" ", 2)[2] for line in stream.getvalue().splitlines()]  # no timestamp
    assert "INFO my.app [run=h1 step=greet] greeting ada" in lines
    assert "WARNING my.app [run= step=] outside" in lines
    assert LOG_FORMAT == (
        "%(asctime)s %(levelname)s %(name)s [run=%(run_id)s step=%(step)s] %(message)s"
    )


# -- logging as JSON ----------------------------------------------------------------------------

ISO_MS_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def no_constant(name: str) -> object:
    raise AssertionError(f"{name} is not JSON")


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The records of a JSON log, after checking that each is one line of printable characters
    (no line break of any kind, no escape sequence, valid UTF-8) and strict JSON."""
    lines = text.splitlines()
    assert text == "".join(line + "\n" for line in lines)  # nothing else breaks a line
    for line in lines:
        assert line.isprintable(), line
        line.encode("utf-8")
    return [json.loads(line, parse_constant=no_constant) for line in lines]


class JsonLog:
    """JsonFormatter on a handler of logger `my.json`, as install_logging(format="json") sets
    it up, without touching the root logger."""

    def __init__(self) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.addFilter(RunContextFilter())
        self.handler.setFormatter(JsonFormatter())

    def records(self) -> list[dict[str, Any]]:
        return parse_lines(self.stream.getvalue())


@pytest.fixture
def json_log() -> Iterator[JsonLog]:
    log = JsonLog()
    logger = logging.getLogger("my.json")
    logger.addHandler(log.handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield log
    finally:
        logger.removeHandler(log.handler)
        logger.setLevel(logging.NOTSET)


def fail(error: Exception) -> None:
    raise error


def record(msg: object, *args: object, **attributes: object) -> logging.LogRecord:
    made = logging.LogRecord("my.json", logging.INFO, __file__, 1, msg, args or None, None)
    made.__dict__.update(attributes)
    return made


async def test_install_logging_as_json_writes_a_step_record_as_one_line_with_its_run_and_step() -> (
    None
):
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = install_logging(stream=stream, format="json")
    try:
        await greet_ada()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    mine = [r for r in parse_lines(stream.getvalue()) if r["logger"] == "my.app"]
    for entry in mine:
        assert ISO_MS_UTC.fullmatch(entry.pop("time"))
    assert mine == [
        {"level": "INFO", "logger": "my.app", "message": "greeting ada",
         "run_id": "h1", "workflow": "hello", "step": "greet"},
        {"level": "WARNING", "logger": "my.app", "message": "outside",
         "run_id": "", "workflow": "", "step": ""},
    ]  # fmt: skip


def test_a_json_record_has_its_fields_in_order_and_its_time_in_utc_to_the_millisecond() -> None:
    made = record("hello %s", "ada", created=1777716843.214, run_id="r1", workflow="w", step="s#2")
    line = JsonFormatter().format(made)
    assert line == (
        '{"time":"2026-05-02T10:14:03.214Z","level":"INFO","logger":"my.json",'
        '"message":"hello ada","run_id":"r1","workflow":"w","step":"s#2"}'
    )
    assert datetime(2026, 5, 2, 10, 14, 3, 214000, tzinfo=UTC).timestamp() == 1777716843.214


HOSTILE = [
    "two\nlines",
    "carriage\rreturn and\r\nboth",
    "line\u2028separator",
    "paragraph\u2029separator",
    "next\x85line, vertical\x0btab, form\x0cfeed, \x1c\x1d\x1e separators",
    "\x1b[31mred\x1b[0m and \x9b2J (a C1 CSI) and \x7f",
    'quotes " and \\ backslashes \\" and \\u2028 spelled out',
    '"}\n{"level":"CRITICAL","message":"forged"}',
    "bidi \u202eoverride\u202c, zero\u200bwidth, \ufeffBOM, \U000e0001 tag",
    "a lone surrogate \ud800 (from os.fsdecode of bad bytes)",
    "unicode stays readable: café, 日本語, 🎉",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_in_a_json_record_stays_one_line_and_parses_back_exactly(
    json_log: JsonLog, text: str
) -> None:
    logging.getLogger("my.json").info(text)
    logging.getLogger("my.json").info("said: %s", text, extra={"note": text, "run_id": text})
    plain, formatted = json_log.records()
    assert plain["message"] == text
    assert formatted["message"] == f"said: {text}"
    assert formatted["note"] == text
    assert formatted["run_id"] == text
    assert plain["level"] == formatted["level"] == "INFO"
    assert "CRITICAL" not in (plain["level"], formatted["level"])


def test_printable_unicode_is_written_as_it_is_and_only_the_rest_is_escaped() -> None:
    line = JsonFormatter().format(record("café 日本語 🎉\u2028\x1b"))
    assert "café 日本語 🎉\\u2028\\u001b" in line


def test_every_character_tether_text_spells_out_is_escaped_in_a_json_line() -> None:
    spelled = "".join(
        chr(c) for c in range(0x110000)
        if not 0xD800 <= c <= 0xDFFF and hostile(chr(c), newlines=False)
    )  # fmt: skip
    assert {"\u2028", "\u2029", "\x1b", "\x85", "\n", "\u202e"} <= set(spelled)
    line = JsonFormatter().format(record(spelled))
    assert not any(char in line for char in spelled)
    assert json.loads(line)["message"] == spelled


def test_secrets_are_redacted_in_the_json_message_extras_and_traceback(json_log: JsonLog) -> None:
    url = "postgresql://app:hunter2@db.internal:5432/prod"
    try:
        fail(ConnectionError(f"upstream refused token {SECRET} at {url}"))
    except ConnectionError:
        logging.getLogger("my.json").exception(
            "calling with %s", SECRET,
            extra={"note": f"key={SECRET}", "dsn": url, "nested": {"list": [SECRET, "plain"]},
                   "api_key": "opaque-but-named", "config": {"password": "hunter3"}},
        )  # fmt: skip
    text = json_log.stream.getvalue()
    for secret in (SECRET, "hunter2", "hunter3", "opaque-but-named"):
        assert secret not in text
    (entry,) = json_log.records()
    assert entry["message"] == f"calling with {REDACTED}"
    assert entry["note"] == f"key={REDACTED}"
    assert entry["dsn"] == f"postgresql://app:{REDACTED}@db.internal:5432/prod"
    assert entry["nested"] == {"list": [REDACTED, "plain"]}
    assert entry["api_key"] == REDACTED
    assert entry["config"] == {"password": REDACTED}
    assert entry["exception"].endswith(
        f"ConnectionError: upstream refused token {REDACTED} at "
        f"postgresql://app:{REDACTED}@db.internal:5432/prod"
    )


def test_an_exception_is_in_the_exception_field_and_a_stack_in_the_stack_field(
    json_log: JsonLog,
) -> None:
    logger = logging.getLogger("my.json")
    logger.info("nothing wrong")
    try:
        fail(ValueError("boom"))
    except ValueError:
        logger.exception("it failed")
    logger.info("here", stack_info=True)
    plain, failed, stacked = json_log.records()
    assert "exception" not in plain
    assert "stack" not in plain
    assert failed["message"] == "it failed"
    assert failed["level"] == "ERROR"
    assert failed["exception"].startswith("Traceback (most recent call last):\n")
    assert 'fail(ValueError("boom"))' in failed["exception"]
    assert "raise error" in failed["exception"]
    assert failed["exception"].endswith("ValueError: boom")
    assert "stack" not in failed
    assert stacked["stack"].startswith("Stack (most recent call last):\n")
    assert "test_an_exception_is_in_the_exception_field" in stacked["stack"]
    assert "exception" not in stacked


class Thing:
    def __str__(self) -> str:
        return "a thing"


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class BadMapping(dict[str, str]):
    def items(self) -> Any:
        raise RuntimeError("no items")

    def __str__(self) -> str:
        return "a bad mapping"


def test_extras_json_cannot_hold_are_written_as_text_and_never_break_the_line(
    json_log: JsonLog,
) -> None:
    cycle: list[object] = [1]
    cycle.append(cycle)
    extras = {
        "thing": Thing(),
        "data": b"\x00raw\nbytes",
        "tags": {"b", "a", "c"},
        "pair": (1, "two"),
        "when": datetime(2026, 5, 2, 10, 14, 3, tzinfo=UTC),
        "ratio": float("nan"),
        "limit": float("inf"),
        "count": 3,
        "share": 0.5,
        "flag": True,
        "nothing": None,
        "keys": {1: "int key", None: "none key"},
        "unprintable": Unprintable(),
        "bad_mapping": BadMapping(),
        "cycle": cycle,
        "huge": 10**5000,
        "level": "CRITICAL",  # would forge the level
    }
    logging.getLogger("my.json").info("odd extras", extra=extras)
    (entry,) = json_log.records()
    assert entry["level"] == "INFO"
    assert entry["message"] == "odd extras"
    assert entry["extra.level"] == "CRITICAL"
    assert entry["thing"] == "a thing"
    assert entry["data"] == "b'\\x00raw\\nbytes'"
    assert entry["tags"] == ["a", "b", "c"]
    assert entry["pair"] == [1, "two"]
    assert entry["when"] == "2026-05-02T10:14:03+00:00"
    assert (entry["ratio"], entry["limit"]) == ("nan", "inf")
    assert (entry["count"], entry["share"], entry["flag"], entry["nothing"]) == (3, 0.5, True, None)
    assert entry["keys"] == {"1": "int key", "None": "none key"}
    assert entry["unprintable"] == "<unprintable Unprintable>"
    assert entry["bad_mapping"] == "a bad mapping"
    assert entry["cycle"] == [1, REDACTED]
    assert entry["huge"] == "<an int of 16610 bits>"


def test_a_json_formatter_never_raises_and_never_changes_the_record() -> None:
    formatter = JsonFormatter()
    try:
        fail(KeyError("k"))
    except KeyError:
        failing = record("failed", exc_info=sys.exc_info())
    odd = [
        record("%d items", "many"),  # args that do not fit
        record(Unprintable()),
        record("no time", created="yesterday"),
        record("far future", created=1e300),
        record("hand-made exc_info", exc_info=("not", "a", "triple")),
        record("levelname not a string", levelname=None, name=42),
        failing,
    ]
    for made in odd:
        before = dict(vars(made))
        (entry,) = parse_lines(formatter.format(made) + "\n")
        assert vars(made) == before  # no message, asctime or exc_text cached on it
        assert set(entry) >= {"time", "level", "logger", "message", "run_id", "workflow", "step"}
    messages = [json.loads(formatter.format(made))["message"] for made in odd]
    assert messages[0] == "'%d items' % ('many',)"
    assert messages[1] == "<unprintable Unprintable> % None"
    assert json.loads(formatter.format(odd[2]))["time"] == "yesterday"
    assert json.loads(formatter.format(odd[4]))["exception"] == "('not', 'a', 'triple')"
    assert json.loads(formatter.format(odd[5]))["logger"] == "42"
    assert json.loads(formatter.format(failing))["exception"].endswith("KeyError: 'k'")


def test_install_logging_switches_its_one_handler_between_text_and_json() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    log = logging.getLogger("my.app")
    handler = install_logging(stream=stream)
    try:
        log.warning("first as text")
        assert install_logging(stream=stream, format="json", fmt="%(message)s") is handler
        assert isinstance(handler.formatter, JsonFormatter)
        log.warning("then as json")
        with pytest.raises(ConfigurationError, match="'text' or 'json', not 'xml'"):
            install_logging(stream=stream, format="xml")  # type: ignore[arg-type]
        assert isinstance(handler.formatter, JsonFormatter)  # a refused call changes nothing
        assert install_logging(stream=stream, format="text") is handler
        log.warning("text again")
        assert [h for h in root.handlers if isinstance(h, type(handler))] == [handler]
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    first, second, third = stream.getvalue().splitlines()
    assert first.split(" ", 2)[2] == "WARNING my.app [run= step=] first as text"
    assert json.loads(second)["message"] == "then as json"  # fmt is for the text format only
    assert third.split(" ", 2)[2] == "WARNING my.app [run= step=] text again"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "text"),
        ("", "text"),
        ("   ", "text"),
        ("text", "text"),
        ("TEXT", "text"),
        ("json", "json"),
        ("JSON", "json"),
        (" Json\n", "json"),
    ],
)
def test_tether_log_format_is_text_or_json_in_any_case_and_text_when_unset(
    value: str | None, expected: str
) -> None:
    assert log_format_from_env(value) == expected


@pytest.mark.parametrize("value", ["xml", "jsonl", "1", "te xt", "\uff4a\uff53\uff4f\uff4e"])
def test_any_other_tether_log_format_is_refused_naming_the_variable_and_the_choices(
    value: str,
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        log_format_from_env(value)
    message = str(refused.value)
    assert "TETHER_LOG_FORMAT" in message
    assert "`text` or `json`" in message
    assert repr(value) in message


def test_the_metrics_observer_is_no_part_of_the_default_engine() -> None:
    app = tether.App("memory://")
    assert app.engine.observer is None
    metrics = metrics_of(app.engine)
    assert isinstance(metrics, Metrics)
    assert app.engine.observer is not None

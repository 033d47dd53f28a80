"""The run page's timeline (tether.server.timeline): one real run on a SQLite file (a step that
fails once and is retried, a durable sleep that suspends the run, a child run, an approval the
test decides) drawn and parsed back; then synthetic histories for what a real run cannot show
quickly: days-long spans, running bars, hostile names, the row cap."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import re
import time
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pytest

import tether
from tether.core.handle import RunInfo
from tether.server import timeline as tl
from tether.server.timeline import child_ids, render_timeline
from tether.store.port import Checkpoint, CheckpointStatus, RunStatus

SVG = "http://www.w3.org/2000/svg"
T0 = 1_800_000_000.0  # a fixed moment for the synthetic runs
DAY = 86400.0


def _tag(name: str) -> str:
    return f"{{{SVG}}}{name}"


def _classes(element: ET.Element) -> set[str]:
    return set(element.get("class", "").split())


def _rows(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.findall(_tag("g")) if "tl-checkpoint" in _classes(g)]


def _bar(row: ET.Element) -> ET.Element:
    (bar,) = [r for r in row.iter(_tag("rect")) if "tl-bar" in _classes(r)]
    return bar


def _title(element: ET.Element) -> str:
    found = element.find(_tag("title"))
    assert found is not None
    assert found.text is not None
    return found.text


def _shown(label: ET.Element) -> str:
    """What a label shows: its text and its <tspan>s, not its tooltip."""
    parts = [label.text or ""]
    for child in label:
        if child.tag != _tag("title"):
            parts.append("".join(child.itertext()))
        parts.append(child.tail or "")
    return "".join(parts)


def _ticks(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(_tag("text")) if "tl-tick-label" in _classes(t)]


def _x(moment: float, start: float, end: float) -> float:
    """Where `moment` falls on the axis, computed here from the recorded times."""
    return tl.PLOT_X + (moment - start) / (end - start) * tl.PLOT_WIDTH


def _parse(svg: str) -> ET.Element:
    """The SVG, well-formed, with no script and no style attribute anywhere (the CSP)."""
    root = ET.fromstring(svg)
    assert root.tag == _tag("svg")
    assert "style=" not in svg
    assert "<script" not in svg.lower()
    for element in root.iter():
        assert "style" not in element.attrib, element.tag
        assert element.tag != _tag("script")
    return root


def _run(
    status: RunStatus = RunStatus.SUCCEEDED, *, span: float = 2.0, run_id: str = "r-1"
) -> RunInfo:
    created = datetime.fromtimestamp(T0, UTC)
    finished = datetime.fromtimestamp(T0 + span, UTC) if status.terminal else None
    return RunInfo(id=run_id, workflow="wf", status=status, created_at=created,
                   updated_at=finished or created, finished_at=finished, error=None, owner=None,
                   attempt=1)  # fmt: skip


def _cp(
    seq: int,
    start: float | None,
    end: float | None,
    *,
    name: str = "",
    kind: str = "step",
    status: CheckpointStatus = CheckpointStatus.COMPLETED,
    attempts: int = 1,
    retry_at: float | None = None,
    result: str | None = None,
) -> Checkpoint:
    return Checkpoint(seq=seq, name=name or f"s{seq}", kind=kind, status=status, result=result,
                      attempts=attempts, started_at=start, finished_at=end, retry_at=retry_at,
                      position=str(seq))  # fmt: skip


# -- a real run ------------------------------------------------------------------------------


def _app(path: Path) -> tether.App:
    app = tether.App(f"sqlite:///{path}")
    # Waits hold the run in memory 50 ms only (so the sleep suspends it and the store wakes it),
    # and a suspended run is looked at again every 50 ms: the whole run takes well under 1 s.
    app.engine.settings = dataclasses.replace(app.engine.settings, inline_wait_max=0.05,
                                              poll_interval=0.05)  # fmt: skip
    calls: list[int] = []

    @app.step(retry=tether.Retry(initial_delay=timedelta(milliseconds=50), jitter=0))
    async def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the first attempt fails")
        return "ok"

    @app.workflow()
    async def kid(n: int) -> int:
        return n + 1

    @app.workflow()
    async def parent() -> str:
        await flaky()
        await tether.sleep(timedelta(milliseconds=300))
        await kid(1)
        decision = await tether.approval("Ship it?", reviewers=["*"])
        return decision.status

    return app


async def test_a_real_run_is_drawn_one_row_per_checkpoint_at_its_recorded_times(
    tmp_path: Path,
) -> None:
    app = _app(tmp_path / "timeline.db")
    async with app:
        handle = await app.start("parent", id="run-1")
        async with asyncio.timeout(10):
            while not (asked := await app.list_approvals(run_id="run-1")):
                await asyncio.sleep(0.02)
        await app.decide(asked[0].id, "approve", reviewer="alice",
                         operation_digest=asked[0].operation_digest)  # fmt: skip
        assert await handle.result(timeout=10) == "approved"
        info = await handle.info()
        history = await handle.checkpoints()
        kids = [await (await app.get(i)).info() for i in child_ids(history)]
        approvals = await app.list_approvals(run_id="run-1", status=None)
    assert [c.kind for c in history] == ["step", "sleep", "child", "join", "approval",
                                         "approval-wait"]  # fmt: skip
    assert [k.id for k in kids] == ["run-1/child:kid"]
    assert info.attempt >= 2  # the sleep outlasted the inline wait: suspended, claimed again

    now = time.time()
    svg = render_timeline(info, history, children=kids, approvals=approvals, now=now)
    root = _parse(svg)
    assert root.get("role") == "img"
    labelled = [root.find(f"*[@id='{i}']") for i in (root.get("aria-labelledby") or "").split()]
    assert [e.tag if e is not None else None for e in labelled] == [_tag("title"), _tag("desc")]

    rows = _rows(root)
    assert [int(r.get("data-seq", "")) for r in rows] == [c.seq for c in history]
    assert [r.get("data-kind") for r in rows] == [c.kind for c in history]
    # Every bar spans its checkpoint's recorded start and end on an axis from the run's
    # creation to its end (at least MIN_BAR wide, so the instants stay visible; a bar that
    # starts within MIN_BAR of the axis's end is moved left to fit inside the plot).
    start = min([info.created_at.timestamp()] + [c.started_at for c in history if c.started_at])
    assert info.finished_at is not None
    end = info.finished_at.timestamp()
    for row, cp in zip(rows, history, strict=True):
        assert cp.started_at is not None
        assert cp.finished_at is not None
        bar = _bar(row)
        assert {"tl-bar", f"tl-k-{cp.kind}", "tl-s-completed"} <= _classes(bar)
        x, width = float(bar.get("x", "")), float(bar.get("width", ""))
        true_width = _x(cp.finished_at, start, end) - _x(cp.started_at, start, end)
        assert width == pytest.approx(max(true_width, tl.MIN_BAR), abs=0.02)
        inside = tl.PLOT_X + tl.PLOT_WIDTH - max(true_width, tl.MIN_BAR)
        assert x == pytest.approx(min(_x(cp.started_at, start, end), inside), abs=0.02)
        assert _title(bar).splitlines()[:2] == [cp.name, f"{cp.kind} \u00b7 completed"]
    sleep = _bar(rows[1])
    assert float(sleep.get("width", "")) >= 0.3 / (end - start) * tl.PLOT_WIDTH - 0.02
    assert "tl-wait" in _classes(sleep)
    assert "tl-work" in _classes(_bar(rows[0]))

    # The retried step: hatched, its count in its row and in its tooltip.
    assert "tl-retried" in _classes(_bar(rows[0]))
    assert [r for r in rows[0].iter(_tag("rect")) if "tl-hatch" in _classes(r)]
    counts = [t.text for t in rows[0].iter(_tag("text")) if "tl-attempts" in _classes(t)]
    assert counts == ["\u00d72"]
    assert "attempts 2 (the times are the last attempt's)" in _title(_bar(rows[0]))

    # The child's start and its join link to the child's page; the approval's rows to its own.
    links = {r.get("data-kind"): r.find(_tag("a")) for r in rows}
    child_href = "/runs/" + quote("run-1/child:kid", safe="")
    assert links["child"] is not None
    assert links["child"].get("href") == child_href
    assert links["join"] is not None
    assert links["join"].get("href") == child_href
    for kind in ("approval", "approval-wait"):
        assert links[kind] is not None
        assert links[kind].get("href") == f"/approvals/{asked[0].id}"
    assert links["step"] is None
    assert links["sleep"] is None
    spans = [r for r in rows[4].iter(_tag("rect")) if "tl-span" in _classes(r)]
    assert len(spans) == 1
    assert "tl-s-approved" in _classes(spans[0])

    # Without the child and the approvals (a viewer who may not see them): drawn, not linked.
    bare = _parse(render_timeline(info, history, now=now))
    assert [r.find(_tag("a")) for r in _rows(bare)] == [None] * len(history)
    # Deterministic: the same inputs give the same text, in whatever order the rows come.
    again = render_timeline(info, history[::-1], children=kids, approvals=approvals, now=now)
    assert again == svg


# -- the axis ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("span", "labels"),
    [
        (0.3, ["0", "50 ms", "100 ms", "150 ms", "200 ms", "250 ms", "300 ms"]),
        (2.0, ["0", "0.25 s", "0.5 s", "0.75 s", "1 s", "1.25 s", "1.5 s", "1.75 s", "2 s"]),
        (90.0, ["0", "15 s", "30 s", "45 s", "1 min", "1 min 15 s", "1 min 30 s"]),
        (3 * DAY, ["0", "12 h", "1 d", "1 d 12 h", "2 d", "2 d 12 h", "3 d"]),
    ],
)
def test_axis_labels_count_in_the_units_of_the_span(span: float, labels: list[str]) -> None:
    root = _parse(render_timeline(_run(span=span), [_cp(0, T0, T0 + span / 2)], now=T0 + span))
    assert _ticks(root) == labels
    # Evenly spaced, the first at the axis' origin: nothing is compressed.
    xs = [float(t.get("x", "")) for t in root.iter(_tag("text")) if "tl-tick-label" in _classes(t)]
    assert xs[0] == tl.PLOT_X
    gaps = [b - a for a, b in itertools.pairwise(xs)]
    assert max(gaps) - min(gaps) < 0.05


def test_a_one_millisecond_step_in_a_three_day_run_gets_the_minimum_width() -> None:
    history = [
        _cp(0, T0, T0 + 0.001, name="quick"),
        _cp(1, T0 + 1.5 * DAY, T0 + 1.5 * DAY + 0.001, name="later"),
        _cp(2, T0 + 3 * DAY - 0.001, T0 + 3 * DAY, name="last"),
        _cp(3, T0 + DAY, T0 + 2 * DAY, kind="sleep", name="a day asleep"),
    ]
    root = _parse(render_timeline(_run(span=3 * DAY), history, now=T0 + 3 * DAY))
    bars = [_bar(r) for r in _rows(root)]
    assert [float(b.get("width", "")) for b in bars[:3]] == [tl.MIN_BAR] * 3
    assert float(bars[1].get("x", "")) == pytest.approx(tl.PLOT_X + tl.PLOT_WIDTH / 2, abs=0.01)
    # One at the very end stays inside the plot rather than past its edge.
    assert float(bars[2].get("x", "")) + tl.MIN_BAR == pytest.approx(tl.PLOT_X + tl.PLOT_WIDTH)
    assert float(bars[3].get("width", "")) == pytest.approx(tl.PLOT_WIDTH / 3, abs=0.01)
    assert "took 1 d" in _title(bars[3])


# -- what is still going on ------------------------------------------------------------------------


def test_a_running_step_extends_to_now_and_is_marked() -> None:
    history = [
        _cp(0, T0, T0 + 1),
        _cp(1, T0 + 2, None, name="slow", status=CheckpointStatus.STARTED, retry_at=T0 + 60),
    ]
    now = T0 + 10
    root = _parse(render_timeline(_run(RunStatus.RUNNING), history, now=now))
    bar = _bar(_rows(root)[1])
    assert "tl-running" in _classes(bar)
    assert float(bar.get("x", "")) == pytest.approx(_x(T0 + 2, T0, now), abs=0.02)
    assert float(bar.get("x", "")) + float(bar.get("width", "")) == pytest.approx(
        tl.PLOT_X + tl.PLOT_WIDTH, abs=0.02
    )
    assert "running for 8 s" in _title(bar)
    (now_line,) = [e for e in root.iter(_tag("line")) if "tl-now" in _classes(e)]
    assert float(now_line.get("x1", "")) == tl.PLOT_X + tl.PLOT_WIDTH
    # Its timeout is past the axis' end: an arrow at the edge saying when.
    (marker,) = [e for e in _rows(root)[1].iter() if "tl-marker" in _classes(e)]
    assert {"tl-timeout", "tl-beyond"} <= _classes(marker)
    assert _title(marker).endswith("(in 50 s)")


def test_an_unfinished_checkpoint_of_an_ended_run_stops_at_the_run_end_not_now() -> None:
    history = [_cp(0, T0 + 1, None, status=CheckpointStatus.STARTED)]
    root = _parse(render_timeline(_run(RunStatus.CANCELLED, span=4), history, now=T0 + 1000))
    bar = _bar(_rows(root)[0])
    assert "tl-unfinished" in _classes(bar)
    assert "tl-running" not in _classes(bar)
    assert float(bar.get("x", "")) + float(bar.get("width", "")) == pytest.approx(
        tl.PLOT_X + tl.PLOT_WIDTH, abs=0.02
    )
    assert _ticks(root)[-1] == "4 s"  # the axis ends with the run, not at `now`
    assert not [e for e in root.iter(_tag("line")) if "tl-now" in _classes(e)]


def test_a_retrying_step_shows_its_delay_and_when_the_next_attempt_is_due() -> None:
    history = [_cp(0, T0, T0 + 1, status=CheckpointStatus.RETRYING, attempts=3, retry_at=T0 + 3)]
    root = _parse(render_timeline(_run(RunStatus.WAITING), history, now=T0 + 4))
    row = _rows(root)[0]
    assert "tl-s-retrying" in _classes(_bar(row))
    (delay,) = [r for r in row.iter(_tag("rect")) if "tl-retry-wait" in _classes(r)]
    assert float(delay.get("x", "")) == pytest.approx(_x(T0 + 1, T0, T0 + 4), abs=0.02)
    assert float(delay.get("width", "")) == pytest.approx(tl.PLOT_WIDTH / 2, abs=0.02)
    (marker,) = [e for e in row.iter() if "tl-marker" in _classes(e)]
    assert "tl-retry" in _classes(marker)
    assert "tl-beyond" not in _classes(marker)
    assert float(marker.get("x1", "")) == pytest.approx(_x(T0 + 3, T0, T0 + 4), abs=0.02)
    assert _title(marker).endswith("(1 s ago)")
    assert [t.text for t in row.iter(_tag("text")) if "tl-attempts" in _classes(t)] == ["\u00d73"]


# -- hostile text and bounded size ---------------------------------------------------------------


def test_hostile_names_ids_and_kinds_are_spelled_out_and_escaped() -> None:
    hostile = '<script>alert(1)</script>" onload="x\u202eevil\u200b\x1b[2J\nforged line\ud800'
    child = 'kid"/><script>alert(2)'
    history = [
        _cp(0, T0, T0 + 1, name=hostile, kind='step" onmouseover="alert(3)'),
        _cp(1, T0 + 1, T0 + 1.5, name="child:kid", kind="child", result=json.dumps(child)),
    ]
    kids = [dataclasses.replace(_run(run_id=child), workflow="<b>kid</b>")]
    svg = render_timeline(_run(run_id="r\u202e<i>"), history, children=kids, now=T0 + 2)
    root = _parse(svg)  # well-formed: the lone surrogate and ESC are spelled out too
    for raw in ("<script", "\u202e", "\u200b", "\x1b", "\ud800", "<b>", "<i>", 'onload="'):
        assert raw not in svg
    first, second = _rows(root)
    label = first.find(f".//{_tag('text')}")
    assert label is not None
    # Shown as text, not markup, cut to its column.
    assert _shown(label) == hostile[: tl.LABEL_CHARS - 1] + "\u2026"
    assert _title(_bar(first)).splitlines()[0] == (
        '<script>alert(1)</script>" onload="x<U+202E>evil<U+200B><U+001B>[2J\\nforged line<U+D800>'
    )
    assert "tl-k-step--onmouseover--alert-3-" in _classes(_bar(first))
    assert "onmouseover" not in _bar(first).attrib
    link = second.find(_tag("a"))
    assert link is not None
    assert link.get("href") == "/runs/" + quote(child, safe="")
    assert "<b>kid</b>" in _title(
        next(r for r in second.iter(_tag("rect")) if "tl-span" in _classes(r))
    )
    assert _title(root) == "Timeline of run r<U+202E><i>"


def test_a_label_marks_spelled_out_characters_and_is_cut_to_its_column() -> None:
    history = [_cp(0, T0, T0 + 1, name="pay\u202eyap"), _cp(1, T0, T0 + 1, name="n" * 5000)]
    root = _parse(render_timeline(_run(), history, now=T0 + 2))
    short, long = (r.find(f".//{_tag('text')}") for r in _rows(root))
    assert short is not None
    assert long is not None
    marked = [t.text for t in short.iter(_tag("tspan")) if "tl-hidden-char" in _classes(t)]
    assert marked == ["<U+202E>"]
    assert long.text == "n" * (tl.LABEL_CHARS - 1) + "\u2026"
    assert len(_title(long)) == tl.TITLE_CHARS


def test_rows_are_capped_with_a_note_of_how_many_more() -> None:
    count = tl.MAX_ROWS + 100
    history = [_cp(i, T0 + i * 0.001, T0 + i * 0.001 + 0.0005) for i in range(count)]
    svg = render_timeline(_run(), history, now=T0 + 2)
    root = _parse(svg)
    assert len(_rows(root)) == tl.MAX_ROWS
    (note,) = [t for t in root.iter(_tag("text")) if "tl-more" in _classes(t)]
    assert note.text == f"100 more checkpoints not drawn (the first {tl.MAX_ROWS} are)"
    assert len(svg) < 1000 * tl.MAX_ROWS  # bounded: about a kilobyte a row


def test_the_stylesheet_styles_only_timeline_classes() -> None:
    # inbox.css styles .bar, .step and .timeline: a rule here on any class not prefixed tl-
    # would restyle the inbox's pages, and one of theirs would reach into the drawing.
    css = (Path(tl.__file__).parent / "static" / "timeline.css").read_text()
    rules = re.sub(r"/\*.*?\*/", "", css, flags=re.DOTALL)
    classes = set(re.findall(r"\.([A-Za-z_][\w-]*)", re.sub(r"\{[^}]*\}", "{}", rules)))
    assert classes, "no class selectors found"
    assert {c for c in classes if c != "tl" and not c.startswith("tl-")} == set()
    # And the structural classes the renderer emits are all styled.
    svg = render_timeline(_run(RunStatus.RUNNING), [
        _cp(0, T0, T0 + 1, attempts=2),
        _cp(1, T0 + 1, None, kind="sleep", status=CheckpointStatus.STARTED, retry_at=T0 + 9),
    ], now=T0 + 2)  # fmt: skip
    emitted = set(re.findall(r'class="([^"]*)"', svg))
    for name in ("tl-bar", "tl-work", "tl-wait", "tl-running", "tl-hatch", "tl-marker",
                 "tl-now", "tl-label", "tl-attempts", "tl-tick-label"):  # fmt: skip
        assert any(name in c.split() for c in emitted), name
        assert name in classes, name

"""The run page's timeline: a run's checkpoints as a Gantt chart on a time axis, one SVG drawn on
the server (the CSP allows no script and no style attribute: classes and presentation attributes
only, styled by static/timeline.css). Pure: it reads no store and no clock (`now` is given), it
decides nothing about access (it links only the children and approvals it is given), and it
never writes a name as it is: every text is spelled out (tether.text) and escaped.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from urllib.parse import quote

from tether.approvals.model import Approval
from tether.core.handle import RunInfo
from tether.store.keys import child_key
from tether.store.port import Checkpoint, CheckpointStatus
from tether.text import code, pieces

# The drawing's geometry, in viewBox units (the page scales the whole drawing to its width).
WIDTH = 960
LABEL_X = 8  # the name column
LABEL_WIDTH = 210
PLOT_X = 230  # the time axis runs from PLOT_X to PLOT_X + PLOT_WIDTH
PLOT_WIDTH = 680
COUNT_X = WIDTH - 8  # the attempts column (right-aligned)
TOP = 40  # the axis and its labels above the first row
ROW_HEIGHT = 22
BAR_HEIGHT = 14
MIN_BAR = 3.0  # a step of 1 ms in a run of days stays visible
MAX_ROWS = 500  # bounded output, whatever the history's length
MAX_TICKS = 8  # intervals on the axis, at most
LABEL_CHARS = 32  # of a name in its column (the nested <svg> clips wide characters anyway)
TITLE_CHARS = 300  # of a name in a tooltip
_MIN_SPAN = 0.001  # seconds: the axis of a run whose every record is at one instant

_DAY = 86400.0
# Nice tick steps in seconds, smallest first: 1-2-5 (and quarters) below the minute, then the
# clock's own divisions, then days and weeks; longer spans take whole multiples of a year.
_STEPS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.025, 0.05, 0.1, 0.2, 0.25, 0.5,
    1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0,
    3600.0, 7200.0, 10800.0, 21600.0, 43200.0,
    _DAY, 2 * _DAY, 7 * _DAY, 14 * _DAY, 30 * _DAY, 60 * _DAY, 90 * _DAY, 180 * _DAY, 365 * _DAY,
)  # fmt: skip
_UNITS = ((_DAY, "d"), (3600.0, "h"), (60.0, "min"), (1.0, "s"))
_WORK = frozenset({"step", "transaction"})
_WAITS = frozenset({"sleep", "event", "any", "join", "approval-wait"})
_SVG_NS = "http://www.w3.org/2000/svg"
# Characters XML 1.0 cannot hold even as references (tether.text spells out the C0 controls).
_NOT_XML = re.compile("[\ud800-\udfff\ufffe\uffff]")
_BREAK = re.compile(r"([\t\n\r])")
_BREAKS = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def child_ids(checkpoints: Sequence[Checkpoint]) -> list[str]:
    """The ids of the child runs these checkpoints started, in order: the runs whose RunInfo
    the caller looks up (those the viewer may see) for `render_timeline(children=...)`."""
    found = [_child_id(c) for c in checkpoints if c.kind == "child"]
    return [i for i in found if i is not None]


def render_timeline(
    run: RunInfo,
    checkpoints: Sequence[Checkpoint],
    *,
    children: Sequence[RunInfo] = (),
    approvals: Sequence[Approval] = (),
    now: float,
) -> str:
    """One <svg> element: the run on top, then a row per checkpoint (by seq, at most MAX_ROWS),
    each bar from its start to its end (to `now`, or the run's end, while it has none), on an
    axis of offsets from the run's start. Child checkpoints link to the runs in `children`
    and approval checkpoints to the approvals in `approvals`; any other id is drawn unlinked."""
    ordered = sorted(checkpoints, key=lambda c: c.seq)
    scale = _Scale.of(run, ordered, children, approvals, now)
    prefix = "tl-" + hashlib.sha256(run.id.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    shown, hidden = ordered[:MAX_ROWS], max(len(ordered) - MAX_ROWS, 0)
    kids = {c.id: c for c in children}
    asked = {a.step: a for a in approvals if a.run_id == run.id}
    height = TOP + (1 + len(shown)) * ROW_HEIGHT + (ROW_HEIGHT if hidden else 0) + 8
    title = f"Timeline of run {_clip(run.id, TITLE_CHARS)}"
    desc = (
        f"{_clip(run.workflow, TITLE_CHARS)}, {run.status}: {len(ordered)} checkpoints over "
        f"{_duration(scale.end - scale.start)} from {_when(scale.start)}"
        + (f"; the first {MAX_ROWS} are drawn" if hidden else "")
    )
    out = [
        f'<svg xmlns="{_SVG_NS}" class="tl" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-labelledby="{prefix}-title {prefix}-desc">',
        f'<title id="{prefix}-title">{_esc(title)}</title>',
        f'<desc id="{prefix}-desc">{_esc(desc)}</desc>',
        # Retried bars are hatched: a pattern is the one way to hatch without a style attribute.
        f'<defs><pattern id="{prefix}-hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        f'patternTransform="rotate(45)"><line class="tl-hatch-line" x1="0" y1="0" x2="0" y2="6" '
        f'stroke="#ffffff" stroke-width="2"/></pattern></defs>',
        *_axis(scale, height),
        *_run_row(run, scale),
    ]
    for index, cp in enumerate(shown, start=1):
        out.append(_row(cp, TOP + index * ROW_HEIGHT, scale, prefix, kids, asked))
    if hidden:
        y = TOP + (1 + len(shown)) * ROW_HEIGHT + 15
        out.append(
            f'<text class="tl-more" x="{LABEL_X}" y="{y}">{hidden} more checkpoints '
            f"not drawn (the first {MAX_ROWS} are)</text>"
        )
    out.append("</svg>")
    return "\n".join(out)


# -- the axis --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Scale:
    start: float  # the axis' origin: the earliest moment drawn
    end: float  # its right edge: the run's end (or now), or a later record
    open_end: float  # where a bar without an end stops: now, or the run's end once it ended
    live: bool  # whether the run has not ended (then open bars are running)
    now: float

    @classmethod
    def of(
        cls,
        run: RunInfo,
        checkpoints: Sequence[Checkpoint],
        children: Sequence[RunInfo],
        approvals: Sequence[Approval],
        now: float,
    ) -> _Scale:
        ended = run.finished_at if run.status.terminal else None
        live = ended is None
        open_end = now if ended is None else ended.timestamp()
        times = [run.created_at.timestamp(), open_end]
        for c in checkpoints:
            times += [t for t in (c.started_at, c.finished_at) if t is not None]
        for child in children:
            times.append(child.created_at.timestamp())
            times.append(child.finished_at.timestamp() if child.finished_at else open_end)
        for a in approvals:
            decided = a.decision.decided_at if a.decision else None
            times += [m.timestamp() for m in (a.created_at, decided) if m is not None]
        start, end = min(times), max(times)
        return cls(start, max(end, start + _MIN_SPAN), open_end, live, now)

    @property
    def span(self) -> float:
        return self.end - self.start

    def x(self, moment: float) -> float:
        fraction = min(max((moment - self.start) / self.span, 0.0), 1.0)
        return PLOT_X + fraction * PLOT_WIDTH

    def bar(self, start: float, end: float) -> tuple[float, float]:
        """(x, width) of a bar, at least MIN_BAR wide and inside the plot."""
        x = self.x(start)
        width = max(self.x(end) - x, MIN_BAR)
        return min(x, PLOT_X + PLOT_WIDTH - width), width


def tick_step(span: float) -> float:
    """The smallest nice step (seconds) that cuts `span` into at most MAX_TICKS intervals."""
    for step in _STEPS:
        # A thousandth of a step of slack: times of the epoch's size carry float noise of
        # about 1e-7 s, and a 2 s run must not be read as 2.0000001 s and get coarser ticks.
        if span / step <= MAX_TICKS + 1e-3:
            return step
    return math.ceil(span / MAX_TICKS / (365 * _DAY)) * 365 * _DAY


def tick_label(offset: float, step: float, span: float) -> str:
    """An axis label: `offset` seconds from the start, in the units the step is counted in
    ("250 ms" in a run under a second, "1.25 s", "1 min 30 s", "1 d 12 h")."""
    if offset <= 0:
        return "0"
    if step < 1:
        if span < 1:
            return f"{_plain(offset * 1000)} ms"
        return f"{_plain(offset)} s"
    base = max(unit for unit, _ in _UNITS if unit <= step)
    return _compound(round(offset / base) * base, base)


def _axis(scale: _Scale, height: int) -> Iterator[str]:
    step = tick_step(scale.span)
    bottom = height - 8
    yield '<g class="tl-axis" aria-hidden="true">'
    yield (
        f'<text class="tl-origin" x="{LABEL_X}" y="{TOP - 22}">from '
        f"{_esc(_when(scale.start))}</text>"
    )
    yield (
        f'<line class="tl-axis-line" x1="{PLOT_X}" y1="{TOP - 4}" x2="{PLOT_X + PLOT_WIDTH}" '
        f'y2="{TOP - 4}" stroke="#9aa5b1"/>'
    )
    count = int(scale.span / step + 1e-3)  # the same slack as tick_step's
    for i in range(count + 1):
        offset = i * step
        x = _n(scale.x(scale.start + offset))
        yield (
            f'<g class="tl-tick"><line class="tl-grid" x1="{x}" y1="{TOP - 8}" x2="{x}" '
            f'y2="{bottom}" stroke="#e4e7eb"/><text class="tl-tick-label" x="{x}" '
            f'y="{TOP - 10}" text-anchor="middle">'
            f"{tick_label(offset, step, scale.span)}</text></g>"
        )
    if scale.live:
        x = _n(scale.x(scale.now))
        yield (
            f'<line class="tl-now" x1="{x}" y1="{TOP - 8}" x2="{x}" y2="{bottom}" '
            f'stroke="#f0b429"/>'
        )
    yield "</g>"


# -- the rows --------------------------------------------------------------------------------------


def _run_row(run: RunInfo, scale: _Scale) -> Iterator[str]:
    start = run.created_at.timestamp()
    x, width = scale.bar(start, scale.open_end)
    y = TOP
    lines = [
        f"run {run.id}",
        f"workflow {run.workflow}",
        f"status {run.status}",
        f"created {_when(start)}",
        _lasted(start, scale.open_end, scale.live),
    ]
    flags = " tl-running" if scale.live else ""
    yield '<g class="tl-row tl-run-row">'
    yield from _label(run.workflow, y)
    yield (
        f'<rect class="tl-bar tl-run tl-s-{_token(run.status)}{flags}" x="{_n(x)}" '
        f'y="{_bar_y(y)}" width="{_n(width)}" height="{BAR_HEIGHT}" rx="2">'
        f"{_tip(lines)}</rect>"
    )
    yield "</g>"


def _row(
    cp: Checkpoint,
    y: int,
    scale: _Scale,
    prefix: str,
    kids: dict[str, RunInfo],
    asked: dict[str, Approval],
) -> str:
    """One checkpoint's row: its label, its bar, what it waits for, its link, its attempts."""
    kind, status = _token(cp.kind), _token(cp.status)
    group = _group(cp.kind)
    parts = list(_label(cp.name, y))
    href, span = _link(cp, y, kids, asked, scale)
    if span is not None:
        parts.append(span)
    parts += _bar(cp, y, scale, prefix, f"{group} tl-k-{kind} tl-s-{status}")
    if cp.attempts > 1:
        parts.append(
            f'<text class="tl-attempts" x="{COUNT_X}" y="{y + 15}" text-anchor="end">'
            f"\u00d7{cp.attempts}<title>{cp.attempts} attempts</title></text>"
        )
    body = "".join(parts)
    if href is not None:
        body = f'<a href="{_esc(href)}" class="tl-link">{body}</a>'
    return (
        f'<g class="tl-row tl-checkpoint {group}" data-seq="{cp.seq}" data-kind="{kind}">{body}</g>'
    )


def _bar(cp: Checkpoint, y: int, scale: _Scale, prefix: str, classes: str) -> Iterator[str]:
    start = cp.started_at if cp.started_at is not None else cp.finished_at
    if start is None:  # a row recorded without times (older rows): named, not placed
        yield (
            f'<text class="tl-untimed" x="{PLOT_X}" y="{y + 15}">no time recorded'
            f"{_tip(_facts(cp, None, None, scale))}</text>"
        )
        return
    opened = cp.finished_at is None and cp.status is CheckpointStatus.STARTED
    end = scale.open_end if opened else (cp.finished_at or start)
    flags = (" tl-running" if scale.live else " tl-unfinished") if opened else ""
    flags += " tl-retried" if cp.attempts > 1 else ""
    x, width = scale.bar(start, end)
    geometry = f'x="{_n(x)}" y="{_bar_y(y)}" width="{_n(width)}" height="{BAR_HEIGHT}"'
    if cp.status is CheckpointStatus.RETRYING and cp.retry_at is not None:
        # The delay before the next attempt: from this attempt's end to its due time.
        rx, rw = scale.bar(end, min(cp.retry_at, scale.open_end))
        yield (
            f'<rect class="tl-retry-wait" x="{_n(rx)}" y="{_bar_y(y) + 3}" width="{_n(rw)}" '
            f'height="{BAR_HEIGHT - 6}"/>'
        )
    yield (
        f'<rect class="tl-bar {classes}{flags}" {geometry} rx="2">'
        f"{_tip(_facts(cp, start, end, scale))}</rect>"
    )
    if cp.attempts > 1:
        yield f'<rect class="tl-hatch" {geometry} fill="url(#{prefix}-hatch)"/>'
    if cp.retry_at is not None and cp.status in (
        CheckpointStatus.RETRYING,
        CheckpointStatus.STARTED,
    ):
        what = (
            "retry"
            if cp.status is CheckpointStatus.RETRYING
            else ("timer" if cp.kind in _WAITS else "timeout")
        )
        yield _marker(cp.retry_at, y, scale, what)


def _marker(moment: float, y: int, scale: _Scale, what: str) -> str:
    """A due time: a tick in its row, or an arrow at the right edge when it is past the axis."""
    names = {"retry": "next attempt due", "timer": "deadline", "timeout": "attempt timeout"}
    tip = _tip([f"{names[what]} {_when(moment)} ({_relative(moment, scale.now)})"])
    top, bottom = y + 2, y + ROW_HEIGHT - 2
    if moment > scale.end:
        edge = PLOT_X + PLOT_WIDTH
        return (
            f'<path class="tl-marker tl-{what} tl-beyond" d="M{edge - 7} {top} L{edge} {y + 11} '
            f'L{edge - 7} {bottom} Z">{tip}</path>'
        )
    x = _n(scale.x(moment))
    return (
        f'<line class="tl-marker tl-{what}" x1="{x}" y1="{top}" x2="{x}" y2="{bottom}" '
        f'stroke="#8a5a00" stroke-width="2">{tip}</line>'
    )


def _link(
    cp: Checkpoint, y: int, kids: dict[str, RunInfo], asked: dict[str, Approval], scale: _Scale
) -> tuple[str | None, str | None]:
    """The row's link and the span of what it points at (a child's life, an approval's wait for
    its decision), when the caller gave that child or approval."""
    if cp.kind in ("child", "join"):
        child = kids.get(_child_id(cp) or "") if cp.kind == "child" else _joined(cp, kids)
        if child is None:
            return None, None
        end = child.finished_at.timestamp() if child.finished_at else scale.open_end
        lines = [
            f"child run {child.id}",
            f"workflow {child.workflow}",
            f"status {child.status}",
            f"created {_when(child.created_at.timestamp())}",
            _lasted(child.created_at.timestamp(), end, child.finished_at is None),
        ]
        span = cp.kind == "child"  # the join's own bar already is the wait for it
        shown = _span(child.created_at.timestamp(), end, y, cp, scale, child.status, lines)
        return f"/runs/{quote(child.id, safe='')}", shown if span else None
    if cp.kind in ("approval", "approval-wait"):
        step = cp.name if cp.kind == "approval" else cp.name.removesuffix(":wait")
        found = asked.get(step)
        if found is None:
            return None, None
        href = f"/approvals/{quote(found.id, safe='')}"
        if cp.kind != "approval":
            return href, None
        created = found.created_at.timestamp()
        decided = found.decision.decided_at if found.decision else None
        if decided is not None:
            end = decided.timestamp()
        elif found.status in ("pending", "expired"):
            end = min(scale.open_end, found.expires_at.timestamp())
        else:
            return href, None  # closed without a decision: nothing to draw but the request
        lines = [
            f"approval {found.id}",
            f"title {found.title}",
            f"status {found.status}",
            f"asked {_when(created)}",
            f"expires {_when(found.expires_at.timestamp())}",
            _lasted(created, end, decided is None and found.status == "pending"),
        ]
        return href, _span(created, end, y, cp, scale, found.status, lines)
    return None, None


def _span(
    start: float, end: float, y: int, cp: Checkpoint, scale: _Scale, status: str, lines: list[str]
) -> str:
    """What a child or approval row points at, over its life: a band behind the row's own bar."""
    x, width = scale.bar(start, end)
    return (
        f'<rect class="tl-span {_group(cp.kind)} tl-s-{_token(status)}" x="{_n(x)}" '
        f'y="{y + 2}" width="{_n(width)}" height="{ROW_HEIGHT - 4}" rx="3">'
        f"{_tip(lines)}</rect>"
    )


def _label(name: str, y: int) -> Iterator[str]:
    """The name, cut to LABEL_CHARS in a viewport that clips it, its spelled-out characters in
    their own <tspan> (marked like the inbox's hidden-char); the full name in its tooltip."""
    shown, used = [], 0
    for piece, special in _pieces(name):
        room = LABEL_CHARS - used
        if len(piece) > room:  # cut here; a spelled-out character is kept whole or not at all
            shown.append(("" if special else _esc(piece[: room - 1])) + "\u2026")
            break
        used += len(piece)
        shown.append(
            f'<tspan class="tl-hidden-char">{_esc(piece)}</tspan>' if special else _esc(piece)
        )
    yield (
        f'<svg class="tl-label-box" x="{LABEL_X}" y="{y}" width="{LABEL_WIDTH}" '
        f'height="{ROW_HEIGHT}"><text class="tl-label" x="0" y="15">{"".join(shown)}'
        f"{_tip([name])}</text></svg>"
    )


# -- tooltips ----------------------------------------------------------------------------------


def _facts(cp: Checkpoint, start: float | None, end: float | None, scale: _Scale) -> list[str]:
    """A checkpoint's tooltip: name, kind, status, position, start, duration, attempts."""
    lines = [cp.name, f"{cp.kind} \u00b7 {cp.status}", f"position {cp.at}"]
    if start is not None and end is not None:
        lines.append(f"started {_when(start)} (+{_duration(start - scale.start)})")
        opened = cp.finished_at is None and cp.status is CheckpointStatus.STARTED
        lines.append(_lasted(start, end, opened and scale.live))
        if opened and not scale.live:
            lines.append("no end recorded: the run ended first")
    if cp.attempts > 1:
        lines.append(f"attempts {cp.attempts} (the times are the last attempt's)")
    elif cp.attempts == 1:
        lines.append("attempts 1")
    return lines


def _lasted(start: float, end: float, running: bool) -> str:
    return f"running for {_duration(end - start)}" if running else f"took {_duration(end - start)}"


def _relative(moment: float, now: float) -> str:
    return f"in {_duration(moment - now)}" if moment >= now else f"{_duration(now - moment)} ago"


def _tip(lines: list[str]) -> str:
    """A <title> tooltip: one line per fact, each spelled out so that none can forge a line."""
    return f"<title>{chr(10).join(_esc(_clip(line, TITLE_CHARS)) for line in lines)}</title>"


# -- text --------------------------------------------------------------------------------------


def _pieces(text: str) -> list[tuple[str, bool]]:
    """tether.text.pieces, with line breaks and what XML cannot hold spelled out too."""
    out: list[tuple[str, bool]] = []
    for piece, special in pieces(text):
        if special:
            out.append((piece, True))
            continue
        for part in _BREAK.split(_NOT_XML.sub(lambda m: code(m.group()), piece)):
            if part:
                out.append((_BREAKS.get(part, part), part in _BREAKS))
    return out


def _clip(text: str, limit: int) -> str:
    """`text` spelled out on one line (tether.text), XML-safe, at most `limit` characters."""
    spelled = "".join(piece for piece, _ in _pieces(text))
    return spelled if len(spelled) <= limit else spelled[: limit - 1] + "\u2026"


def _esc(text: str) -> str:
    """Spelled out (a no-op on text already spelled) and escaped, for element text and
    attribute values alike (quotes included)."""
    return escape("".join(piece for piece, _ in _pieces(text)), quote=True)


def _token(text: str) -> str:
    """A stored word (kind, status) as a class name: nothing but a-z, 0-9 and '-'."""
    return re.sub(r"[^a-z0-9-]", "-", str(text).lower())[:40] or "other"


def _group(kind: str) -> str:
    if kind in _WORK:
        return "tl-work"
    if kind in _WAITS:
        return "tl-wait"
    if kind in ("child", "approval"):
        return f"tl-{kind}"
    return "tl-record"  # now, uuid4, value, patch...: instants recorded for replay


def _child_id(cp: Checkpoint) -> str | None:
    """The id a child checkpoint recorded (its result: the id as JSON), or None."""
    if cp.status is not CheckpointStatus.COMPLETED or cp.result is None:
        return None
    try:
        value = json.loads(cp.result)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _joined(cp: Checkpoint, kids: dict[str, RunInfo]) -> RunInfo | None:
    """The child a completed join waited for: the one whose end its result records."""
    try:
        value = json.loads(cp.result or "")
    except ValueError:
        return None
    key = value.get("key") if isinstance(value, dict) else None
    return next((c for i, c in kids.items() if child_key(i) == key), None)


def _when(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f} \u00b5s"
    if seconds < 1:
        return f"{_plain(round(seconds * 1000, 1))} ms"
    if seconds < 60:
        return f"{_plain(round(seconds, 2))} s"
    return _compound(seconds, 1.0, parts=2)


def _compound(seconds: float, base: float, parts: int = 3) -> str:
    """`seconds` in days, hours, minutes and seconds down to `base`: "1 d 12 h", "2 min 5 s"."""
    rest, out, taken = round(seconds / base) * base, [], 0
    for unit, name in _UNITS:
        if unit < base or taken >= parts:
            break
        count, rest = divmod(rest, unit)
        taken += 1 if count or taken else 0  # `parts` units from the first that counts
        if count:
            out.append(f"{int(count)} {name}")
    return " ".join(out) or "0"


def _plain(value: float) -> str:
    """A number without float noise or trailing zeros: 0.25, 1.5, 300."""
    return f"{round(value, 6):.6f}".rstrip("0").rstrip(".")


def _n(value: float) -> str:
    """A coordinate, to the hundredth (deterministic text, no float noise)."""
    return _plain(round(value, 2))


def _bar_y(row_y: int) -> int:
    return row_y + (ROW_HEIGHT - BAR_HEIGHT) // 2

"""Figures the fault suite measures (counts of faults injected, runs lost, rows corrupt...),
collected while it runs and printed at the end of the session (see conftest.py), so the suite's
output is its own report. Tests call record(); nothing here decides pass or fail."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

_FIGURES: dict[str, list[float]] = defaultdict(list)


def record(name: str, value: float) -> None:
    """Add a measurement under `name` (e.g. "power loss: acknowledged checkpoints lost")."""
    _FIGURES[name].append(float(value))


def recorded() -> dict[str, list[float]]:
    """This process's measurements, by name (a pytest-xdist worker sends them to its controller)."""
    return dict(_FIGURES)


def merged(each: Iterable[Mapping[str, list[float]]]) -> dict[str, list[float]]:
    """Several processes' measurements as one (the controller's, of its workers')."""
    out: dict[str, list[float]] = defaultdict(list)
    for figures in each:
        for name, values in figures.items():
            out[name].extend(values)
    return out


def lines(figures: Mapping[str, list[float]] | None = None) -> list[str]:
    """The summary's lines for `figures` (by default, this process's own)."""
    figures = _FIGURES if figures is None else figures
    out = []
    for name in sorted(figures):
        values = figures[name]
        total = sum(values)
        shown = int(total) if total.is_integer() else round(total, 3)
        out.append(f"{name}: {shown} (over {len(values)} measurement{'s' * (len(values) != 1)})")
    return out

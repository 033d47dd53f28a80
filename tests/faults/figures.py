"""Figures the fault suite measures (counts of faults injected, runs lost, rows corrupt...),
collected while it runs and printed at the end of the session (see conftest.py), so the suite's
output is its own report. Tests call record(); nothing here decides pass or fail."""

from __future__ import annotations

from collections import defaultdict

_FIGURES: dict[str, list[float]] = defaultdict(list)


def record(name: str, value: float) -> None:
    """Add a measurement under `name` (e.g. "power loss: acknowledged checkpoints lost")."""
    _FIGURES[name].append(float(value))


def lines() -> list[str]:
    out = []
    for name in sorted(_FIGURES):
        values = _FIGURES[name]
        total = sum(values)
        shown = int(total) if total.is_integer() else round(total, 3)
        out.append(f"{name}: {shown} (over {len(values)} measurement{'s' * (len(values) != 1)})")
    return out

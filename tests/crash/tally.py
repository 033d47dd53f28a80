"""The crash tests' tally (tests/crash/conftest.py): counters per backend, summed over a session,
and its lines in the session's summary. Under pytest-xdist each worker process counts its own
and the controller shows their sum (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .matrix import BACKENDS

COUNTERS = ("crash_points", "lost_runs", "duplicate_completions", "slowest_recovery_ms")
Tally = dict[str, dict[str, int]]  # backend -> counter -> value


def new_tally() -> Tally:
    return {backend: dict.fromkeys(COUNTERS, 0) for backend in BACKENDS}


def summed(tallies: Iterable[Mapping[str, Mapping[str, int]]]) -> Tally:
    """One tally of several (workers'): counts added, the slowest recovery the slowest."""
    total = new_tally()
    for tally in tallies:
        for backend, counters in tally.items():
            into = total[backend]
            for counter, value in counters.items():
                slowest = counter == "slowest_recovery_ms"
                into[counter] = max(into[counter], value) if slowest else into[counter] + value
    return total


def lines(tally: Mapping[str, Mapping[str, int]]) -> list[str]:
    """The summary's lines (bench/reliability_report.py reads them); none when nothing ran."""

    def total(counter: str) -> int:
        return sum(tally[b][counter] for b in tally)

    def each(counter: str) -> str:  # every backend, so a skipped one shows as 0
        return ", ".join(f"{b} {tally[b][counter]}" for b in tally)

    if not total("crash_points"):
        return []
    return [
        f"crash points tried: {total('crash_points')} ({each('crash_points')}), "
        f"lost runs: {total('lost_runs')}, "
        f"duplicate step completions: {total('duplicate_completions')}",
        f"slowest recovery (process start to exit): {each('slowest_recovery_ms')} ms",
    ]

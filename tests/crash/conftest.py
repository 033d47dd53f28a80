"""The crash tests' tally, printed once at the end of the session from what the tests did."""

from __future__ import annotations

from typing import Any

import pytest

TALLY = {"crash_points": 0, "lost_runs": 0, "duplicate_completions": 0, "slowest_recovery_ms": 0}


@pytest.fixture
def crash_tally() -> dict[str, int]:
    """Counters the crash tests add to: processes killed, runs not finished by the next process,
    step bodies that ran again after their completion was recorded (and extra charge effects),
    and the longest a recovering process took to finish the run."""
    return TALLY


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TALLY["crash_points"]:
        terminalreporter.write_line(
            f"crash points tried: {TALLY['crash_points']}, lost runs: {TALLY['lost_runs']}, "
            f"duplicate step completions: {TALLY['duplicate_completions']}"
        )
        terminalreporter.write_line(
            f"slowest recovery (process start to exit): {TALLY['slowest_recovery_ms']} ms"
        )

"""The fault suite's session report: every figure recorded through tests.faults.figures is
printed at the end, under a heading, whether the tests passed or not."""

from __future__ import annotations

import pytest
from tests.faults import figures


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # a pytest-xdist worker: the controller shows them (tests/conftest.py)
        output["fault_figures"] = figures.recorded()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    shown = figures.lines()
    if shown:
        terminalreporter.section("fault suite figures")
        for line in shown:
            terminalreporter.write_line(line)

"""The crash tests' database per test, on each backend, and their tally, printed once at the end
of the session from what the tests did, per backend."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.postgres_server import with_schema

from .backends import drop_schema
from .children import warm_bytecode_cache
from .matrix import BACKENDS
from .tally import lines, new_tally

TALLY = new_tally()


@pytest.fixture(scope="session", autouse=True)
def bytecode_cache() -> None:
    """The children's bytecode, compiled before the first test (children.py)."""
    warm_bytecode_cache()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend of the test's database. Tests that run only a subset of their cases on
    PostgreSQL parametrize `backend` themselves (matrix.on_backends), which overrides this."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database for the test: a SQLite file in tmp_path, or a schema of its own in the
    session's PostgreSQL (tests/conftest.py: skipped loudly without one, failed in CI)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'tether.db'}"
        return
    url = with_schema(request.getfixturevalue("postgres_url"), f"t_{uuid.uuid4().hex[:12]}")
    yield url
    with contextlib.suppress(Exception):  # tidiness only: the server is thrown away anyway
        drop_schema(url)


@pytest.fixture
def crash_tally(backend: str) -> dict[str, int]:
    """Counters the crash tests add to, for the test's backend: processes killed, runs not
    finished by the next process, step bodies that ran again after their completion was
    recorded (and extra charge effects), and the longest a recovering process took to finish
    the run."""
    return TALLY[backend]


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # a pytest-xdist worker: the controller shows the sum, tests/conftest.py
        output["crash_tally"] = TALLY


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in lines(TALLY):
        terminalreporter.write_line(line)

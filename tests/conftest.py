"""Shared fixtures: an App on every backend, in normal and in forced-replay mode, a `store`
once per backend (the contract tests' and the store-level tests'), a throwaway PostgreSQL
server for the session (one per process: make test runs the suite on two, pytest-xdist's);
and for the browser tests (tests/server/, tests/test_notifiers.py) `browser`, headless
Chromium through Playwright, and `screenshots`, the folder their screenshots go to."""

from __future__ import annotations

import compileall
import dataclasses
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from tests.crash import tally
from tests.faults import figures
from tests.postgres_server import postgres_server, with_schema

import tether
from tether.store import store_from_url
from tether.store.memory import MemoryStore
from tether.store.port import Store
from tether.store.postgres import PostgresStore
from tether.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from playwright.async_api import Browser

# (backend, forced replay): forced replay restarts the workflow from the store after every new
# checkpoint, so every test using `make_app` also proves its workflow replays deterministically.
MODES = [
    ("memory", False), ("sqlite", False), ("postgres", False),
    ("memory", True), ("sqlite", True),
]  # fmt: skip


CHROMIUM = "/usr/bin/chromium"
# The machine has no network: no first-run, sync, component or QUIC traffic.
CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
SCREENSHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile Tether's sources once: the many processes the tests start (workers killed and
    restarted, the CLI) then load them compiled, where PYTHONDONTWRITEBYTECODE would have each
    compile them again (0.15 s or so a process)."""
    compileall.compile_dir(Path(__file__).parent.parent / "src" / "tether", quiet=1)


def _encodable(value: object) -> object:
    """`value` with every string made UTF-8 encodable (a lone surrogate as its escape)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_encodable(key): _encodable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_encodable(item) for item in value)
    return value


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(
    config: pytest.Config, report: pytest.TestReport
) -> Generator[None, dict[str, object], dict[str, object]]:
    """Reports cross to pytest-xdist's controller as UTF-8: the hostile-text tests capture lone
    surrogates (in logs, in assertion messages), which would kill the worker that sends them."""
    data = yield
    return cast(dict[str, object], _encodable(data))


# What each pytest-xdist worker measured (the crash tally, the fault figures: the conftest.py of
# tests/crash and tests/faults), sent as it ends: the controller's summary shows the sum.
FROM_WORKERS: dict[str, list[Any]] = {"crash_tally": [], "fault_figures": []}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    output = getattr(node, "workeroutput", {})
    for key, found in FROM_WORKERS.items():
        if key in output:
            found.append(output[key])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    shown = figures.lines(figures.merged(FROM_WORKERS["fault_figures"]))
    if shown:
        terminalreporter.section("fault suite figures")
        for line in shown:
            terminalreporter.write_line(line)
    for line in tally.lines(tally.summed(FROM_WORKERS["crash_tally"])):
        terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _no_stored_credential(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI reads a token from $TETHER_TOKEN or the user's credentials file: a developer's
    own must never reach a test."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))
    monkeypatch.delenv("TETHER_TOKEN", raising=False)


@pytest.fixture(autouse=True)
def _fence_fails_the_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A worker in the test's own process whose fence acts (keepalive.Fence: leases running
    out under an at-most-once body) would end the test process, and with it every test that
    process had left, silently under pytest-xdist ("node down"). Here it fails the test that
    let it happen instead, saying so; tests of the fence itself patch `_exit` again, and
    worker processes a test starts end for real."""
    from tether.core import keepalive

    fired: list[str] = []
    monkeypatch.setattr(keepalive, "_exit", lambda: fired.append("fence"))
    yield
    if fired:
        pytest.fail(
            "a worker of this test's process was fail-stopped by its fence (its leases ran "
            "out while an at-most-once step body ran): see the CRITICAL log line above"
        )


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL database for the session: $TETHER_TEST_POSTGRES_URL, or a cluster started
    here from the server binaries. Without either, PostgreSQL tests skip loudly; in CI
    (CI=true) that is a failure, since CI must test both backends."""
    with postgres_server() as url:
        if url is None:
            message = (
                "NO POSTGRESQL: set TETHER_TEST_POSTGRES_URL or install the PostgreSQL server "
                "binaries (initdb, pg_ctl); PostgreSQL tests are skipped"
            )
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(message)
            pytest.skip(message)
        yield url


@pytest.fixture
async def postgres_store(postgres_url: str) -> AsyncIterator[PostgresStore]:
    """An open PostgresStore in a schema of its own, for the tests of PostgreSQL's driver."""
    backend = PostgresStore(with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}"))
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """Headless Chromium (/usr/bin/chromium) through Playwright, closed after the test.
    Without it, browser tests skip loudly; in CI (CI=true) that is a failure."""
    if shutil.which(CHROMIUM) is None:
        message = f"NO CHROMIUM at {CHROMIUM}: install Debian's `chromium`; browser tests skipped"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """Where screenshots go: artifacts/screenshots/ of the repository when TETHER_SCREENSHOTS
    is set (CI keeps them), else tmp_path/screenshots; the folder exists."""
    folder = SCREENSHOTS if os.environ.get("TETHER_SCREENSHOTS") else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(params=MODES, ids=[f"{b}{'-replay' if r else ''}" for b, r in MODES])
def mode(request: pytest.FixtureRequest) -> tuple[str, bool]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def make_store(
    mode: tuple[str, bool], tmp_path: Path, request: pytest.FixtureRequest
) -> Callable[[], Store]:
    """A store factory; every call gives another handle on the same database."""
    shared = MemoryStore()

    if mode[0] == "postgres":
        url = with_schema(request.getfixturevalue("postgres_url"), f"t_{uuid.uuid4().hex[:12]}")

    def make() -> Store:
        if mode[0] == "memory":
            return shared
        if mode[0] == "postgres":
            return PostgresStore(url)
        return SqliteStore(f"sqlite:///{tmp_path}/tether.db")

    return make


@pytest.fixture
async def make_app(
    mode: tuple[str, bool], make_store: Callable[[], Store]
) -> AsyncIterator[Callable[..., tether.App]]:
    """An App factory on the test's database; Apps made here are closed after the test."""
    made: list[tether.App] = []

    def make(**kwargs: object) -> tether.App:
        app = tether.App(store=make_store(), force_replay=mode[1], **kwargs)  # type: ignore[arg-type]
        # Waits over 50 ms release the run, so durable delays are exercised without slow tests.
        app.engine.settings = dataclasses.replace(
            app.engine.settings, inline_wait_max=0.05, poll_interval=0.05
        )
        made.append(app)
        return app

    yield make
    for app in made:
        await app.close()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """An open Store, once per backend (PostgreSQL in a schema of its own)."""
    backend: Store
    if request.param == "memory":
        backend = MemoryStore()
    elif request.param == "sqlite":
        backend = store_from_url(f"sqlite:///{tmp_path}/store.db")
    else:
        url = request.getfixturevalue("postgres_url")
        backend = store_from_url(with_schema(url, f"t_{uuid.uuid4().hex[:12]}"))
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()

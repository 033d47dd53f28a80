"""Shared fixtures: an App on every backend, in normal and in forced-replay mode."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

import tether
from tether.store.base import Store
from tether.store.memory import MemoryStore
from tether.store.sqlite import SqliteStore

# (backend, forced replay): forced replay restarts the workflow from the store after every new
# checkpoint, so every test using `make_app` also proves its workflow replays deterministically.
MODES = [("memory", False), ("sqlite", False), ("memory", True), ("sqlite", True)]


@pytest.fixture(params=MODES, ids=[f"{b}{'-replay' if r else ''}" for b, r in MODES])
def mode(request: pytest.FixtureRequest) -> tuple[str, bool]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def make_store(mode: tuple[str, bool], tmp_path: Path) -> Callable[[], Store]:
    """A store factory; every call gives another handle on the same database."""
    shared = MemoryStore()

    def make() -> Store:
        if mode[0] == "memory":
            return shared
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

"""The `store` fixture: every contract test runs once per backend."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tether.store import store_from_url
from tether.store.base import Store
from tether.store.memory import MemoryStore

# PostgreSQL joins this list later (skipped when no test database URL is configured).
BACKENDS = ["memory", "sqlite"]


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    backend: Store
    if request.param == "memory":
        backend = MemoryStore()
    else:
        try:
            importlib.import_module("tether.store.sqlite")
        except ImportError:
            pytest.skip("sqlite backend not written yet")
        backend = store_from_url(f"sqlite:///{tmp_path}/contract.db")
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()

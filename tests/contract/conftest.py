"""The `store` fixture: every contract test runs once per backend."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.postgres_server import with_schema

from tether.store import store_from_url
from tether.store.base import Store
from tether.store.memory import MemoryStore

BACKENDS = ["memory", "sqlite", "postgres"]


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    backend: Store
    if request.param == "memory":
        backend = MemoryStore()
    elif request.param == "sqlite":
        backend = store_from_url(f"sqlite:///{tmp_path}/contract.db")
    else:
        url = request.getfixturevalue("postgres_url")
        backend = store_from_url(with_schema(url, f"t_{uuid.uuid4().hex[:12]}"))
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()

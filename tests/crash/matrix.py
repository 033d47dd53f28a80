"""Which crash cases run on which backend.

Every case runs on SQLite. On PostgreSQL, tests run all their cases (the `backend` fixture of
conftest.py, over both backends) unless they choose a subset with `on_backends`: the child
processes cost more there (psycopg's import, a listener round when an App closes), and the whole
crash suite must stay within its time budget. Cases left out on PostgreSQL are named in the test
modules, beside the `on_backends` call, with the reason; $CRASH_POSTGRES_ALL=1 runs them all
there too (about a minute more).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from typing import Any

import pytest

BACKENDS = ("sqlite", "postgres")


def on_backends(cases: Mapping[str, Any], postgres: Collection[str] | None = None) -> list[Any]:
    """pytest params for `("backend", <the case's argnames>)`: every case of `cases` (id: its
    name; its value the arguments, a tuple being several) on SQLite, and those named in
    `postgres` (by default, or with $CRASH_POSTGRES_ALL=1, all) on PostgreSQL. Ids read
    "<backend>-<case>", as the `backend` fixture's do."""
    unknown = set(postgres or ()) - set(cases)
    assert not unknown, f"no such cases: {sorted(unknown)}"
    everything = postgres is None or os.environ.get("CRASH_POSTGRES_ALL") == "1"
    chosen = cases.keys() if everything else set(postgres or ())
    params = []
    for backend in BACKENDS:
        for name, value in cases.items():
            if backend == "sqlite" or name in chosen:
                args = value if isinstance(value, tuple) else (value,)
                params.append(pytest.param(backend, *args, id=f"{backend}-{name}"))
    return params

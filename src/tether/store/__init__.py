"""Backends behind the Store port, chosen by URL; this module only maps a URL to a backend.

It imports a backend lazily, so `import tether` never pays for a database driver it does not use.
"""

from __future__ import annotations

import os

from tether.errors import ConfigurationError
from tether.store.port import Store

DEFAULT_URL = "sqlite:///tether.db"


def default_url() -> str:
    return os.environ.get("TETHER_DATABASE_URL") or DEFAULT_URL


def store_from_url(url: str) -> Store:
    """A backend for `url`: sqlite:///relative.db, sqlite:////absolute.db, memory://."""
    if url.startswith("memory:"):
        from tether.store.memory import MemoryStore

        return MemoryStore()
    if url.startswith("sqlite:"):
        from tether.store.sqlite import SqliteStore

        return SqliteStore(url)
    if url.startswith(("postgresql:", "postgres:")):
        try:
            from tether.store.postgres import PostgresStore
        except ImportError as exc:
            raise ConfigurationError(
                f"the PostgreSQL backend needs psycopg: pip install 'tether[postgres]' ({exc})"
            ) from None
        return PostgresStore(url)
    raise ConfigurationError(
        f"unknown database URL {url!r}: use sqlite:///path/to/file.db, "
        f"postgresql://user@host/db or memory://"
    )


def database_exists(url: str) -> bool:
    """Whether the database at `url` exists already (inspection commands must not create one).
    Servers (PostgreSQL) are taken to exist; connecting tells."""
    if url.startswith("sqlite:"):
        from pathlib import Path

        from tether.store.drivers.sqlite import parse_sqlite_url

        return Path(parse_sqlite_url(url)[0]).exists()
    return True

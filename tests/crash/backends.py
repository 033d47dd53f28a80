"""The databases the crash tests run on, named by URL: a SQLite file or a PostgreSQL schema.

Imported by the child processes too (flows.py, wait_flows.py), so it needs no pytest. A bare path
(a `Path`, or a string without a URL scheme) is a SQLite file, as the crash tests always took.
`ro_query` reads the database beside the library, read-only, with the same SQL on both backends
(`?` placeholders; for PostgreSQL they become `%s`).
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any


def database_url(db: str | Path) -> str:
    """`db` as a database URL: a URL as given, a path as the URL of that SQLite file."""
    text = str(db)
    if isinstance(db, Path) or "://" not in text:
        return f"sqlite:///{Path(db).resolve()}"
    return text


def backend_of(url: str) -> str:
    """ "sqlite" or "postgres"."""
    return "sqlite" if url.startswith("sqlite:") else "postgres"


def ro_query(db: str | Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """A read-only query of the database, beside the library (mailboxes, child rows): through
    sqlite3 on the file opened read-only, or through psycopg in a read-only transaction in the
    URL's schema. Rows as tuples on both."""
    url = database_url(db)
    if backend_of(url) == "sqlite":
        from tether.store.drivers.sqlite import parse_sqlite_url

        path = parse_sqlite_url(url)[0]
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            return conn.execute(sql, args).fetchall()
    import psycopg

    from tether.store.postgres import parse_postgres_url

    conninfo, schema = parse_postgres_url(url)
    with psycopg.connect(conninfo) as conn:
        conn.read_only = True
        if schema is not None:
            conn.execute(f'SET search_path TO "{schema}"')
        rows = conn.execute(sql.replace("?", "%s"), args).fetchall()
        conn.rollback()
        return rows


def drop_schema(url: str) -> None:
    """Remove the schema of a PostgreSQL URL with everything in it (a test's leftovers)."""
    import psycopg

    from tether.store.postgres import parse_postgres_url

    conninfo, schema = parse_postgres_url(url)
    if schema is None:
        return
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

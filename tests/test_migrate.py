"""Schema versions between code and database: a schema newer than the code is refused at open,
`tether migrate` applies the migrations and exits, and a process opening with
`migrate=false` checks the schema without changing it, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from tests.postgres_server import with_schema

import tether
from tether.cli import cli
from tether.store import sqlite as sqlite_backend
from tether.store.drivers.postgres.options import postgres_options
from tether.store.drivers.sqlite.commit import CommitQueue, sqlite_migrates
from tether.store.postgres import PostgresStore

FUTURE = 9999  # a migration no Tether has yet


def tether_migrate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["migrate", *args], env={"TETHER_DATABASE_URL": None})
    return result.exit_code, result.output


async def migrated(*args: str) -> tuple[int, str]:
    """`tether migrate` from an async test: the command runs its own event loop."""
    return await asyncio.to_thread(tether_migrate, *args)


def versions(path: Path) -> set[int]:
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT version FROM tether_migrations")}


def queue(path: Path, *, migrate: bool) -> CommitQueue:
    return CommitQueue(str(path), "FULL", sqlite_backend._QUERIES.migrations, migrate=migrate)


# -- SQLite --------------------------------------------------------------------------------


async def test_a_sqlite_file_migrated_by_a_newer_tether_is_refused_at_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.db"
    assert (await migrated("-d", f"sqlite:///{path}"))[0] == 0
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO tether_migrations VALUES (?, 0)", (FUTURE,))
    app = tether.App(f"sqlite:///{path}")
    with pytest.raises(tether.ConfigurationError, match=rf"\[{FUTURE}\].*upgrade Tether"):
        await app.open()
    await app.close()
    assert FUTURE in versions(path)  # refused, not rolled back or "repaired"


def test_tether_migrate_applies_every_migration_to_a_new_sqlite_file_and_exits(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.db"
    code, output = tether_migrate("-d", f"sqlite:///{path}")
    assert code == 0, output
    assert "is current" in output
    assert versions(path) == {0} | {v for v, _ in sqlite_backend._QUERIES.migrations}
    assert tether_migrate("-d", f"sqlite:///{path}")[0] == 0  # again: nothing to do


def test_tether_migrate_refuses_a_schema_newer_than_the_code_with_a_clear_message(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.db"
    tether_migrate("-d", f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO tether_migrations VALUES (?, 0)", (FUTURE,))
    code, output = tether_migrate("-d", f"sqlite:///{path}")
    assert code != 0
    assert f"{FUTURE}" in output
    assert "upgrade Tether" in output
    assert "Traceback" not in output


def test_tether_migrate_refuses_a_url_that_says_migrate_false(tmp_path: Path) -> None:
    code, output = tether_migrate("-d", f"sqlite:///{tmp_path}/t.db?migrate=false")
    assert code == 2
    assert "migrate=false" in output
    assert not (tmp_path / "t.db").exists()


async def test_opening_an_old_sqlite_schema_without_migrating_names_tether_migrate(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.db"
    old = queue(path, migrate=True)
    old._migrations = [m for m in old._migrations if m[0] == 1]  # a file of the first release
    await old.open()
    await old.close()
    before = versions(path)
    with pytest.raises(tether.ConfigurationError, match="tether migrate"):
        await queue(path, migrate=False).open()
    assert versions(path) == before  # nothing was applied


async def test_opening_a_current_sqlite_schema_without_migrating_works_and_changes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.db"
    assert (await migrated("-d", f"sqlite:///{path}"))[0] == 0
    before = versions(path)
    opened = queue(path, migrate=False)
    await opened.open()
    await opened.close()
    assert versions(path) == before
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO tether_migrations VALUES (?, 0)", (FUTURE,))
    with pytest.raises(tether.ConfigurationError, match=rf"\[{FUTURE}\]"):
        await queue(path, migrate=False).open()


def test_the_migrate_option_of_a_sqlite_url_is_true_unless_it_says_false() -> None:
    assert sqlite_migrates("sqlite:///t.db")
    assert sqlite_migrates("sqlite:///t.db?migrate=TRUE")
    assert not sqlite_migrates("sqlite:///t.db?synchronous=OFF&migrate=false")
    with pytest.raises(tether.ConfigurationError, match="migrate=true or false"):
        sqlite_migrates("sqlite:///t.db?migrate=no")


# -- PostgreSQL ----------------------------------------------------------------------------


def test_the_migrate_option_of_a_postgres_url_is_taken_off_before_libpq() -> None:
    options = postgres_options("postgresql://u@h/db?migrate=false&sslmode=require")
    assert options.migrate is False
    assert "migrate" not in options.conninfo
    assert "sslmode=require" in options.conninfo
    assert postgres_options("postgresql://u@h/db").migrate is True
    with pytest.raises(tether.ConfigurationError, match="migrate=true or false"):
        postgres_options("postgresql://u@h/db?migrate=0")


def fresh(postgres_url: str) -> tuple[str, str]:
    schema = f"m_{uuid.uuid4().hex[:12]}"
    return with_schema(postgres_url, schema), schema


async def test_a_postgres_schema_migrated_by_a_newer_tether_is_refused_at_open(
    postgres_url: str,
) -> None:
    url, schema = fresh(postgres_url)
    assert (await migrated("-d", url))[0] == 0
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'INSERT INTO "{schema}".tether_migrations VALUES (%s, 0)', (FUTURE,))
    store = PostgresStore(url)
    with pytest.raises(tether.ConfigurationError, match=rf"\[{FUTURE}\].*upgrade Tether"):
        await store.open()
    await store.close()
    code, output = await migrated("-d", url)
    assert code != 0
    assert "upgrade Tether" in output


async def test_a_postgres_role_without_ddl_rights_opens_with_migrate_false_after_tether_migrate(
    postgres_url: str,
) -> None:
    url, schema = fresh(postgres_url)
    with pytest.raises(tether.ConfigurationError, match="tether migrate"):
        await PostgresStore(f"{url}&migrate=false").open()
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # nothing was created
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        assert found.fetchone() is None

    code, output = await migrated("-d", url)
    assert code == 0, output
    # A runtime role that may read and write rows but never create anything.
    role = f"r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
        conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO {role}')
        conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" '
                     f"TO {role}")  # fmt: skip
        conn.execute(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO {role}')
        conn.execute(f'REVOKE CREATE ON SCHEMA "{schema}" FROM {role}')
    info = psycopg.conninfo.conninfo_to_dict(postgres_url)
    info.update(user=role, password="pw")
    as_role = with_schema(f"postgresql://{role}:pw@{info.get('host', 'localhost')}:"
                          f"{info.get('port', 5432)}/{info['dbname']}", schema)  # fmt: skip
    denied = PostgresStore(as_role)
    with pytest.raises(tether.StoreUnavailable):
        await denied.open()  # migrating needs rights this role lacks
    await denied.close()

    app = tether.App(store=PostgresStore(f"{as_role}&migrate=false"))

    @app.workflow()
    async def hello(name: str) -> str:
        return f"hello {name}"

    async with app:
        handle = await app.start(hello, "ada")
        assert await handle.result(timeout=20) == "hello ada"


def test_a_sqlite_url_that_says_migrate_false_opens_only_a_migrated_file(
    tmp_path: Path,
) -> None:
    """The URL option reaches the store: a new file is refused naming `tether migrate`, and
    the same file opens once it was migrated."""
    url = f"sqlite:///{tmp_path}/app.db"

    async def open_without_migrating() -> None:
        store = sqlite_backend.SqliteStore(f"{url}?migrate=false")
        await store.open()
        await store.close()

    with pytest.raises(tether.ConfigurationError, match="tether migrate"):
        asyncio.run(open_without_migrating())
    code, output = tether_migrate("-d", url)
    assert code == 0, output
    asyncio.run(open_without_migrating())

"""Schema migrations: an older database upgrades in place and keeps its runs; migrating is
idempotent and safe to race; the schema built by migrations is the expected one."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from tests.postgres_server import with_schema

import tether
from tether.store import sqlite as sqlite_backend
from tether.store.port import NewRun, RunStatus
from tether.store.postgres import PostgresStore
from tether.store.sqlite import SqliteStore

EXPECTED_SQLITE_TABLES = {
    "tether_migrations", "tether_runs", "tether_checkpoints", "tether_workers", "tether_events",
    "tether_approvals", "tether_approval_audit", "tether_stream_entries",
    "tether_outbox", "tether_schedules", "tether_values", "tether_forks", "tether_secrets",
    "tether_sessions",
    "tether_actions",
}  # fmt: skip
# 0: the file's versions are numbered like PostgreSQL's (the same files in both dialects).
SQLITE_VERSIONS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
POSTGRES_VERSIONS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
GOLDEN = Path(__file__).parent / "golden"


async def test_a_database_made_by_the_first_migration_upgrades_and_keeps_its_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    first_only = [m for m in sqlite_backend._QUERIES.migrations if m[0] == 1]
    monkeypatch.setattr(sqlite_backend._QUERIES, "migrations", first_only)
    old = SqliteStore(f"sqlite:///{path}")
    await old.open()
    await old.close()
    with sqlite3.connect(path) as conn:  # a run as version 1 wrote it
        conn.execute(
            "INSERT INTO tether_runs (id, workflow, status, args, created_at, updated_at) "
            "VALUES ('kept', 'wf', 'pending', '{\"args\": [], \"kwargs\": {}}', 1.0, 1.0)"
        )
        columns = {r[1] for r in conn.execute("PRAGMA table_info(tether_runs)")}
    assert "queue" not in columns  # really the old schema
    monkeypatch.undo()

    app = tether.App(f"sqlite:///{path}")

    @app.workflow()
    async def wf() -> str:
        await tether.sleep_until(tether.now())
        return "done"

    async with app:
        assert await (await app.get("kept")).result(timeout=10) == "done"
    with sqlite3.connect(path) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM tether_migrations")]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        started_by = conn.execute("SELECT started_by FROM tether_runs WHERE id = 'kept'")
        assert started_by.fetchone() == (None,)  # the column v4 added, empty for old runs
    assert versions == SQLITE_VERSIONS
    assert tables >= EXPECTED_SQLITE_TABLES


async def test_opening_the_same_sqlite_database_from_many_stores_at_once_migrates_once(
    tmp_path: Path,
) -> None:
    stores = [SqliteStore(f"sqlite:///{tmp_path}/race.db") for _ in range(5)]
    await asyncio.gather(*(s.open() for s in stores))
    await asyncio.gather(*(s.close() for s in stores))
    with sqlite3.connect(tmp_path / "race.db") as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM tether_migrations")]
    assert versions == SQLITE_VERSIONS


async def test_postgres_migrations_are_idempotent_and_safe_to_race(postgres_url: str) -> None:
    url = with_schema(postgres_url, "t_migrations_race")
    stores = [PostgresStore(url) for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    _, created = await stores[0].create_run(NewRun("r", "wf", "{}"), 1.0)
    assert created
    await asyncio.gather(*(s.close() for s in stores))
    again = PostgresStore(url)
    await again.open()
    kept = await again.get_run("r")
    await again.close()
    assert kept is not None
    assert kept.status is RunStatus.PENDING


async def test_a_postgres_database_made_by_the_first_migration_upgrades_and_keeps_its_runs(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tether.store import postgres as postgres_backend

    url = with_schema(postgres_url, "t_migrations_upgrade")
    monkeypatch.setattr(
        postgres_backend._QUERIES,
        "migrations",
        [m for m in postgres_backend._QUERIES.migrations if m[0] == 1],
    )
    old = PostgresStore(url)
    await old.open()
    await old.close()
    monkeypatch.undo()
    import psycopg

    conninfo, _ = postgres_backend.parse_postgres_url(url)
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        await conn.execute("SET search_path TO t_migrations_upgrade")
        await conn.execute(
            "INSERT INTO tether_runs (id, workflow, status, args, created_at, updated_at) "
            "VALUES ('kept', 'wf', 'pending', '{}', 1.0, 1.0)"
        )
        await conn.commit()
    new = PostgresStore(url)
    await new.open()
    kept = await new.get_run("kept")
    claimed = await new.claim_runs("w", ["wf"], 2.0, 30.0, 5)
    await new.close()
    assert kept is not None
    assert (kept.queue, kept.priority, kept.started_by, kept.failures) == (None, 0, None, 0)
    assert [r.id for r in claimed] == ["kept"]


# -- a database of an earlier version, with runs in flight ----------------------------------


def _legacy_app(
    url: str, ran: list[tuple[int, int]]
) -> tuple[tether.App, tether.Workflow[..., int]]:
    """The workflows of tests/golden/make_legacy.py, as today's code registers them."""
    app = tether.App(url)

    @app.step()
    async def add(x: int, y: int) -> int:
        ran.append((x, y))
        return x + y

    @app.workflow()
    async def legacy(x: int) -> int:
        a = await add(x, 1)
        b = await add(a, 2)
        got = await tether.wait_for_event("go", timeout=timedelta(days=365))
        return await add(b, int(got))

    @app.workflow()
    async def finished(x: int) -> int:
        return await add(x, 10)

    return app, legacy


async def _continues(url: str) -> None:
    ran: list[tuple[int, int]] = []
    app, _ = _legacy_app(url, ran)
    async with app:
        done = await app.get("legacy-done")
        assert await done.result(timeout=10) == 15  # kept as recorded
        await app.send("legacy-waiting", "go", 1000)
        assert await (await app.get("legacy-waiting")).result(timeout=10) == 1004
        fresh = await app.start("legacy", 5, id="new-run")
        await app.send("new-run", "go", 0)
        assert await fresh.result(timeout=10) == 8
    # The waiting run replayed its two recorded steps and ran only the one after the event.
    assert ran == [(4, 1000), (5, 1), (6, 2), (8, 0)]


async def test_a_sqlite_database_of_an_earlier_version_opens_and_continues_its_runs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "legacy.db"
    with sqlite3.connect(path) as conn:
        conn.executescript((GOLDEN / "legacy_2dfcbfc.sqlite.sql").read_text())
        before = [r[0] for r in conn.execute("SELECT version FROM tether_migrations")]
    assert before == list(range(1, 13))  # its own numbering: the mailboxes were 2
    await _continues(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM tether_migrations")]
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert versions == SQLITE_VERSIONS


async def test_a_postgres_database_of_an_earlier_version_opens_and_continues_its_runs(
    postgres_url: str,
) -> None:
    import psycopg

    from tether.store.postgres import parse_postgres_url

    schema = "t_migrations_legacy"
    url = with_schema(postgres_url, schema)
    conninfo, _ = parse_postgres_url(url)
    dump = (GOLDEN / "legacy_2dfcbfc.postgres.sql").read_text().replace("{schema}", schema)
    script = "\n".join(line for line in dump.splitlines() if not line.startswith("\\"))
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.execute(script.encode())
    await _continues(url)
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        cur = await conn.execute(f"SELECT version FROM {schema}.tether_migrations ORDER BY 1")
        versions = [r[0] for r in await cur.fetchall()]
    assert versions == POSTGRES_VERSIONS

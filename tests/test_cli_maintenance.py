"""`tether gc` and `tether status` against real SQLite files: sizes and counts, a dry run that
deletes nothing, a gc that deletes what ended long ago and keeps the rest, the App's retention
with --app, and errors that say what to do."""

from __future__ import annotations

import asyncio
import json
import textwrap
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import tether
from tether.cli import cli
from tether.testing import FakeClock

ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TETHER_DATABASE_URL": None}


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env=ENV, catch_exceptions=False)


async def make_runs(url: str) -> None:
    """Two runs that ended in 2020, one that ended now, and one still waiting."""
    for clock in (FakeClock(datetime(2020, 1, 1, tzinfo=UTC)), None):
        app = tether.App(url, clock=clock)

        @app.step()
        async def payload(i: int) -> str:
            return "x" * 20_000

        @app.workflow()
        async def work(n: int) -> int:
            for i in range(n):
                await payload(i)
            return n

        @app.workflow()
        async def waits() -> object:
            return await tether.wait_for_event("go")

        async with app:
            if clock is not None:
                for run_id in ("old-1", "old-2"):
                    await (await app.start(work, 10, id=run_id)).result(timeout=10)
            else:
                await (await app.start(work, 1, id="young")).result(timeout=10)
                await app.start(waits, id="waiting")


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/cli.db"
    asyncio.run(make_runs(url))
    return url


def rows_of(doc: dict[str, object]) -> dict[str, int]:
    return {t["name"]: t["rows"] for t in doc["tables"]}  # type: ignore[attr-defined]


def test_status_shows_sizes_tables_and_runs_by_status(db: str) -> None:
    result = invoke("status", "--database", db, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["backend"] == "sqlite"
    assert doc["auto_vacuum"] == "incremental"
    assert doc["database_bytes"] > 0
    assert doc["wal_bytes"] is not None
    assert rows_of(doc)["tether_checkpoints"] == 21
    assert rows_of(doc)["tether_runs"] == 4
    assert doc["runs"]["succeeded"] == 3
    assert doc["retention"] is None
    text = invoke("status", "--database", db)
    assert text.exit_code == 0, text.output
    assert "tether_checkpoints" in text.output
    assert "auto_vacuum" in text.output
    assert "pass --app MODULE:APP" in text.output


def test_gc_dry_run_counts_and_deletes_nothing(db: str) -> None:
    before = rows_of(json.loads(invoke("status", "-d", db, "--json").output))
    result = invoke("gc", "-d", db, "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["dry_run"] is True
    assert doc["deleted"] == {"tether_checkpoints": 20, "tether_runs": 2}
    assert rows_of(json.loads(invoke("status", "-d", db, "--json").output)) == before


def test_gc_deletes_what_ended_long_ago_and_keeps_the_rest(db: str) -> None:
    result = invoke("gc", "-d", db, "--runs", "30d")
    assert result.exit_code == 0, result.output
    assert "tether_checkpoints" in result.output
    assert "22 rows" in result.output
    assert "gave back" in result.output
    doc = json.loads(invoke("status", "-d", db, "--json").output)
    assert rows_of(doc)["tether_runs"] == 2  # young and waiting
    assert rows_of(doc)["tether_checkpoints"] == 1
    again = json.loads(invoke("gc", "-d", db, "--json").output)
    assert again["total"] == 0


def test_gc_vacuum_reports_the_bytes_the_file_gave_back(db: str) -> None:
    result = invoke("gc", "-d", db, "--vacuum", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["vacuumed"] is True
    assert doc["bytes_freed"] > 0


def test_gc_uses_the_apps_retention_with_app(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"keeps_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(f"""
        from datetime import timedelta
        import tether
        app = tether.App({db!r}, retention=tether.Retention(runs=timedelta(days=5000),
                                                            audit=timedelta(days=6000)))
    """)
    )
    monkeypatch.chdir(tmp_path)
    kept = json.loads(invoke("gc", "--app", f"{name}:app", "--json").output)
    assert kept["total"] == 0  # 2020 is less than 5000 days ago
    shown = invoke("status", "--app", f"{name}:app")
    assert "runs 5000d" in shown.output
    assert "audit 6000d" in shown.output
    overridden = json.loads(invoke("gc", "--app", f"{name}:app", "--runs", "1d", "--json").output)
    assert overridden["deleted"]["tether_runs"] == 2


def test_gc_explains_a_bad_duration_and_a_policy_that_makes_no_sense(db: str) -> None:
    bad = invoke("gc", "-d", db, "--runs", "1x")
    assert bad.exit_code == 2
    assert "is not a duration" in bad.output
    assert "30d" in bad.output
    senseless = invoke("gc", "-d", db, "--runs", "10d", "--audit", "2d")
    assert senseless.exit_code == 1
    assert "audit trail is kept longest" in senseless.output
    assert "Traceback" not in senseless.output


def test_gc_and_status_refuse_a_database_that_does_not_exist(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path}/nothing.db"
    for command in ("gc", "status"):
        result = invoke(command, "-d", missing)
        assert result.exit_code == 1
        assert "no database at" in result.output
    assert not (tmp_path / "nothing.db").exists()

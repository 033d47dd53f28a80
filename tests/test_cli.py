"""The `tether` command line against a real SQLite file: listing and showing runs, errors
without tracebacks, help text everywhere, and a worker process that runs and stops on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

import tether
from tether.cli import cli

ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TETHER_DATABASE_URL": None}


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env=ENV, catch_exceptions=False)


async def make_runs(url: str) -> None:
    app = tether.App(url)

    @app.step()
    async def inc(x: int) -> int:
        return x + 1

    @app.step(retry=tether.NO_RETRY)
    async def explode(x: int) -> int:
        raise ValueError(f"boom at {x}\nsecond line")

    @app.workflow()
    async def count(n: int) -> int:
        x = 0
        for _ in range(n):
            x = await inc(x)
        return x

    @app.workflow()
    async def doomed() -> int:
        result: int = await explode(await inc(0))  # @app.step(...) loses the return type
        return result

    async with app:
        assert await (await app.start(count, 2, id="ok-run")).result(timeout=10) == 2
        with pytest.raises(tether.RunFailed):
            await (await app.start(doomed, id="bad-run")).result(timeout=10)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A database holding one succeeded run (ok-run) and one failed run (bad-run)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('cli')}/t.db"
    asyncio.run(make_runs(url))
    return url


def test_runs_list_shows_each_run_with_status_attempt_and_error_type(db: str) -> None:
    result = invoke("runs", "--database", db, "list")
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines()[1:] if line.strip()}
    assert set(lines) == {"ok-run", "bad-run"}
    assert lines["ok-run"].split()[1:4] == ["count", "succeeded", "1"]
    assert lines["bad-run"].split()[1:4] == ["doomed", "failed", "1"]
    assert lines["bad-run"].split()[-1] == "ValueError"
    assert "ValueError" not in lines["ok-run"]


def test_runs_list_json_is_an_array_with_stable_keys(db: str) -> None:
    result = invoke("runs", "--database", db, "list", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["id"]: row for row in json.loads(result.output)}
    assert set(rows) == {"ok-run", "bad-run"}
    keys = {"id", "workflow", "status", "attempt", "owner", "created_at", "updated_at",
            "finished_at", "error_type", "error_message"}  # fmt: skip
    assert all(set(row) == keys for row in rows.values())
    assert rows["ok-run"]["status"] == "succeeded"
    assert rows["ok-run"]["error_type"] is None
    assert rows["bad-run"]["error_type"] == "ValueError"
    assert rows["bad-run"]["attempt"] == 1


def test_runs_list_filters_by_status_and_by_workflow(db: str) -> None:
    table = invoke("runs", "--database", db, "list", "--status", "failed")
    assert table.exit_code == 0
    assert "bad-run" in table.output
    assert "ok-run" not in table.output
    as_json = invoke("runs", "--database", db, "list", "--status", "failed", "--json")
    assert [row["id"] for row in json.loads(as_json.output)] == ["bad-run"]
    by_workflow = invoke("runs", "--database", db, "list", "--workflow", "count", "--json")
    assert [row["id"] for row in json.loads(by_workflow.output)] == ["ok-run"]
    none = invoke("runs", "--database", db, "list", "--status", "cancelled")
    assert none.exit_code == 0
    assert "no runs" in none.output


def test_runs_list_rejects_an_unknown_status_with_a_usage_error(db: str) -> None:
    result = invoke("runs", "--database", db, "list", "--status", "done")
    assert result.exit_code == 2
    assert "succeeded" in result.output  # the valid choices are listed


def test_runs_show_lists_the_steps_in_order_with_attempts_and_the_result(db: str) -> None:
    result = invoke("runs", "--database", db, "show", "ok-run")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "ok-run" in out
    assert "succeeded" in out
    steps = [line.split() for line in out.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert [s[:5] for s in steps] == [
        ["0", "inc", "step", "completed", "1"],
        ["1", "inc#2", "step", "completed", "1"],
    ]
    assert out.rstrip().splitlines()[-2:] == ["result", "2"]


def test_runs_show_of_a_failed_run_names_the_failed_step_and_the_error(db: str) -> None:
    result = invoke("runs", "--database", db, "show", "bad-run")
    assert result.exit_code == 0, result.output
    step = next(line.split() for line in result.output.splitlines() if " explode " in line)
    assert step[:5] == ["1", "explode", "step", "failed", "1"]
    assert step[-4:] == ["ValueError:", "boom", "at", "1"]  # the message's first line only
    assert "error ValueError: boom at 1" in result.output


def test_runs_show_json_holds_the_run_and_its_checkpoints(db: str) -> None:
    ok = json.loads(invoke("runs", "--database", db, "show", "ok-run", "--json").output)
    assert ok["id"] == "ok-run"
    assert ok["status"] == "succeeded"
    assert ok["result"] == 2
    assert ok["error"] is None
    steps = [
        (c["seq"], c["name"], c["status"], c["attempts"], c["result"]) for c in ok["checkpoints"]
    ]
    assert steps == [(0, "inc", "completed", 1, 1), (1, "inc#2", "completed", 1, 2)]
    assert all(c["duration_ms"] >= 0 for c in ok["checkpoints"])
    bad = json.loads(invoke("runs", "--database", db, "show", "bad-run", "--json").output)
    assert bad["status"] == "failed"
    assert bad["result"] is None
    assert bad["error"]["type"] == "ValueError"
    assert bad["error"]["message"] == "boom at 1\nsecond line"
    assert bad["checkpoints"][1]["error"]["type"] == "ValueError"


def test_an_unknown_run_id_exits_1_with_an_error_naming_the_id(db: str) -> None:
    result = invoke("runs", "--database", db, "show", "no-such-run")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert "no-such-run" in result.stderr
    assert "Traceback" not in result.output


def test_a_bad_database_url_exits_1_naming_the_url() -> None:
    result = invoke("runs", "--database", "mysql://x/y", "list")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert "mysql://x/y" in result.stderr


def test_inspecting_a_database_that_does_not_exist_says_so_and_creates_nothing(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "nowhere.db"
    result = invoke("runs", "--database", f"sqlite:///{missing}", "list")
    assert result.exit_code == 1
    assert "no database at" in result.stderr
    assert not missing.exists()


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """tmp_path as the current directory; modules imported from it are forgotten afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("cli_app_module", "expected module:attribute"),
        ("cli_app_module:", "expected module:attribute"),
        ("no_such_module_xyz:app", "no module named 'no_such_module_xyz'"),
        ("cli_app_module:missing", "has no attribute 'missing'"),
        ("cli_app_module:not_an_app", "it is int, not a tether.App"),
    ],
)
@pytest.mark.parametrize("command", [["runs", "--app", "{}", "list"], ["worker", "{}"]])
def test_a_bad_module_app_string_exits_1_saying_what_is_wrong_and_the_form(
    module_dir: Path, ref: str, says: str, command: list[str]
) -> None:
    (module_dir / "cli_app_module.py").write_text("not_an_app = 3\n")
    result = invoke(*(part.format(ref) for part in command))
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert says in result.stderr
    assert "module:attribute" in result.stderr
    assert "Traceback" not in result.output


@dataclass
class Point:
    x: int
    y: int


def test_runs_with_app_uses_its_database_and_decodes_results_by_type_hints(
    module_dir: Path,
) -> None:
    url = f"sqlite:///{module_dir}/points.db"
    (module_dir / "cli_points.py").write_text(
        textwrap.dedent(f"""
        from dataclasses import dataclass
        import tether

        app = tether.App({url!r})

        @dataclass
        class Point:
            x: int
            y: int

        @app.workflow()
        async def where() -> Point:
            return Point(1, 2)
    """)
    )

    async def make() -> None:
        app = tether.App(url)

        @app.workflow()
        async def where() -> Point:
            return Point(1, 2)

        async with app:
            await (await app.start(where, id="p1")).result(timeout=10)

    asyncio.run(make())
    typed = invoke("runs", "--app", "cli_points:app", "show", "p1")
    assert typed.exit_code == 0, typed.output
    assert "Point(x=1, y=2)" in typed.output
    untyped = invoke("runs", "--database", url, "show", "p1")
    assert "{'x': 1, 'y': 2}" in untyped.output
    listed = invoke("runs", "--app", "cli_points:app", "list", "--json")
    assert [row["id"] for row in json.loads(listed.output)] == ["p1"]


def walk(command: click.Command, path: list[str]) -> Iterator[tuple[list[str], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from walk(sub, [*path, name])


def test_every_command_and_option_has_help_text_and_help_exits_0() -> None:
    seen = []
    for path, command in walk(cli, []):
        seen.append(" ".join(path))
        assert (command.help or "").strip(), f"`tether {' '.join(path)}` has no help"
        for param in command.params:
            if isinstance(param, click.Option):
                assert (param.help or "").strip(), f"{param.opts} of {path} has no help"
        result = invoke(*path, "--help")
        assert result.exit_code == 0, result.output
        assert "Usage:" in result.output
    assert set(seen) >= {"", "runs", "runs list", "runs show", "worker"}


WORKER_MODULE = """
import tether

app = tether.App({url!r})

@app.step()
async def shout(name: str) -> str:
    return name.upper()

@app.workflow()
async def greet(name: str) -> str:
    return "hello " + await shout(name)
"""


def test_worker_runs_a_pending_run_and_exits_0_promptly_on_sigterm(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/w.db"
    (tmp_path / "cli_worker_mod.py").write_text(WORKER_MODULE.format(url=url))

    async def start_pending() -> None:
        app = tether.App(url)

        @app.workflow()
        async def greet(name: str) -> str:
            raise AssertionError("this App has no worker")

        await app.start(greet, "ada", id="w1")
        assert await (await app.get("w1")).status() == tether.RunStatus.PENDING
        await app.close()

    async def wait_for_result() -> str:
        app = tether.App(url)
        try:
            return str(await (await app.get("w1")).result(timeout=20))
        finally:
            await app.close()

    asyncio.run(start_pending())
    command = [sys.executable, "-m", "tether", "worker", "cli_worker_mod:app", "-c", "4"]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert asyncio.run(wait_for_result()) == "hello ADA"
        proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        out, err = proc.communicate(timeout=10)
        assert time.monotonic() - began < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    started, stopped = out.strip().splitlines()
    assert started.startswith("tether worker ")
    assert url in started
    assert "workflows: greet" in started
    assert "concurrency 4" in started
    assert stopped.endswith("stopped")

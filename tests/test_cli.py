"""The `tether` command line against a real SQLite file: listing and showing runs, errors
without tracebacks, help text everywhere, and a worker process that runs and stops on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import re
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
from tether.store.port import Lease, NewRun, RunStatus
from tether.store.sqlite import SqliteStore

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
    keys = {"id", "workflow", "status", "attempt", "failures", "owner", "created_at",
            "updated_at", "finished_at", "error_type", "error_message", "forked_from",
            "diverged_at"}  # fmt: skip
    assert all(set(row) == keys for row in rows.values())
    assert rows["ok-run"]["status"] == "succeeded"
    assert rows["ok-run"]["error_type"] is None
    assert rows["bad-run"]["error_type"] == "ValueError"
    assert rows["bad-run"]["attempt"] == 1
    assert rows["bad-run"]["failures"] == 0  # its own code failed it: not a failed execution


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


FLOW_MODULE = """
import tether

app = tether.App({url!r})

@app.step()
async def a() -> str:
    return "a"

@app.step()
async def b() -> str:
    return "b"

@app.workflow()
async def flow() -> str:
    first = await {first}()
    return first + await {second}()
"""


@pytest.fixture
def flow_modules(module_dir: Path) -> str:
    """flow_v1 (steps a then b) with one run of it, r1, completed; flow_v2 calls b then a."""
    url = f"sqlite:///{module_dir}/flows.db"
    for name, first, second in [("flow_v1", "a", "b"), ("flow_v2", "b", "a")]:
        text = FLOW_MODULE.format(url=url, first=first, second=second)
        (module_dir / f"{name}.py").write_text(text)
    sys.path.insert(0, str(module_dir))
    v1 = importlib.import_module("flow_v1")

    async def run() -> None:
        async with v1.app:
            assert await (await v1.app.start(v1.flow, id="r1")).result(timeout=10) == "ab"

    asyncio.run(run())
    return url


def test_replay_check_names_the_diverging_run_where_it_differs_and_exits_1(
    flow_modules: str,
) -> None:
    result = invoke("replay-check", "flow_v2:app", "--all")  # r1 has finished
    assert result.exit_code == 1, result.output
    rows = [line.split() for line in result.output.splitlines() if line.split()[:1] == ["r1"]]
    assert rows == [["r1", "flow", "0", "a", "b"]]
    assert result.output.splitlines()[-1] == "1 runs checked, 1 diverge"


def test_replay_check_of_code_that_still_replays_exits_0(flow_modules: str) -> None:
    result = invoke("replay-check", "flow_v1:app", "--all")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "1 runs checked, 0 diverge"
    as_json = invoke("replay-check", "flow_v1:app", "--json", "--all")
    assert as_json.exit_code == 0
    assert json.loads(as_json.output) == {"checked": 1, "diverging": []}


def test_replay_check_json_lists_each_diverging_run_with_the_message(flow_modules: str) -> None:
    result = invoke("replay-check", "flow_v2:app", "--json", "--all")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert doc["checked"] == 1
    [row] = doc["diverging"]
    message = row.pop("message")
    assert row == {"run_id": "r1", "workflow": "flow", "position": "0", "recorded": "a",
                   "requested": "b"}  # fmt: skip
    assert "no longer replays" in message


def test_replay_check_filters_runs_by_workflow_and_status(flow_modules: str) -> None:
    other = invoke("replay-check", "flow_v2:app", "--workflow", "other", "--json", "--all")
    assert other.exit_code == 0
    assert json.loads(other.output) == {"checked": 0, "diverging": []}
    failed = invoke("replay-check", "flow_v2:app", "--status", "failed")
    assert failed.exit_code == 0
    assert "0 runs checked" in failed.output


def test_replay_check_of_a_run_whose_workflow_is_gone_says_so(
    module_dir: Path, flow_modules: str
) -> None:
    (module_dir / "flow_gone.py").write_text(f"import tether\napp = tether.App({flow_modules!r})\n")
    result = invoke("replay-check", "flow_gone:app", "--all")
    assert result.exit_code == 1
    assert "does not register" in result.output
    assert result.output.splitlines()[-1] == "1 runs checked, 1 diverge"


def test_replay_check_checks_every_unfinished_run_however_old_and_finished_ones_on_request(
    flow_modules: str,
) -> None:
    """The deploy gate: an old run still waiting is checked whatever came after it; finished
    runs (r1 here) only with --all."""
    store = SqliteStore(flow_modules)

    async def add_runs() -> None:
        await store.open()
        args = '{"args": [], "kwargs": {}}'
        await store.create_run(NewRun("old-waiting", "flow", args, wake_at=1e12), 1.0)
        for i in range(250):  # more than a page of newer runs, all finished
            await store.create_run(NewRun(f"new-{i}", "flow", args), 10.0 + i, owner="w",
                                   lease_until=1e12)  # fmt: skip
            await store.finish_run(Lease(f"new-{i}", "w", 1), RunStatus.SUCCEEDED, '"ab"',
                                   None, 11.0 + i)  # fmt: skip
        await store.close()

    asyncio.run(add_runs())
    unfinished = json.loads(invoke("replay-check", "flow_v2:app", "--json").output)
    assert unfinished == {"checked": 1, "diverging": []}  # old-waiting: nothing recorded yet
    everything = json.loads(invoke("replay-check", "flow_v2:app", "--json", "--all").output)
    assert everything["checked"] == 252
    assert [row["run_id"] for row in everything["diverging"]] == ["r1"]
    limited = json.loads(invoke("replay-check", "flow_v1:app", "--json", "--all", "-n", "7").output)
    assert limited == {"checked": 7, "diverging": []}


def test_replay_check_of_an_app_whose_database_does_not_exist_exits_1(module_dir: Path) -> None:
    missing = module_dir / "none.db"
    (module_dir / "flow_new.py").write_text(
        FLOW_MODULE.format(url=f"sqlite:///{missing}", first="a", second="b")
    )
    result = invoke("replay-check", "flow_new:app")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: no database at")
    assert not missing.exists()


def event_app(url: str) -> tuple[tether.App, tether.Workflow[[], object]]:
    app = tether.App(url)

    @app.workflow()
    async def wait_go() -> object:
        return await tether.wait_for_event("go")

    return app, wait_go


def test_events_send_delivers_a_json_payload_that_the_waiting_run_returns(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/ev.db"

    async def start_pending() -> None:
        app, wait_go = event_app(url)
        await app.start(wait_go, id="e1")  # no worker: the run stays pending
        await app.close()

    async def work() -> object:
        app, _ = event_app(url)
        async with app:
            return await (await app.get("e1")).result(timeout=10)

    asyncio.run(start_pending())
    result = invoke("events", "--database", url, "send", "e1", "go", '{"x": 1}')
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "sent event 'go' to run 'e1'"
    assert asyncio.run(work()) == {"x": 1}
    finished = invoke("events", "--database", url, "send", "e1", "go")
    assert finished.exit_code == 1
    assert finished.stderr.startswith("error: ")
    assert "has finished (succeeded)" in finished.stderr
    assert "not stored" in finished.stderr


def test_events_send_to_an_unknown_run_exits_1_naming_the_id(db: str) -> None:
    result = invoke("events", "--database", db, "send", "no-such-run", "go", "1")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert "no-such-run" in result.stderr


@pytest.mark.parametrize("payload", ["{x: 1}", "hello", ""])
def test_events_send_with_a_payload_that_is_not_json_says_how_to_quote_it(
    db: str, payload: str
) -> None:
    result = invoke("events", "--database", db, "send", "ok-run", "go", payload)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: PAYLOAD must be JSON")
    assert "'{\"x\": 1}'" in result.stderr  # an example quoted for the shell


def test_events_send_to_a_database_that_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.db"
    result = invoke("events", "--database", f"sqlite:///{missing}", "send", "r", "go")
    assert result.exit_code == 1
    assert "no database at" in result.stderr
    assert not missing.exists()


def test_runs_cancel_of_a_pending_run_cancels_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/c.db"

    async def start_pending() -> None:
        app, wait_go = event_app(url)
        await app.start(wait_go, id="c1")
        await app.close()

    asyncio.run(start_pending())
    result = invoke("runs", "--database", url, "cancel", "c1")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "run 'c1': cancelled"
    shown = json.loads(invoke("runs", "--database", url, "show", "c1", "--json").output)
    assert shown["status"] == "cancelled"
    again = invoke("runs", "--database", url, "cancel", "c1")
    assert again.exit_code == 0
    assert "already finished" in again.output


def test_runs_cancel_of_a_run_a_worker_holds_requests_the_cancel(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/held.db"
    app = tether.App(url)
    release = asyncio.Event()

    @app.step()
    async def block() -> None:
        await release.wait()

    @app.workflow()
    async def held() -> None:
        await block()

    async def main() -> Result:
        async with app:
            handle = await app.start(held, id="h1")
            while await handle.status() is not tether.RunStatus.RUNNING:
                await asyncio.sleep(0.01)
            # Another process's view: the CLI's own App, on its own loop, in a thread.
            result = await asyncio.to_thread(invoke, "runs", "--database", url, "cancel", "h1")
            release.set()
            with contextlib.suppress(tether.RunCancelled):
                await handle.result(timeout=10)
            return result

    result = asyncio.run(main())
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "run 'h1': running (cancel requested)"


def test_runs_cancel_of_an_unknown_run_exits_1_naming_the_id(db: str) -> None:
    result = invoke("runs", "--database", db, "cancel", "no-such-run")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert "no-such-run" in result.stderr


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
    assert set(seen) >= {"", "runs", "runs list", "runs show", "runs cancel", "events",
                         "events send", "replay-check", "worker", "approvals", "approvals list",
                         "approvals show", "approvals approve", "approvals reject",
                         "approvals history", "approvals verify", "runs resume", "users",
                         "users add", "users list", "users revoke", "serve"}  # fmt: skip


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


@pytest.mark.serial  # bounds the stop on SIGTERM (under 5 s)
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


def test_users_are_added_with_a_token_shown_once_listed_without_it_and_revoked(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/users.db"
    added = invoke("users", "--database", url, "add", "alice", "--group", "sre")
    assert added.exit_code == 0, added.output
    token = added.stdout.strip().splitlines()[-1]
    assert token.startswith("tt_")
    listed = invoke("users", "--database", url, "list", "--json")
    assert json.loads(listed.stdout) == [{"name": "alice", "groups": ["sre"], "active": True,
                                          "created_at": json.loads(listed.stdout)[0]["created_at"],
                                          "revoked_at": None}]  # fmt: skip
    assert token not in listed.stdout
    again = invoke("users", "--database", url, "add", "alice")
    assert again.exit_code == 1
    assert "revoke it first" in again.output
    revoked = invoke("users", "--database", url, "revoke", "alice")
    assert revoked.exit_code == 0
    assert "alice revoked" in revoked.stdout
    app = tether.App(url)

    async def check() -> object:
        try:
            from tether.users import authenticate

            await app.open()
            return await authenticate(app.engine, token)
        finally:
            await app.close()

    assert asyncio.run(check()) is None
    unknown = invoke("users", "--database", url, "revoke", "bob")
    assert unknown.exit_code == 1
    assert "no user is named 'bob'" in unknown.output


def test_a_failed_run_is_resumed_from_the_command_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/resume.db"
    app = tether.App(url)
    flag = tmp_path / "fixed"

    @app.step(retry=tether.NO_RETRY)
    async def flaky() -> str:
        if not flag.exists():
            raise RuntimeError("not yet")
        return "ok"

    @app.workflow()
    async def once() -> str:
        return await flaky()

    async def first() -> None:
        async with app:
            with contextlib.suppress(tether.RunFailed):
                await (await app.start(once, id="r1")).result(timeout=10)

    asyncio.run(first())
    not_failed = invoke("runs", "--database", url, "resume", "nope")
    assert not_failed.exit_code == 1
    flag.write_text("yes")
    resumed = invoke("runs", "--database", url, "resume", "r1")
    assert resumed.exit_code == 0, resumed.output
    assert "pending" in resumed.stdout

    async def finish() -> str:
        async with app:
            return str(await (await app.get("r1")).result(timeout=10))

    assert asyncio.run(finish()) == "ok"
    again = invoke("runs", "--database", url, "resume", "r1")
    assert again.exit_code == 1
    assert "only a failed, dead or held run can be resumed" in again.output


def test_serve_without_the_server_extra_says_which_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "plainapp.py").write_text(
        f"import tether\napp = tether.App('sqlite:///{tmp_path}/t.db')\n"
    )
    monkeypatch.chdir(tmp_path)
    for name in ("uvicorn", "fastapi", "starlette"):  # as if the [server] extra were missing
        monkeypatch.setitem(sys.modules, name, None)  # type: ignore[arg-type]
    result = CliRunner().invoke(cli, ["serve", "plainapp:app"], env=ENV)
    assert result.exit_code == 1, result.output
    assert re.search(
        r"`tether serve` needs the 'server' extra \((uvicorn|fastapi|starlette)\S* is "
        r"not installed\): ",
        result.output,
    ), result.output
    assert "pip install 'tether[server]'" in result.output
    assert "Traceback" not in result.output


def test_a_missing_module_that_is_no_extra_of_tethers_is_not_blamed_on_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "brokenapp.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["worker", "brokenapp:app"], env=ENV)
    assert isinstance(result.exception, ModuleNotFoundError), result.output
    assert "extra" not in result.output


@pytest.mark.parametrize(
    "where",
    [
        ["-d", "{db}", "runs", "list", "--json"],  # at the top
        ["runs", "-d", "{db}", "list", "--json"],  # after the group
        ["runs", "list", "--json", "-d", "{db}"],  # after the subcommand
        ["runs", "list", "--json", "--database", "{db}"],
        ["--database", "{db}", "runs", "show", "ok-run", "--json"],
        ["runs", "show", "ok-run", "-d", "{db}", "--json"],
        ["-d", "{db}", "status", "--json"],
    ],
)
def test_the_database_option_is_taken_before_and_after_the_subcommand(
    db: str, where: list[str], tmp_path: Path
) -> None:
    args = [db if a == "{db}" else a for a in where]
    result = CliRunner().invoke(
        cli, args, env={**ENV, "TETHER_DATABASE_URL": f"sqlite:///{tmp_path}/none.db"}
    )
    assert result.exit_code == 0, result.output
    assert "ok-run" in result.output or '"runs"' in result.output, result.output


def test_a_database_option_after_the_subcommand_wins_over_the_one_before(
    db: str, tmp_path: Path
) -> None:
    elsewhere = f"sqlite:///{tmp_path}/none.db"
    result = invoke("-d", elsewhere, "runs", "-d", elsewhere, "list", "--json", "-d", db)
    assert result.exit_code == 0, result.output
    assert {r["id"] for r in json.loads(result.output)} == {"ok-run", "bad-run"}
    missing = invoke("runs", "-d", db, "list", "-d", elsewhere)
    assert missing.exit_code != 0
    assert "no database at" in missing.output


def test_cancel_resume_send_and_users_print_json_when_asked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/j.db"

    async def start_pending() -> None:
        app, wait_go = event_app(url)
        await app.start(wait_go, id="j1")
        await app.start(wait_go, id="j2")
        await app.close()

    asyncio.run(start_pending())
    sent = invoke("events", "-d", url, "send", "j2", "go", '{"n": 1}', "--json")
    assert sent.exit_code == 0, sent.output
    assert json.loads(sent.stdout) == {"run": "j2", "key": "go", "sent": True}
    cancelled = invoke("runs", "-d", url, "cancel", "j1", "--json")
    assert cancelled.exit_code == 0, cancelled.output
    assert json.loads(cancelled.stdout) == {
        "id": "j1", "status": "cancelled", "before": "pending", "cancel_requested": False
    }  # fmt: skip
    resumed = invoke("runs", "-d", url, "resume", "j1", "--json")
    assert resumed.exit_code != 0  # a cancelled run is not resumed: the error stays text
    assert "Traceback" not in resumed.output
    added = invoke("users", "-d", url, "add", "ann", "-g", "sre", "--json")
    assert added.exit_code == 0, added.output
    user = json.loads(added.stdout)
    assert (user["name"], user["groups"], user["active"]) == ("ann", ["sre"], True)
    assert user["token"].startswith("tt_")
    revoked = invoke("users", "-d", url, "revoke", "ann", "--json")
    assert json.loads(revoked.stdout)["active"] is False


def test_resume_prints_json_when_asked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/r.db"
    asyncio.run(make_runs(url))
    resumed = invoke("runs", "resume", "bad-run", "--json", "-d", url)
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout) == {"id": "bad-run", "status": "pending"}


def test_serve_public_url_reaches_the_apps_notifiers_and_is_the_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mailapp.py").write_text(
        "import tether\n"
        f"app = tether.App('sqlite:///{tmp_path}/t.db', notifiers=[tether.SlackNotifier("
        "'https://hooks.example.invalid/T0/B0/secret')])\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TETHER_PUBLIC_URL", "")  # whatever serve sets is undone after the test
    monkeypatch.delenv("TETHER_PUBLIC_URL")
    seen: dict[str, object] = {}

    async def fake_run_server(app: tether.App, *args: object, **kwargs: object) -> None:
        seen["origins"] = kwargs["origins"]
        seen["link"] = app.engine.notifiers[0].public_url  # type: ignore[attr-defined]

    monkeypatch.setattr(sys.modules["tether.cli.serve"], "run_server", fake_run_server)
    bad = CliRunner().invoke(cli, ["serve", "mailapp:app", "--public-url", "ftp://x"], env=ENV)
    assert bad.exit_code == 2
    assert "not an http(s) address of a host" in bad.output
    assert "TETHER_PUBLIC_URL" not in os.environ
    good = CliRunner().invoke(
        cli, ["serve", "mailapp:app", "--public-url", "https://tether.example.com/"], env=ENV
    )
    assert good.exit_code == 0, good.output
    assert seen == {"origins": ("https://tether.example.com",),
                    "link": "https://tether.example.com"}  # fmt: skip

"""Starting runs by name, from a process without the workflow's code, for a worker that has it;
and the arguments of a registered workflow checked at start, before anything is written."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.crash.backends import drop_schema
from tests.crash.children import ROOT, child_env
from tests.postgres_server import with_schema

import tether
from tether.cli import cli
from tether.core.workflow import Named
from tether.errors import ConfigurationError, IdempotencyConflict, RunFailed
from tether.store.port import RunStatus

# The worker's code: the starting process (the test) never imports it.
WORKER_CODE = """
import dataclasses
import tether

app = tether.App()

@dataclasses.dataclass
class Order:
    item: str
    count: int

@app.workflow()
async def greet(name: str, times: int = 1) -> str:
    return " ".join([f"hello {name}"] * times)

@app.workflow()
async def total(order: Order) -> int:
    return order.count * 10
"""


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tether.db'}"
        return
    url = with_schema(request.getfixturevalue("postgres_url"), f"t_{uuid.uuid4().hex[:12]}")
    yield url
    with contextlib.suppress(Exception):
        drop_schema(url)


@contextlib.contextmanager
def worker_process(url: str, folder: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`tether worker startmod:app` in a process of its own, with the workflows' code."""
    (folder / "startmod.py").write_text(textwrap.dedent(WORKER_CODE))
    env = child_env(TETHER_DATABASE_URL=url)
    env["PYTHONPATH"] = f"{folder}:{env['PYTHONPATH']}"
    with open(folder / "worker.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tether", "worker", "startmod:app"],
                                cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def test_a_process_without_the_code_starts_a_run_that_a_worker_with_it_executes(
    db_url: str, tmp_path: Path
) -> None:
    starter = tether.App(db_url)  # registers nothing
    try:
        first = await starter.start("greet", "ada", id="by-name-1", times=2)
        order = await starter.start("total", {"item": "tea", "count": 3}, id="by-name-2")
        with worker_process(db_url, tmp_path):
            assert await first.result(timeout=60) == "hello ada hello ada"
            assert await order.result(timeout=60) == 30  # rebuilt as the worker's Order
    finally:
        await starter.close()


async def test_arguments_a_worker_cannot_take_make_the_run_dead_at_once_with_the_reason(
    db_url: str, tmp_path: Path
) -> None:
    starter = tether.App(db_url)
    try:
        too_many = await starter.start("greet", "ada", 2, 3, id="bad-count")
        wrong_type = await starter.start("greet", "ada", times="twice", id="bad-type")
        bad_order = await starter.start("total", {"item": "tea"}, id="bad-order")
        with worker_process(db_url, tmp_path):
            for handle, why in ((too_many, "too many positional arguments"),
                                (wrong_type, "argument 'times' of greet as int"),
                                (bad_order, "misses fields ['count']")):  # fmt: skip
                with pytest.raises(RunFailed) as failed:
                    await handle.result(timeout=60)
                info = await handle.info()
                assert info.status is RunStatus.DEAD
                assert info.failures == 1  # not five failed executions
                assert f"stored arguments of run {handle.id!r} do not fit" in str(failed.value)
                assert why in str(failed.value)
    finally:
        await starter.close()


async def test_starting_a_registered_workflow_by_name_is_starting_it_by_object(
    tmp_path: Path,
) -> None:
    app = tether.App(f"sqlite:///{tmp_path / 'tether.db'}")

    @app.workflow()
    async def double(n: int) -> int:
        return 2 * n

    async with app:
        by_name = await app.start("double", 21, id="d")
        assert await by_name.result(timeout=30) == 42
        same = await app.start(double, 21, id="d")  # the same run: the id is the key
        assert same.id == "d"
        with pytest.raises(ConfigurationError, match="do not fit workflow double"):
            await app.start("double", "x", id="d2")  # checked like the object
        with pytest.raises(IdempotencyConflict):
            await app.start("double", 20, id="d")


async def test_a_start_by_name_with_the_same_id_finds_the_run_and_other_arguments_conflict(
    tmp_path: Path,
) -> None:
    app = tether.App(f"sqlite:///{tmp_path / 'tether.db'}")
    try:
        first = await app.start("remote", 1, id="r", flag=True)
        again = await app.start("remote", 1, id="r", flag=True)
        assert again.id == first.id == "r"
        with pytest.raises(IdempotencyConflict, match="start with a new id"):
            await app.start("remote", 2, id="r", flag=True)
        with pytest.raises(IdempotencyConflict):
            await app.start("other", 1, id="r", flag=True)
        queued = await app.start(Named("remote", queue="slow"), 5, id="q")
        assert (await queued.info()).workflow == "remote"
        assert [r.id for r in await app.list_runs()] == ["q", "r"]
    finally:
        await app.close()


@dataclasses.dataclass
class Point:
    x: int
    y: int


async def test_arguments_that_do_not_fit_the_signature_or_hints_are_refused_before_any_write(
    tmp_path: Path,
) -> None:
    app = tether.App(f"sqlite:///{tmp_path / 'tether.db'}")

    @app.workflow()
    async def place(p: Point, label: str, *, size: float = 1.0) -> str:
        return label

    try:
        refusals = [
            ((), {}, "missing a required argument: 'p'"),
            ((Point(1, 2), "a", "b"), {}, "too many positional arguments"),
            ((Point(1, 2),), {"label": "a", "colour": 1}, "unexpected keyword argument"),
            ((Point(1, 2), 7), {}, "argument 'label' of place as str"),
            ((Point(1, 2), "a"), {"size": "big"}, "argument 'size' of place as float"),
            (({"x": 1}, "a"), {}, "Point misses fields ['y']"),
            ((True, "a"), {}, "argument 'p' of place as Point"),
        ]
        for args, kwargs, why in refusals:
            with pytest.raises(ConfigurationError, match="do not fit workflow place") as refused:
                await app.start(place, *args, **kwargs)  # type: ignore[call-overload]
            assert why in str(refused.value)
        assert await app.list_runs() == []  # nothing was written
        fits = await app.start(place, {"x": 1, "y": 2}, "a", size=2)  # rebuilt as the worker will
        assert (await fits.info()).status is RunStatus.PENDING
    finally:
        await app.close()


def test_the_worker_module_is_not_importable_by_the_starting_process() -> None:
    # The cross-process tests mean something only if the test process lacks the code.
    assert "startmod" not in sys.modules
    assert not (ROOT / "startmod.py").exists()


def test_tether_runs_start_stores_a_run_by_name_and_prints_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tether.db'}"
    assert asyncio.run(_list(url)) == []
    runner = CliRunner()
    done = runner.invoke(cli, ["runs", "-d", url, "start", "greet", "--input", '{"name": "ada"}',
                               "--id", "cli-1", "--json"])  # fmt: skip
    assert done.exit_code == 0, done.output
    shown = json.loads(done.output)
    assert (shown["id"], shown["workflow"], shown["status"]) == ("cli-1", "greet", "pending")
    again = runner.invoke(cli, ["runs", "-d", url, "start", "greet", "--input", '{"name": "ada"}',
                                "--id", "cli-1"])  # fmt: skip
    assert again.exit_code == 0
    assert "run 'cli-1' of greet: pending" in again.output
    conflict = runner.invoke(cli, ["runs", "-d", url, "start", "greet", "--input", '["bob"]',
                                   "--id", "cli-1"])  # fmt: skip
    assert conflict.exit_code == 1
    assert "start with a new id" in conflict.output
    for bad, why in (("{not json", "not JSON"), ("3", "not int"),
                     ('{"started_by": "x"}', "start options")):  # fmt: skip
        refused = runner.invoke(cli, ["runs", "-d", url, "start", "greet", "--input", bad])
        assert refused.exit_code == 2, refused.output
        assert why in refused.output
    assert [r.id for r in asyncio.run(_list(url))] == ["cli-1"]


async def _list(url: str) -> list[tether.RunInfo]:
    app = tether.App(url)  # also makes the database, which the CLI wants to exist
    try:
        return await app.list_runs()
    finally:
        await app.close()


def test_tether_runs_start_wait_prints_the_result_or_exits_1_for_a_dead_run(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'tether.db'}"
    assert asyncio.run(_list(url)) == []
    runner = CliRunner()
    with worker_process(url, tmp_path):
        done = runner.invoke(cli, ["runs", "-d", url, "start", "greet", "--input",
                                   '["ada", 2]', "--wait", "--json"])  # fmt: skip
        assert done.exit_code == 0, done.output
        shown = json.loads(done.output)
        assert (shown["status"], shown["result"]) == ("succeeded", "hello ada hello ada")
        dead = runner.invoke(cli, ["runs", "-d", url, "start", "greet", "--input",
                                   '{"nom": "ada"}', "--wait"])  # fmt: skip
        assert dead.exit_code == 1
        assert "dead" in dead.output
        assert "do not fit workflow greet" in dead.output


def test_tether_runs_start_with_app_checks_the_arguments_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'tether.db'}"
    (tmp_path / "startapp.py").write_text(
        f"import tether\napp = tether.App({url!r})\n\n"
        "@app.workflow()\nasync def greet(name: str, times: int = 1) -> str:\n    return name\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = CliRunner()
    refused = runner.invoke(cli, ["runs", "--app", "startapp:app", "start", "greet",
                                  "--input", '["ada", "twice"]'])  # fmt: skip
    assert refused.exit_code == 1
    assert "arguments do not fit workflow greet" in refused.output
    assert asyncio.run(_list(url)) == []
    done = runner.invoke(cli, ["runs", "--app", "startapp:app", "start", "greet",
                               "--input", '["ada", 2]', "--id", "checked"])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert [r.id for r in asyncio.run(_list(url))] == ["checked"]

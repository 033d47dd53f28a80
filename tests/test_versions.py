"""Versions (docs/versions.md): each worker declares one (by default a digest of its workflows'
code), a run is pinned to the version of its first claim and finishes on it, unless it is moved
(`tether runs move-version`, move_version); `tether status` lists the versions in use.

Rolling deploys are played with two versions on one database: in one process on SQLite, and
with two `tether worker` processes of different code on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from tests.postgres_server import with_schema

import tether
from tether.core.versions import code_version, move_version
from tether.errors import ConfigurationError, RunNotFound
from tether.store.port import RunRecord, RunStatus

ROOT = Path(__file__).resolve().parent.parent


async def until(check: Callable[[], Awaitable[bool]], what: str, limit: float = 30.0) -> None:
    """Wait for a condition another process or task brings about (not a timing assertion:
    the limit only keeps a broken build from hanging)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + limit
    while not await check():
        if loop.time() > give_up:
            raise AssertionError(f"never came true: {what}")
        await asyncio.sleep(0.02)


async def stored(app: tether.App, run_id: str) -> RunRecord:
    record = await app.engine.store.get_run(run_id)
    assert record is not None
    return record


async def waiting(app: tether.App, run_ids: list[str]) -> bool:
    for run_id in run_ids:
        if (await stored(app, run_id)).status != RunStatus.WAITING:
            return False
    return True


# -- the default version ------------------------------------------------------------------------

MODULE = """
import tether

app = tether.App("sqlite:///{db}")

@app.step()
async def fetch(n: int) -> int:
    return n {op} 1

@app.workflow()
async def flow(n: int) -> int:
    return await fetch(n) * {{"a", "b", "c"}}.__len__()
"""


def digest_in_a_process(folder: Path, seed: str) -> str:
    script = "import mod; from tether.core.versions import code_version; " \
             "print(code_version(mod.app.engine.workflows))"  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": f"{folder}:{ROOT / 'src'}"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, check=True, cwd=folder)  # fmt: skip
    return done.stdout.strip()


def test_the_default_version_is_the_same_digest_in_every_process_and_changes_with_a_step(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, op in ((first, "+"), (second, "-")):
        folder.mkdir()
        (folder / "mod.py").write_text(MODULE.format(db=folder / "t.db", op=op))
    one, again = digest_in_a_process(first, "1"), digest_in_a_process(first, "2")
    assert one == again
    assert len(one) == 16
    assert digest_in_a_process(second, "1") != one  # only the step's body differs


def test_a_workflow_defined_without_source_still_has_a_stable_digest() -> None:
    scope: dict[str, Any] = {"tether": tether}
    code = "async def flow(n):\n    return {1, 2} and n\n"
    exec(compile(code, "<cell>", "exec"), scope)  # a REPL's: inspect finds no source
    app = tether.App("sqlite:///:memory:")
    app.workflow(name="flow")(scope["flow"])
    version = code_version(app.engine.workflows)
    assert version == code_version(app.engine.workflows)
    assert version != code_version({})


def test_a_version_with_spaces_or_empty_is_refused_at_construction() -> None:
    for bad in ("", "two words", "x" * 201, "tab\there"):
        with pytest.raises(ConfigurationError, match="a version is a non-empty str"):
            tether.App("sqlite:///:memory:", version=bad)


# -- a rolling deploy in one process (SQLite) ---------------------------------------------------


def deploy(url: str, label: str) -> tuple[tether.App, Any]:
    app = tether.App(url, version=label)
    # Waits suspend at once: a run waiting is free for any worker to claim when woken.
    app.engine.settings = dataclasses.replace(app.engine.settings, inline_wait_max=0.0)

    @app.workflow(name="job")
    async def job(n: int) -> str:
        await tether.wait_for_event("go")
        return f"{label}:{n}"

    return app, job


async def test_on_sqlite_each_run_finishes_on_its_version_and_a_moved_run_on_the_new_one(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/deploy.db"
    old, old_job = deploy(url, "v1")
    new, new_job = deploy(url, "v2")
    async with old:
        olds = [f"old-{i}" for i in range(6)]
        for i, run_id in enumerate(olds):
            await old.start(old_job, i, id=run_id)
        await until(lambda: waiting(old, olds), "the old runs wait")
        assert {(await stored(old, r)).version for r in olds} == {"v1"}
        async with new:  # both versions live on one database now
            news = [f"new-{i}" for i in range(6)]
            for i, run_id in enumerate(news):
                await new.start(new_job, i, id=run_id)
            await until(lambda: waiting(new, news), "the new runs wait")
            assert {(await stored(new, r)).version for r in news} == {"v2"}
            moved = await move_version(new.engine, "old-5", "v2")
            assert (moved.version, moved.status) == ("v2", RunStatus.WAITING)
            for run_id in olds + news:
                await new.send(run_id, "go")
            results = {r: await (await new.get(r)).result(timeout=30) for r in olds + news}
    assert results == {
        **{f"old-{i}": f"v1:{i}" for i in range(5)}, "old-5": "v2:5",
        **{f"new-{i}": f"v2:{i}" for i in range(6)},
    }  # fmt: skip


async def test_move_version_of_an_unknown_run_raises_run_not_found(tmp_path: Path) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/t.db")
    async with app:
        with pytest.raises(RunNotFound):
            await move_version(app.engine, "nope", "v2")
        with pytest.raises(ConfigurationError):
            await move_version(app.engine, "nope", "has space")


async def test_runs_made_before_versions_are_pinned_at_their_next_claim(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    app, job = deploy(url, "v3")
    await app.start(job, 1, id="early")  # no worker here: created pending, pinned by none
    assert (await stored(app, "early")).version is None
    async with app:
        await until(lambda: waiting(app, ["early"]), "the run waits")
        assert (await stored(app, "early")).version == "v3"
        await app.send("early", "go")
        assert await (await app.get("early")).result(timeout=30) == "v3:1"


async def test_once_a_version_has_no_live_worker_the_next_version_takes_its_runs_over(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    old, old_job = deploy(url, "v1")
    async with old:
        await old.start(old_job, 1, id="left")
        await until(lambda: waiting(old, ["left"]), "the run waits")
    # The old version's last worker stopped (its row is gone): the new code takes the run over,
    # and replays its history (a change it cannot replay would hold it, see semantics.md).
    new, _ = deploy(url, "v2")
    async with new:
        await new.send("left", "go")
        assert await (await new.get("left")).result(timeout=30) == "v2:1"
        assert (await stored(new, "left")).version == "v2"


# -- a rolling deploy of two processes on PostgreSQL --------------------------------------------

WORKER_MODULE = """
import dataclasses
import tether

app = tether.App({url!r})
app.engine.settings = dataclasses.replace(app.engine.settings, inline_wait_max=0.0)

@app.step()
async def mark(n: int) -> int:
    return n

@app.workflow(name="job")
async def job(n: int) -> str:
    await mark(n)
    await tether.wait_for_event("go")
    return {label!r} + ":" + str(n)
"""


def tether_cli(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "tether", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_on_postgres_two_worker_processes_of_two_versions_each_finish_their_own_runs(
    tmp_path: Path, postgres_url: str
) -> None:
    url = with_schema(postgres_url, f"t_versions_{os.getpid()}")
    folders = {}
    for label in ("v1", "v2"):
        folders[label] = tmp_path / label
        folders[label].mkdir()
        (folders[label] / "deploy_app.py").write_text(WORKER_MODULE.format(url=url, label=label))
    client = tether.App(url)  # starts runs by name, executes none

    @client.workflow(name="job")
    async def job(n: int) -> str:
        raise AssertionError("this App has no worker")

    procs: dict[str, subprocess.Popen[str]] = {}

    def start_worker(label: str) -> None:
        procs[label] = subprocess.Popen(
            [sys.executable, "-m", "tether", "worker", "deploy_app:app", "--drain-timeout", "5"],
            cwd=folders[label], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    async def version_of(label: str) -> str:
        async def registered() -> bool:
            return any(w.pid == procs[label].pid for w in await client.engine.store.list_workers())

        await until(registered, f"worker {label} registers")
        [worker] = [w for w in await client.engine.store.list_workers()
                    if w.pid == procs[label].pid]  # fmt: skip
        assert worker.version is not None
        return worker.version

    try:
        await client.open()
        start_worker("v1")
        v1 = await version_of("v1")
        olds = [f"old-{i}" for i in range(6)]
        for i, run_id in enumerate(olds):
            await client.start(job, i, id=run_id)
        await until(lambda: waiting(client, olds), "the old runs wait on v1")
        start_worker("v2")  # the rolling deploy: both versions live now
        v2 = await version_of("v2")
        assert v1 != v2  # the code differs, so its digest does
        news = [f"new-{i}" for i in range(4)]
        for i, run_id in enumerate(news):
            await client.start(job, 10 + i, id=run_id)
        await until(lambda: waiting(client, news), "the new runs wait")
        moved = tether_cli("runs", "-d", url, "move-version", "old-5", "--to", v2, "--json",
                           cwd=tmp_path)  # fmt: skip
        assert json.loads(moved) == {"id": "old-5", "status": "waiting", "version": v2}
        pinned = {r: (await stored(client, r)).version for r in olds + news}
        assert {pinned[r] for r in olds[:5]} == {v1}

        status = json.loads(tether_cli("status", "-d", url, "--json", cwd=tmp_path))
        listed = {v["version"]: v for v in status["versions"]}
        assert set(listed) == {v1, v2} or set(listed) == {v2, v1}
        assert sum(v["unfinished_runs"] for v in listed.values()) == 10
        assert [len(listed[v]["workers"]) for v in (v1, v2)] == [1, 1]

        for run_id in olds + news:
            await client.send(run_id, "go")
        labels = {v1: "v1", v2: "v2"}
        for run_id in olds + news:
            result = await (await client.get(run_id)).result(timeout=30)
            n = int(run_id.split("-")[1]) + (10 if run_id.startswith("new") else 0)
            assert result == f"{labels[pinned[run_id] or '']}:{n}", run_id
        assert pinned["old-5"] == v2
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
        await client.close()


def test_move_version_needs_one_target_and_to_current_needs_an_app(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    base = [sys.executable, "-m", "tether", "runs", "-d", url, "move-version", "r1"]
    done = subprocess.run(base, capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode != 0
    assert "give one of --to VERSION and --to-current" in done.stderr
    done = subprocess.run([*base, "--to-current"], capture_output=True, text=True, cwd=tmp_path,
                          check=False)  # fmt: skip
    assert done.returncode != 0
    assert "--to-current needs --app" in done.stderr


def test_move_version_to_current_pins_a_run_to_the_apps_code_digest(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    (tmp_path / "deploy_app.py").write_text(WORKER_MODULE.format(url=url, label="v9"))

    async def make_run() -> None:
        client = tether.App(url)

        @client.workflow(name="job")
        async def job(n: int) -> str:
            raise AssertionError("no worker here")

        await client.start(job, 1, id="r1")
        await client.close()

    asyncio.run(make_run())
    out = tether_cli("runs", "--app", "deploy_app:app", "move-version", "r1", "--to-current",
                     "--json", cwd=tmp_path)  # fmt: skip
    sys.path.insert(0, str(tmp_path))
    try:
        import deploy_app  # type: ignore[import-not-found]

        expected = code_version(deploy_app.app.engine.workflows)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("deploy_app", None)
    assert json.loads(out) == {"id": "r1", "status": "pending", "version": expected}

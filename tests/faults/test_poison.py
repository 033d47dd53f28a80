"""Poison runs: a step that always fails, a checkpoint that cannot be decoded (corrupt JSON, or
a value that no longer fits the code's type hint), arguments that no longer fit the workflow,
and a workflow whose code was removed. Each ends after a bounded number of executions, failed
(the workflow's own failure) or dead (the engine could not execute it), with its error visible
in `tether runs` and on the inbox's run page; healthy runs beside them all finish; a dead run
resumes once its cause is fixed. On every backend of `make_app` (memory, SQLite, PostgreSQL,
with forced replay too); the command line is checked where a database URL exists.

Figures recorded (tests/faults/figures.py): executions before each poison run ended, healthy
runs completed beside poison ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import httpx
import pytest
from click.testing import CliRunner, Result
from tests.faults import figures
from tests.server.kit import ORIGIN, SECRET, Person, sign_in

import tether
from tether.cli import cli
from tether.server import create_server
from tether.store.port import Checkpoint, CheckpointStatus, Lease, NewRun, RunStatus
from tether.users import add_user

MakeApp = Callable[..., tether.App]
MAX = 3  # executions in a row that fail outside workflow code before a run is dead
FAST = tether.Retry(max_attempts=4, initial_delay=timedelta(milliseconds=5), jitter=0.0)
ENV = {"COLUMNS": "250", "NO_COLOR": "1", "TETHER_DATABASE_URL": None}


def poison_app(make_app: MakeApp, **settings: float | None) -> tether.App:
    """An App whose failed executions are tried again within milliseconds, dead after MAX."""
    app = make_app(concurrency=4, max_executions=MAX)
    app.engine.settings = dataclasses.replace(
        app.engine.settings, failure_backoff=0.01, max_failure_backoff=0.05, **settings
    )
    return app


def register_healthy(app: tether.App) -> tether.Workflow[[int], int]:
    @app.step()
    async def add_one(n: int) -> int:
        await asyncio.sleep(0.001)
        return n + 1

    @app.workflow()
    async def healthy(n: int) -> int:
        return await add_one(await add_one(n))

    return healthy


async def start_healthy(app: tether.App, count: int) -> list[tether.RunHandle[int]]:
    return [await app.start("healthy", i, id=f"healthy-{i}") for i in range(count)]


async def all_finish(handles: list[tether.RunHandle[int]]) -> int:
    """How many healthy runs finished with the right result (all of them, or it raises)."""
    results = await asyncio.gather(*(h.result(timeout=60) for h in handles))
    assert results == [i + 2 for i in range(len(handles))]
    return len(results)


async def dead_error(app: tether.App, run_id: str) -> tether.RunDead:
    """The RunDead that the run's result raises once it is dead."""
    with pytest.raises(tether.RunDead) as raised:
        await (await app.get(run_id)).result(timeout=60)
    assert isinstance(raised.value, tether.RunFailed)  # callers catching RunFailed see it too
    return raised.value


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env=ENV, catch_exceptions=False)


async def assert_dead_is_visible(app: tether.App, run_id: str, reason: str) -> None:
    """The dead run, with `reason` in its error, in `tether runs list --status dead` and
    `tether runs show` (when the database has a URL), and on the inbox's run page."""
    if not app.url.startswith("memory:"):
        listed = await asyncio.to_thread(
            invoke, "runs", "--database", app.url, "list", "--status", "dead", "--json"
        )
        assert listed.exit_code == 0, listed.output
        dead_rows = {row["id"]: row for row in json.loads(listed.output)}
        assert run_id in dead_rows
        assert {r["status"] for r in dead_rows.values()} == {"dead"}
        assert reason in dead_rows[run_id]["error_message"]
        shown = await asyncio.to_thread(invoke, "runs", "--database", app.url, "show", run_id)
        assert shown.exit_code == 0, shown.output
        assert "dead-lettered" in shown.output
        assert f"tether runs resume {run_id}" in shown.output
        assert reason in " ".join(shown.output.split())  # rich wraps long lines
    name = f"root-{run_id.replace('/', '-')}"
    user, token = await add_user(app.engine, name, frozenset({"admin"}))
    transport = httpx.ASGITransport(app=create_server(app, secret=SECRET))
    async with httpx.AsyncClient(transport=transport, base_url=ORIGIN) as client:
        await sign_in(client, Person(user, token))
        page = await client.get(f"/runs/{run_id}")
        runs_page = await client.get("/runs")
    assert page.status_code == 200
    assert '<span class="badge badge-dead">dead</span>' in page.text
    assert 'id="dead-letter"' in page.text
    assert f"tether runs resume {run_id}" in page.text
    assert reason in page.text.replace("&#39;", "'")
    assert f'data-run-id="{run_id}"' in runs_page.text


# -- a step that always fails: the workflow's own failure, bounded by its Retry ----------------


async def test_a_step_that_always_fails_fails_its_run_after_its_retries_and_others_flow(
    make_app: MakeApp,
) -> None:
    app = poison_app(make_app)
    register_healthy(app)
    calls = Counter[str]()

    @app.step(retry=FAST)
    async def charge(n: int) -> int:
        calls[f"charge-{n}"] += 1
        raise ConnectionError(f"the payment service refused {n}")

    @app.workflow()
    async def checkout(n: int) -> int:
        return await charge(n)

    async with app:
        poisoned = [await app.start(checkout, n, id=f"checkout-{n}") for n in range(5)]
        healthy = await start_healthy(app, 30)
        for handle in poisoned:
            with pytest.raises(tether.RunFailed) as failed:
                await handle.result(timeout=60)
            assert not isinstance(failed.value, tether.RunDead)
            assert failed.value.error["type"] == "ConnectionError"
            info = await handle.info()
            assert (info.status, info.failures, info.attempt) == (RunStatus.FAILED, 0, 1)
        finished = await all_finish(healthy)
    assert calls == Counter({f"charge-{n}": 4 for n in range(5)})  # max_attempts, no more
    figures.record("poison: attempts of an always-failing step before its run failed", 4)
    figures.record("poison: healthy runs completed beside always-failing ones", finished)


# -- a checkpoint that cannot be decoded ------------------------------------------------------


async def forge_run(app: tether.App, run_id: str, workflow: str, checkpoint: Checkpoint) -> None:
    """A pending run of `workflow` whose history holds `checkpoint`, written as a worker that
    then died would have left it (its row changed in the database since)."""
    store, now = app.engine.store, app.engine.clock.now()
    await app.open()
    await store.create_run(NewRun(run_id, workflow, '{"args": [0], "kwargs": {}}'), now,
                           owner="forger", lease_until=now + 60)  # fmt: skip
    await store.write_checkpoint(Lease(run_id, "forger", 1), checkpoint, now)
    assert await store.release_worker("forger", now) == [run_id]


def corrupt_fetch() -> Checkpoint:
    return Checkpoint(seq=0, name="fetch", kind="step", status=CheckpointStatus.COMPLETED,
                      result='{"n": ', attempts=1)  # fmt: skip


async def test_an_undecodable_checkpoint_leaves_its_run_dead_after_max_executions(
    make_app: MakeApp,
) -> None:
    app = poison_app(make_app)
    register_healthy(app)
    fetched = Counter[str]()

    @app.step()
    async def fetch(n: int) -> dict[str, int]:
        fetched["fetch"] += 1
        return {"n": n}

    @app.workflow()
    async def ingest(n: int) -> int:
        try:
            data = await fetch(n)
        except Exception:  # workflow code cannot swallow an undecodable checkpoint
            return -1
        return data["n"]

    poison_ids = [f"corrupt-{i}" for i in range(8)]
    for run_id in poison_ids:
        await forge_run(app, run_id, "ingest", corrupt_fetch())
    async with app:
        healthy = await start_healthy(app, 40)
        finished = await all_finish(healthy)
        for run_id in poison_ids:
            dead = await dead_error(app, run_id)
            assert dead.error["type"] == "tether.errors.SerializationError"
            assert "checkpoint 'fetch' (position 0)" in dead.error["message"]
            assert "not valid JSON" in dead.error["message"]
            record = await app.engine.store.get_run(run_id)
            assert record is not None
            assert (record.status, record.failures, record.epoch) == (RunStatus.DEAD, MAX, 1 + MAX)
        assert fetched["fetch"] == 0  # the completed step never ran again
        checked = {o.run_id: o for o in await app.replay_check(status="dead")}
        assert set(checked) == set(poison_ids)  # replay-check names them before a deploy
        assert all(not o.ok and "cannot be decoded" in str(o.error) for o in checked.values())
        await assert_dead_is_visible(app, poison_ids[0], "checkpoint 'fetch' (position 0)")

        # Resumed without a fix, it dies again after MAX more executions: its count restarted.
        resumed = await app.resume(poison_ids[0])
        assert (await resumed.info()).failures == 0
        await dead_error(app, poison_ids[0])
        record = await app.engine.store.get_run(poison_ids[0])
        assert record is not None
        assert (record.failures, record.epoch) == (MAX, 1 + 2 * MAX)
    figures.record("poison: executions before an undecodable checkpoint's run was dead", MAX)
    figures.record("poison: healthy runs completed beside undecodable checkpoints", finished)


# serial: the CLI's resume reports the run pending before v3's worker, polling every 50 ms,
# takes it; a second test process on the machine slows the CLI's thread past that (seen:
# "running").
@pytest.mark.serial
async def test_a_checkpoint_that_no_longer_fits_the_type_hint_is_dead_until_the_code_is_fixed(
    make_app: MakeApp,
) -> None:
    def deploy(label_type: type) -> tether.App:
        app = poison_app(make_app)
        register_healthy(app)

        async def make_label(n: int) -> str:
            return f"item-{n}"

        make_label.__annotations__["return"] = label_type  # what this deploy declares
        label = app.step(name="label")(make_label)

        @app.workflow()
        async def tag(n: int) -> str:
            value = await label(n)
            await tether.wait_for_event("go")
            return f"{value}!"

        return app

    v1 = deploy(str)
    async with v1:
        await v1.start("tag", 7, id="tag-7")
        async with asyncio.timeout(30):
            while (await (await v1.get("tag-7")).status()) is not RunStatus.WAITING:
                await asyncio.sleep(0.01)

    v2 = deploy(int)  # the step's return type changed: "item-7" is no int
    async with v2:
        await v2.send("tag-7", "go")
        finished = await all_finish(await start_healthy(v2, 20))
        dead = await dead_error(v2, "tag-7")
        assert "checkpoint 'label' (position 0)" in dead.error["message"]
        assert "as int" in dead.error["message"]
        assert (await (await v2.get("tag-7")).info()).failures == MAX
        await assert_dead_is_visible(v2, "tag-7", "cannot be decoded by this code")

    v3 = deploy(str)  # the fix: the code reads what v1 recorded again
    async with v3:
        if v3.url.startswith("memory:"):
            await v3.resume("tag-7")
        else:  # the operator's way
            resumed = await asyncio.to_thread(
                invoke, "runs", "--database", v3.url, "resume", "tag-7"
            )
            assert resumed.exit_code == 0, resumed.output
            assert "pending" in resumed.output
            v3.engine.wake("tag-7")
        assert await (await v3.get("tag-7")).result(timeout=60) == "item-7!"
    figures.record("poison: executions before a checkpoint of a changed type was dead", MAX)
    figures.record("poison: healthy runs completed beside a changed type", finished)


async def test_arguments_that_no_longer_fit_the_workflow_leave_the_run_dead_until_fixed(
    make_app: MakeApp,
) -> None:
    v1 = poison_app(make_app)

    @v1.workflow(name="resize")
    async def resize_v1(width: int) -> int:
        return width

    await v1.open()
    await v1.start(resize_v1, 640, id="resize-640")  # started, never executed under v1

    v2 = poison_app(make_app)
    register_healthy(v2)

    @v2.workflow(name="resize")
    async def resize_v2(width: int, height: int) -> int:  # a new required parameter
        return width * height

    async with v2:
        finished = await all_finish(await start_healthy(v2, 20))
        dead = await dead_error(v2, "resize-640")
        assert "stored arguments of run 'resize-640' do not fit workflow resize" in str(dead)
        # Arguments the workflow refuses end the run at once: no execution can do better.
        assert (await (await v2.get("resize-640")).info()).failures == 1

    v3 = poison_app(make_app)

    @v3.workflow(name="resize")
    async def resize_v3(width: int, height: int = 480) -> int:  # the fix: a default
        return width * height

    async with v3:
        handle = await v3.resume("resize-640")
        assert await handle.result(timeout=60) == 640 * 480
    figures.record("poison: executions before a run with unfitting arguments was dead", 1)
    figures.record("poison: healthy runs completed beside unfitting arguments", finished)


# -- a workflow whose code was removed --------------------------------------------------------


async def test_a_run_of_a_removed_workflow_is_dead_after_the_grace_period_then_resumes(
    make_app: MakeApp,
) -> None:
    old = make_app()

    @old.workflow()
    async def legacy(n: int) -> int:
        return n * 10

    loop = asyncio.get_running_loop()
    began = loop.time()
    await old.open()
    await old.start(legacy, 4, id="legacy-4")  # nobody executed it before the deploy

    # The new deploy dropped `legacy`. Its worker looks every 50 ms (each heartbeat, 1/3 of
    # the lease) for runs due 0.5 s whose workflow no live worker serves.
    new = make_app(lease_duration=timedelta(seconds=0.3))
    new.engine.settings = dataclasses.replace(
        new.engine.settings, unserved_grace=0.5, unserved_check=0.05
    )
    register_healthy(new)
    async with new:
        finished = await all_finish(await start_healthy(new, 20))
        dead = await dead_error(new, "legacy-4")
        waited = loop.time() - began
        assert dead.error["type"] == "tether.errors.ConfigurationError"
        assert "no worker serves workflow 'legacy'" in dead.error["message"]
        info = await (await new.get("legacy-4")).info()
        assert (info.status, info.failures, info.attempt) == (RunStatus.DEAD, 0, 0)
        assert 0.5 <= waited < 30  # not before the grace period (0.5 s)
        await assert_dead_is_visible(new, "legacy-4", "no worker serves workflow 'legacy'")

        back = make_app()  # the code comes back beside the new deploy

        @back.workflow(name="legacy")
        async def legacy_again(n: int) -> int:
            return n * 10

        async with back:
            assert await (await back.resume("legacy-4")).result(timeout=60) == 40
            await asyncio.sleep(0.2)  # sweeps of `new` meanwhile leave it alone
            assert await (await back.get("legacy-4")).status() is RunStatus.SUCCEEDED
    figures.record("poison: runs of a removed workflow dead after the grace period", 1)
    figures.record("poison: runs of a removed workflow dead before it (must be 0)", waited < 0.5)
    figures.record("poison: healthy runs completed beside a removed workflow's run", finished)


async def test_a_step_result_that_does_not_fit_its_type_hint_kills_the_run_and_its_parent_sees_it(
    make_app: MakeApp,
) -> None:
    app = poison_app(make_app)
    calls = Counter[str]()

    @app.step()
    async def count_words(text: str) -> int:
        calls["count_words"] += 1
        return text  # type: ignore[return-value]  # the bug: not the int its hint promises

    @app.workflow()
    async def child(text: str) -> int:
        try:
            return await count_words(text)
        except Exception:  # workflow code cannot swallow it: the recorded value stays unfit
            return -1

    @app.workflow()
    async def parent() -> str:
        try:
            return str(await child("a b c"))
        except tether.RunDead as dead:
            return f"child dead: {dead.error['type']}"

    async with app:
        handle = await app.start(parent, id="parent")
        assert await handle.result(timeout=60) == "child dead: tether.errors.SerializationError"
        kid = await app.get("parent/child:child")
        info = await kid.info()
        assert (info.status, info.failures) == (RunStatus.DEAD, MAX)
        assert "checkpoint 'count_words' (position 0)" in (info.error or {})["message"]
    assert calls["count_words"] == 1  # its result is recorded: the body never ran again

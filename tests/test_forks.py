"""Forks (`app.fork(run_id, from_step=...)`) on every backend, in normal and forced-replay mode:
a fork from each step of a finished run executes exactly the steps from that one on, under the
current code, and reuses the rest (values too); the link is kept both ways; events, children,
approvals and streams are handled as docs/values-and-forks.md says; bad input is refused at
call time. Then the command line: `tether runs fork`, `runs show`, and `runs resume` of failed
and dead runs, against a real SQLite file."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import tether
from tether.cli import cli
from tether.store.port import Checkpoint, CheckpointStatus, Lease, NewRun, Store
from tether.store.port.values import ForkRecord

MakeApp = Callable[..., tether.App]

# The checkpoints of `pipeline`, in order: its steps, a recorded helper and its values.
PIPELINE = ["fetch", "uuid4", "value:stage", "double", "double#2", "value:stage#2", "report"]


def pipeline_app(make_app: MakeApp, runs: Counter[str], code: dict[str, int]) -> tether.App:
    """`pipeline`, whose step bodies count their executions in `runs` and read `code` (the
    code version a step body runs): changing it between source and fork is a deploy."""
    app = make_app()

    @app.step()
    async def fetch(x: int) -> int:
        runs["fetch"] += 1
        return x + code["fetch"]

    @app.step()
    async def double(x: int) -> int:
        runs["double"] += 1
        return x * 2

    @app.step()
    async def report(x: int) -> str:
        runs["report"] += 1
        return f"v{code['report']}:{x}"

    @app.workflow()
    async def pipeline(x: int) -> dict[str, Any]:
        a = await fetch(x)
        token = str(tether.uuid4())
        await tether.set_value("stage", "fetched")
        b = await double(await double(a))
        await tether.set_value("stage", "doubled")
        return {"report": await report(b), "token": token}

    return app


@pytest.mark.parametrize("step", PIPELINE)
async def test_a_fork_from_each_step_executes_from_that_step_and_reuses_the_rest(
    make_app: MakeApp, step: str
) -> None:
    runs: Counter[str] = Counter()
    code = {"fetch": 1, "report": 1}
    app = pipeline_app(make_app, runs, code)
    async with app:
        source = await app.start("pipeline", 1, id="src")
        before = await source.result(timeout=20)
        assert before["report"] == "v1:8"
        history = await source.checkpoints()
        assert [c.name for c in history] == PIPELINE
        executed = Counter(runs)
        code.update(fetch=10, report=2)  # a new deploy: the fork runs this code from `step` on
        fork = await app.fork("src", step, id="fork")
        after = await fork.result(timeout=20)
        forked = await fork.checkpoints()
        values = await app.list_values("fork")
        info = await fork.info()
        assert await source.checkpoints() == history  # the source is not changed
        assert await source.result() == before
    at = PIPELINE.index(step)
    again = Counter(runs) - executed
    # Exactly the step bodies at and after `step` ran again, each once (double twice).
    bodies = ("fetch", "double", "double#2", "report")
    expected = Counter(n.split("#")[0] for n in PIPELINE[at:] if n in bodies)
    assert again == expected
    # Reused checkpoints are the source's, unchanged; the rest were recorded anew.
    assert [c.name for c in forked] == PIPELINE
    assert forked[:at] == history[:at]
    fetched = 1 + (10 if at == 0 else 1)  # fetch re-executed under the new code only from 0
    assert after["report"] == f"v2:{fetched * 4}"
    assert (after["token"] == before["token"]) == (at > PIPELINE.index("uuid4"))
    # Values: the versions set before the step are copied, the fork set the others.
    assert [(v.key, v.value, v.version) for v in values] == [("stage", "doubled", 2)]
    assert info.fork is not None
    assert (info.fork.source_run_id, info.fork.from_step) == ("src", step)


async def test_a_fork_is_linked_both_ways_and_its_id_is_an_idempotency_key(
    make_app: MakeApp,
) -> None:
    app = pipeline_app(make_app, Counter(), {"fetch": 1, "report": 1})
    async with app:
        await (await app.start("pipeline", 1, id="src")).result(timeout=20)
        first = await app.fork("src", "double#2", id="f1")
        again = await app.fork("src", "double#2", id="f1")
        assert again.id == first.id
        second = await app.fork("src", "report#1")  # "#1" names the first occurrence
        await first.result(timeout=20)
        await second.result(timeout=20)
        with pytest.raises(tether.IdempotencyConflict, match="fork of 'src' from 'double#2'"):
            await app.fork("src", "report", id="f1")
        with pytest.raises(tether.IdempotencyConflict, match="is not a fork"):
            await app.fork("src", "report", id="src")
        links = await (await app.get("src")).forks()
        assert [(f.run_id, f.source_run_id, f.from_step) for f in links] == [
            ("f1", "src", "double#2"),
            (second.id, "src", "report"),
        ]
        assert (await (await app.get("src")).info()).fork is None
        # A fork of a fork links to its own source.
        deeper = await app.fork("f1", "report", id="f1-1")
        await deeper.result(timeout=20)
        info = await deeper.info()
        assert info.fork is not None
        assert (info.fork.source_run_id, info.fork.from_step) == ("f1", "report")


async def test_bad_forks_are_refused_at_call_time_naming_what_to_do(make_app: MakeApp) -> None:
    app = pipeline_app(make_app, Counter(), {"fetch": 1, "report": 1})
    async with app:
        await (await app.start("pipeline", 1, id="src")).result(timeout=20)
        with pytest.raises(tether.ConfigurationError) as caught:
            await app.fork("src", "publish")
        message = str(caught.value)
        assert "recorded no step 'publish'" in message
        assert "fetch, uuid4, value:stage, double, double#2, value:stage#2, report" in message
        with pytest.raises(tether.ConfigurationError, match="recorded no step 'double#3'"):
            await app.fork("src", "double#3")
        with pytest.raises(tether.RunNotFound, match="no-such-run"):
            await app.fork("no-such-run", "fetch")
        with pytest.raises(tether.ConfigurationError, match="from_step"):
            await app.fork("src", "")
        assert [r.id for r in await app.list_runs()] == ["src"]  # nothing was created
    other = make_app()  # another App on the same database, without the workflow's code
    with pytest.raises(tether.ConfigurationError, match="does not register"):
        await other.fork("src", "fetch")


async def test_a_failed_run_forked_from_its_failed_step_after_a_fix_succeeds(
    make_app: MakeApp,
) -> None:
    app = make_app()
    fixed = {"yes": False}
    runs: Counter[str] = Counter()

    @app.step()
    async def load() -> int:
        runs["load"] += 1
        return 20

    @app.step(retry=tether.NO_RETRY)
    async def compute(x: int) -> int:
        runs["compute"] += 1
        if not fixed["yes"]:
            raise ValueError("bug")
        return x + 1

    @app.workflow()
    async def job() -> int:
        return await compute(await load())

    async with app:
        source = await app.start(job, id="broken")
        with pytest.raises(tether.RunFailed, match="bug"):
            await source.result(timeout=20)
        fixed["yes"] = True
        fork = await app.fork("broken", "compute")
        assert await fork.result(timeout=20) == 21
        assert await source.status() is tether.RunStatus.FAILED
    assert runs == Counter(load=1, compute=2)


async def test_a_fork_takes_again_the_events_the_source_took_after_the_step(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.step()
    async def shout(text: str) -> str:
        return text.upper()

    @app.workflow()
    async def talk() -> list[Any]:
        first = await tether.wait_for_event("answer")
        loud = await shout(first)
        second = await tether.wait_for_event("answer", timeout=timedelta(milliseconds=100))
        return [loud, second]

    async with app:
        source = await app.start(talk, id="talk")
        await app.send("talk", "answer", "one")
        assert await source.result(timeout=20) == ["ONE", None]
        # From the first wait: the event it took is in the fork's mailbox again.
        redo = await app.fork("talk", "event:answer")
        assert await redo.result(timeout=20) == ["ONE", None]
        # From the step after it: the wait is reused, so its event is not delivered twice.
        later = await app.fork("talk", "shout")
        assert await later.result(timeout=20) == ["ONE", None]


async def test_children_before_the_step_are_reused_and_a_running_one_refuses_the_fork(
    make_app: MakeApp,
) -> None:
    app = make_app()
    runs: Counter[str] = Counter()

    @app.step()
    async def mark() -> int:
        runs["mark"] += 1
        return 1

    @app.workflow()
    async def child(n: int) -> int:
        runs["child"] += 1
        if n < 0:
            await tether.wait_for_event("release")
        return n * 3

    @app.workflow()
    async def parent(n: int) -> int:
        handle = await tether.start_child(child, n)
        got: int = await mark() + await handle
        return got

    async with app:
        source = await app.start(parent, 2, id="p")
        assert await source.result(timeout=20) == 7
        children = runs["child"]
        # Forked between the child's start and its join: the fork learns the child's end.
        between = await app.fork("p", "mark")
        assert await between.result(timeout=20) == 7
        assert runs["child"] == children  # no second child
        # Forked from the start: the fork starts a child of its own.
        anew = await app.fork("p", "child:child", id="p-anew")
        assert await anew.result(timeout=20) == 7
        assert await (await app.get("p-anew/child:child")).status() is tether.RunStatus.SUCCEEDED

        stuck = await app.start(parent, -1, id="stuck")
        async with asyncio.timeout(20):
            while len(await stuck.checkpoints()) < 2:  # the child started, mark done
                await asyncio.sleep(0.02)
        with pytest.raises(tether.ConfigurationError, match=r"child run 'stuck/child:child'"):
            await app.fork("stuck", "mark")
        await app.send("stuck/child:child", "release")
        assert await stuck.result(timeout=20) == -2


async def test_a_fork_asks_approvals_again_and_cannot_reuse_a_decision(make_app: MakeApp) -> None:
    app = make_app()

    @app.step()
    async def ship() -> str:
        return "shipped"

    @app.workflow()
    async def release() -> str:
        decision = await tether.approval("Ship?", "", operation={"tool": "ship"},
                                         reviewers=["alice"])  # fmt: skip
        return await ship() if decision.approved else decision.status

    async def approve(run_id: str) -> None:
        async with asyncio.timeout(20):
            while not (asks := await app.list_approvals(run_id=run_id)):
                await asyncio.sleep(0.02)
        await app.decide(asks[0].id, "approve", reviewer="alice",
                         operation_digest=asks[0].operation_digest)  # fmt: skip

    async with app:
        source = await app.start(release, id="rel")
        await approve("rel")
        assert await source.result(timeout=20) == "shipped"
        with pytest.raises(tether.ConfigurationError, match="approval 'approval' comes before"):
            await app.fork("rel", "ship")
        fork = await app.fork("rel", "approval", id="rel-2")
        await approve("rel-2")  # a new approval, for the fork's own run
        assert await fork.result(timeout=20) == "shipped"
        ids = {a.id for a in await app.list_approvals(status=None)}
    assert len(ids) == 2


async def test_whoever_forked_a_run_may_not_decide_its_separate_duties_approval(
    make_app: MakeApp,
) -> None:
    """The fork's starter is who forked it: separation of duties keeps them from approving
    what they started, as it keeps the source's starter."""
    app = make_app()

    @app.workflow()
    async def release() -> str:
        decision = await tether.approval("Ship?", "", operation={"tool": "ship"},
                                         reviewers=["alice", "root"],
                                         separate_duties=True)  # fmt: skip
        return decision.status

    async with app:
        await app.start(release, id="src", started_by="alice")
        async with asyncio.timeout(20):
            while not await app.list_approvals(run_id="src"):
                await asyncio.sleep(0.02)
        fork = await app.fork("src", "approval", id="forked", started_by="root")
        async with asyncio.timeout(20):
            while not (asks := await app.list_approvals(run_id="forked")):
                await asyncio.sleep(0.02)
        with pytest.raises(tether.ApprovalRefused, match="separation of duties"):
            await app.decide(asks[0].id, "approve", reviewer="root",
                             operation_digest=asks[0].operation_digest)  # fmt: skip
        await app.decide(asks[0].id, "approve", reviewer="alice",
                         operation_digest=asks[0].operation_digest)  # fmt: skip
        assert await fork.result(timeout=20) == "approved"


async def test_an_unfinished_run_can_be_forked_and_is_left_as_it_was(make_app: MakeApp) -> None:
    app = make_app()

    runs: Counter[str] = Counter()

    @app.step()
    async def prepare() -> int:
        runs["prepare"] += 1
        return 5

    @app.step()
    async def check(n: int) -> int:
        runs["check"] += 1
        return n

    @app.workflow()
    async def waiter() -> int:
        n = await check(await prepare())
        extra = await tether.wait_for_event("go")
        return n + int(extra)

    async with app:
        source = await app.start(waiter, id="w")
        async with asyncio.timeout(20):
            while len(await source.checkpoints()) < 2:
                await asyncio.sleep(0.02)
        history = await source.checkpoints()
        fork = await app.fork("w", "check")
        await app.send(fork.id, "go", 1)
        assert await fork.result(timeout=20) == 6
        assert not (await source.status()).terminal
        assert await source.checkpoints() == history
        await app.send("w", "go", 2)
        assert await source.result(timeout=20) == 7
    assert runs == Counter(prepare=1, check=2)


async def test_a_forks_streams_hold_only_what_the_fork_wrote(make_app: MakeApp) -> None:
    app = make_app()

    @app.step()
    async def middle() -> None:
        return None

    @app.workflow()
    async def chat() -> None:
        await tether.stream("out").write("before")
        await middle()
        await tether.stream("out").write("after")

    async def chunks(run_id: str) -> list[object]:
        async with asyncio.timeout(20):
            return [chunk async for _, chunk in app.read_stream(run_id, "out")]

    async with app:
        await (await app.start(chat, id="chat")).result(timeout=20)
        fork = await app.fork("chat", "middle")
        await fork.result(timeout=20)
        assert await chunks("chat") == ["before", "after"]
        assert await chunks(fork.id) == ["after"]


# -- the store operation, on every backend -----------------------------------------------------


def done(seq: int, name: str, kind: str = "step", result: str = "1") -> Checkpoint:
    return Checkpoint(seq, name, kind, CheckpointStatus.COMPLETED, result=result, attempts=1)


async def claim(store: Store, now: float) -> dict[str, Lease]:
    """Claim every runnable run: their leases by run id."""
    claimed = await store.claim_runs("w1", ["wf"], now, now + 60, 10)
    return {r.id: Lease(r.id, "w1", r.epoch) for r in claimed}


async def taken(store: Store, lease: Lease, key: str, seq: int) -> list[str]:
    """The payloads of the events under `key` the run's mailbox holds, taking them all."""
    found = []
    while (got := await store.take_event(lease, [key], done(seq, f"t{seq}"), 9.0)) is not None:
        found.append(json.loads(got)["value"])
        seq += 1
    return found


async def test_fork_run_copies_history_values_and_untaken_events_in_one_go(
    make_store: Callable[[], Store],
) -> None:
    store = make_store()
    await store.open()
    try:
        await store.create_run(NewRun("src", "wf", "[]"), 1.0)
        lease = (await claim(store, 1.0))["src"]
        for payload in ('"one"', '"two"'):
            await store.deliver_event("src", "e", payload, 1.5)
        await store.deliver_event("src", "tether:internal", "null", 1.5)
        await store.write_checkpoint(lease, done(0, "a"), 2.0)
        await store.set_value(lease, "k", '"first"', done(1, "value:k", "value"), 2.0)
        assert await store.take_event(lease, ["e"], done(2, "event:e", "event"), 2.0)
        await store.set_value(lease, "k", '"second"', done(3, "value:k#2", "value"), 2.0)
        history = await store.load_history("src")
        link = ForkRecord("f1", "src", "value:k#2", 3, 5.0)
        child_end = ("tether:child:c", '{"status": "succeeded"}')
        record, created = await store.fork_run(
            NewRun("f1", "wf", "[]", priority=3, started_by="ann"), link, history[:3],
            [child_end], 5.0,
        )  # fmt: skip
        assert created
        assert (record.id, record.status, record.priority, record.started_by, record.epoch) == (
            "f1", tether.RunStatus.PENDING, 3, "ann", 0,
        )  # fmt: skip
        assert await store.load_history("f1") == history[:3]
        value = await store.get_value("f1", "k")
        assert value is not None
        assert (value.value, value.version, value.seq) == ('"first"', 1, 1)
        assert await store.get_fork("f1") == link
        assert await store.get_fork("src") is None
        # The same id again writes nothing, whatever it is given.
        again, created = await store.fork_run(NewRun("f1", "wf", "[]"), link, [], [], 6.0)
        assert (again.id, created, again.priority) == ("f1", False, 3)
        assert len(await store.load_history("f1")) == 3
        # A second fork, from the very start: every event the source took is untaken here.
        start = ForkRecord("f2", "src", "a", 0, 7.0)
        await store.fork_run(NewRun("f2", "wf", "[]"), start, [], [], 7.0)
        assert await store.load_history("f2") == []
        assert await store.get_value("f2", "k") is None
        assert [f.run_id for f in await store.list_forks("src")] == ["f1", "f2"]
        assert await store.list_forks("f1") == []
        # The mailboxes: the event that no copied checkpoint took, the child's end, nothing
        # of Tether's own keys; the source's mailbox is as it was.
        leases = await claim(store, 8.0)
        assert await taken(store, leases["f1"], "e", 10) == ["two"]
        assert await taken(store, leases["f1"], "tether:child:c", 20) == [{"status": "succeeded"}]
        assert await taken(store, leases["f1"], "tether:internal", 30) == []
        assert await taken(store, leases["f2"], "e", 10) == ["one", "two"]
        assert await taken(store, lease, "e", 40) == ["two"]
    finally:
        await store.close()


# -- the command line, on a real SQLite file ---------------------------------------------------

FLOW_MODULE = """
import tether

app = tether.App({url!r}, max_executions=1)
RUNS = {{"load": 0, "compute": 0}}
FIXED = {{"yes": False}}

@app.step()
async def load() -> {hint}:
    RUNS["load"] += 1
    return 20

@app.step(retry=tether.NO_RETRY)
async def compute(x: int) -> int:
    RUNS["compute"] += 1
    if not FIXED["yes"]:
        raise ValueError("bug in compute")
    return x + 1

@app.workflow()
async def job() -> int:
    x = await load()
    await tether.wait_for_event("go")
    return await compute(x)
"""

ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TETHER_DATABASE_URL": None}


@dataclass
class Cli:
    """`tether runs --app <module>:app ...` for a module written by the `flows` fixture."""

    module: str

    def __call__(self, *args: str) -> Result:
        return CliRunner().invoke(cli, ["runs", "--app", f"{self.module}:app", *args], env=ENV,
                                  catch_exceptions=False)  # fmt: skip

    @property
    def code(self) -> Any:
        return sys.modules[self.module]


@pytest.fixture
def flows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], Cli]]:
    """Write a module holding `job` (whose `load` step returns the given type) on one SQLite
    file, import it, and give a command line runner whose --app is that module: two calls
    are two deploys of the code on the same database."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    url = f"sqlite:///{tmp_path}/cli.db"
    made: list[str] = []

    def write(hint: str) -> Cli:
        name = f"fork_flows_{len(made)}_{abs(hash(str(tmp_path)))}"
        (tmp_path / f"{name}.py").write_text(FLOW_MODULE.format(url=url, hint=hint))
        made.append(name)
        __import__(name)
        return Cli(name)

    yield write
    for name in made:
        sys.modules.pop(name, None)


async def outcome(app: tether.App, run_id: str, *, go: bool = False) -> tuple[str, object]:
    """Let the App's worker execute the run until it ends (sending it "go" first if asked):
    (its status, its result or error)."""
    async with app:
        handle = await app.get(run_id)
        if go:
            await app.send(run_id, "go")
        try:
            return "succeeded", await handle.result(timeout=20)
        except tether.RunFailed as exc:
            return (await handle.status()).value, exc.error


async def failed_run(app: tether.App, run_id: str) -> tuple[str, object]:
    async with app:
        await app.start("job", id=run_id)
    return await outcome(app, run_id, go=True)


async def until_waiting(app: tether.App, run_id: str) -> None:
    """Start `job` and stop the worker once `load` is recorded (the run is released)."""
    async with app:
        handle = await app.start("job", id=run_id)
        async with asyncio.timeout(20):
            while not await handle.checkpoints():
                await asyncio.sleep(0.01)


def test_runs_fork_starts_a_fork_that_runs_show_links_both_ways(
    flows: Callable[[str], Cli],
) -> None:
    run = flows("int")
    assert asyncio.run(failed_run(run.code.app, "src"))[0] == "failed"
    run.code.FIXED["yes"] = True
    forked = run("fork", "src", "--from-step", "compute", "--id", "src-fix", "--json")
    assert forked.exit_code == 0, forked.output
    doc = json.loads(forked.stdout)
    assert (doc["id"], doc["status"]) == ("src-fix", "pending")
    assert doc["forked_from"]["source_run_id"] == "src"
    assert doc["forked_from"]["from_step"] == "compute"
    assert asyncio.run(outcome(run.code.app, "src-fix")) == ("succeeded", 21)
    assert run.code.RUNS == {"load": 1, "compute": 2}  # load and the wait were reused
    shown = run("show", "src-fix")
    assert shown.exit_code == 0, shown.output
    link = next(ln for ln in shown.stdout.splitlines() if ln.startswith("forked from "))
    assert link.removeprefix("forked from ").strip() == "src at step compute"
    source = run("show", "src")
    forks = next(ln for ln in source.stdout.splitlines() if ln.startswith("forks "))
    assert forks.split(None, 1)[1].strip() == "src-fix (from step compute)"
    as_json = json.loads(run("show", "src", "--json").stdout)
    assert [f["run_id"] for f in as_json["forks"]] == ["src-fix"]
    assert as_json["forked_from"] is None
    plain = run("fork", "src", "--from-step", "load")
    assert plain.exit_code == 0, plain.output
    assert "forked from 'src' at step 'load': pending" in plain.stdout


def test_runs_fork_of_a_step_the_run_did_not_record_lists_its_steps(
    flows: Callable[[str], Cli],
) -> None:
    run = flows("int")
    asyncio.run(failed_run(run.code.app, "src"))
    result = run("fork", "src", "--from-step", "nope")
    assert result.exit_code == 1
    assert "recorded no step 'nope'" in result.output
    assert "its steps are: load, event:go, compute" in result.output
    assert "Traceback" not in result.output
    missing = run("fork", "ghost", "--from-step", "load")
    assert missing.exit_code == 1
    assert "no run has id 'ghost'" in missing.output


def test_runs_show_lists_the_values_a_run_published(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/values.db"
    app = tether.App(url)

    @app.workflow()
    async def publish() -> None:
        await tether.set_value("progress", {"done": 1})
        await tether.set_value("progress", {"done": 2, "token": "sk-" + "a" * 30})

    async def go() -> None:
        async with app:
            await (await app.start(publish, id="pub")).result(timeout=20)

    asyncio.run(go())
    env = {**ENV, "TETHER_DATABASE_URL": url}
    shown = CliRunner().invoke(cli, ["runs", "show", "pub"], env=env, catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    line = next(ln.split() for ln in shown.stdout.splitlines() if ln.split()[:1] == ["progress"])
    assert line[:2] == ["progress", "2"]
    assert "sk-aaaa" not in shown.stdout  # what people read is redacted
    as_json = CliRunner().invoke(cli, ["runs", "show", "pub", "--json"], env=env)
    values = json.loads(as_json.stdout)["values"]
    assert values["progress"]["version"] == 2
    assert values["progress"]["value"]["done"] == 2


def test_runs_resume_continues_a_failed_run_after_a_fix_without_redoing_its_steps(
    flows: Callable[[str], Cli],
) -> None:
    run = flows("int")
    status, error = asyncio.run(failed_run(run.code.app, "r1"))
    assert status == "failed"
    assert isinstance(error, dict)
    assert error["message"] == "bug in compute"
    run.code.FIXED["yes"] = True
    resumed = run("resume", "r1")
    assert resumed.exit_code == 0, resumed.output
    assert "pending" in resumed.stdout
    assert asyncio.run(outcome(run.code.app, "r1")) == ("succeeded", 21)
    assert run.code.RUNS == {"load": 1, "compute": 2}


def test_runs_resume_continues_a_dead_run_after_a_fix_without_redoing_its_steps(
    flows: Callable[[str], Cli],
) -> None:
    good = flows("int")
    good.code.FIXED["yes"] = True
    asyncio.run(until_waiting(good.code.app, "d1"))
    # A deploy whose code reads the recorded result of `load` (an int) as a list of str: the
    # execution fails outside the workflow's code and, with max_executions=1, the run is dead.
    bad = flows("list[str]")
    status, error = asyncio.run(outcome(bad.code.app, "d1", go=True))
    assert status == "dead", error
    assert "dead-lettered" in good("show", "d1").stdout
    resumed = good("resume", "d1")  # after deploying the good code again
    assert resumed.exit_code == 0, resumed.output
    assert "pending" in resumed.stdout
    assert asyncio.run(outcome(good.code.app, "d1")) == ("succeeded", 21)
    assert good.code.RUNS == {"load": 1, "compute": 1}
    assert bad.code.RUNS == {"load": 0, "compute": 0}
    again = good("resume", "d1")
    assert again.exit_code == 1
    assert "only a failed, dead or held run can be resumed" in again.output

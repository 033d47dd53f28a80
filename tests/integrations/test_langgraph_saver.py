"""TetherSaver under real LangGraph graphs, on SQLite files and PostgreSQL schemas: a graph
killed by an exception resumes from its checkpoint, history, deletion, copies, incremental
storage of channel values, retention, no pickle anywhere, concurrency, and the database shared
with the App."""

from __future__ import annotations

import asyncio
import operator
import pickle
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import closing
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

import psycopg
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from tests.postgres_server import with_schema

import tether
from tether.errors import ConfigurationError
from tether.integrations.langgraph import TetherSaver
from tether.store.drivers.sqlite import parse_sqlite_url
from tether.store.postgres import parse_postgres_url

Config = dict[str, Any]


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/app.db"
    return with_schema(request.getfixturevalue("postgres_url"), f"lg_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def saver(url: str) -> Iterator[TetherSaver]:
    with TetherSaver.from_url(url) as made:
        yield made


@pytest.fixture
async def asaver(url: str) -> AsyncIterator[TetherSaver]:
    async with TetherSaver.from_url(url) as made:
        yield made


def rows(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Query the saver's tables directly (`%s` placeholders)."""
    if url.startswith("sqlite:"):
        with closing(sqlite3.connect(parse_sqlite_url(url)[0])) as conn:
            return conn.execute(sql.replace("%s", "?"), params).fetchall()
    conninfo, schema = parse_postgres_url(url)
    with psycopg.connect(conninfo) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]


def thread_rows(url: str, thread_id: str) -> dict[str, int]:
    return {
        table: rows(url, f"SELECT count(*) FROM tether_lg_{table} WHERE thread_id = %s", thread_id)[
            0
        ][0]
        for table in ("checkpoints", "blobs", "writes")
    }


def config(thread_id: str) -> Config:
    return {"configurable": {"thread_id": thread_id}}


def run_config(thread_id: str, run_id: str) -> Config:
    return {"configurable": {"thread_id": thread_id, "run_id": run_id}}


# -- a three-node pipeline that can be made to fail in its middle node --------------------------


class Pipeline(TypedDict, total=False):
    topic: str
    notes: Annotated[list[str], operator.add]
    draft: str
    summary: str


def pipeline(ran: list[str], fail_in: set[str] | None = None) -> Any:
    fail_in = fail_in if fail_in is not None else set()

    def research(state: Pipeline) -> Pipeline:
        ran.append("research")
        return {"notes": [f"facts about {state['topic']}"]}

    def write(state: Pipeline) -> Pipeline:
        ran.append("write")
        if "write" in fail_in:
            fail_in.discard("write")  # fails once, like a process killed mid-step
            raise RuntimeError("killed while writing")
        return {"draft": " / ".join(state["notes"]), "notes": ["drafted"]}

    def summarize(state: Pipeline) -> Pipeline:
        ran.append("summarize")
        return {"summary": state["draft"].upper()}

    graph = StateGraph(Pipeline)
    graph.add_node("research", research)
    graph.add_node("write", write)
    graph.add_node("summarize", summarize)
    graph.add_edge(START, "research")
    graph.add_edge("research", "write")
    graph.add_edge("write", "summarize")
    graph.add_edge("summarize", END)
    return graph


def test_a_graph_killed_mid_run_resumes_from_its_checkpoint_in_a_new_saver(url: str) -> None:
    ran: list[str] = []
    with TetherSaver.from_url(url) as first:
        graph = pipeline(ran, fail_in={"write"}).compile(checkpointer=first)
        with pytest.raises(RuntimeError, match="killed while writing"):
            graph.invoke({"topic": "tides"}, config("t-1"), durability="sync")
        state = graph.get_state(config("t-1"))
        assert state.next == ("write",)
        assert state.values["notes"] == ["facts about tides"]
    assert ran == ["research", "write"]

    with TetherSaver.from_url(url) as second:  # as a new process would: only the database remains
        graph = pipeline(ran).compile(checkpointer=second)
        result = graph.invoke(None, config("t-1"), durability="sync")
    assert ran == ["research", "write", "write", "summarize"]  # research never ran again
    assert result["summary"] == "FACTS ABOUT TIDES"
    assert result["notes"] == ["facts about tides", "drafted"]


async def test_an_async_graph_killed_mid_run_resumes_from_its_checkpoint(
    asaver: TetherSaver,
) -> None:
    ran: list[str] = []
    fail_in = {"write"}
    graph = pipeline(ran, fail_in).compile(checkpointer=asaver)
    with pytest.raises(RuntimeError):
        await graph.ainvoke({"topic": "moss"}, config("t-a"), durability="sync")
    result = await graph.ainvoke(None, config("t-a"), durability="sync")
    assert ran == ["research", "write", "write", "summarize"]
    assert result["summary"] == "FACTS ABOUT MOSS"


def test_state_history_lists_every_checkpoint_newest_first(saver: TetherSaver) -> None:
    graph = pipeline([]).compile(checkpointer=saver)
    graph.invoke({"topic": "rain"}, config("t-h"), durability="sync")
    history = list(graph.get_state_history(config("t-h")))
    steps = [snapshot.metadata["step"] for snapshot in history]  # type: ignore[index]
    assert steps == [3, 2, 1, 0, -1]
    assert history[0].values["summary"] == "FACTS ABOUT RAIN"
    assert history[-1].next == ("__start__",)  # the input checkpoint, before START ran
    assert "topic" not in history[-1].values
    parents = [s.parent_config["configurable"]["checkpoint_id"] for s in history[:-1]]  # type: ignore[index]
    assert parents == [s.config["configurable"]["checkpoint_id"] for s in history[1:]]
    inputs = list(graph.get_state_history(config("t-h"), filter={"source": "input"}))
    assert [s.metadata["step"] for s in inputs] == [-1]  # type: ignore[index]
    older = list(graph.get_state_history(config("t-h"), before=history[1].config, limit=2))
    assert [s.metadata["step"] for s in older] == [1, 0]  # type: ignore[index]
    # A filter the database cannot compare (a dict) is applied in Python, limit included.
    loops = list(saver.list(config("t-h"), filter={"parents": {}, "source": "loop"}, limit=2))
    assert [t.metadata["step"] for t in loops] == [3, 2]


def test_delete_thread_removes_its_checkpoints_values_and_writes_only(
    saver: TetherSaver, url: str
) -> None:
    graph = pipeline([]).compile(checkpointer=saver)
    for thread in ("t-del", "t-keep"):
        graph.invoke({"topic": thread}, config(thread), durability="sync")
    assert all(thread_rows(url, "t-del").values())
    saver.delete_thread("t-del")
    assert thread_rows(url, "t-del") == {"checkpoints": 0, "blobs": 0, "writes": 0}
    assert graph.get_state(config("t-del")).values == {}
    assert graph.get_state(config("t-keep")).values["summary"] == "FACTS ABOUT T-KEEP"


def test_copy_thread_gives_the_target_the_same_history(saver: TetherSaver) -> None:
    graph = pipeline([]).compile(checkpointer=saver)
    graph.invoke({"topic": "sand"}, config("t-src"), durability="sync")
    saver.copy_thread("t-src", "t-dst")
    source = list(graph.get_state_history(config("t-src")))
    target = list(graph.get_state_history(config("t-dst")))
    assert [s.values for s in target] == [s.values for s in source]
    assert [s.config["configurable"]["thread_id"] for s in target] == ["t-dst"] * len(source)


# -- incremental storage -------------------------------------------------------------------------


class Big(TypedDict, total=False):
    corpus: list[str]
    seen: list[str]
    counter: int


def counting_graph(saver: TetherSaver, nodes: int = 4) -> Any:
    graph = StateGraph(Big)
    previous = START
    for i in range(nodes):
        graph.add_node(
            f"count{i}",
            lambda state, i=i: {"counter": state["counter"] + 1,
                                "seen": [*state.get("seen", []), f"count{i}"]},
        )  # fmt: skip
        graph.add_edge(previous, f"count{i}")
        previous = f"count{i}"
    graph.add_edge(previous, END)
    return graph.compile(checkpointer=saver)


def test_a_channel_value_is_written_only_when_its_version_changes(
    saver: TetherSaver, url: str
) -> None:
    graph = counting_graph(saver)
    corpus = [f"page {i}" * 50 for i in range(200)]
    graph.invoke({"corpus": corpus, "seen": [], "counter": 0}, config("t-inc"), durability="sync")
    counted = rows(
        url, "SELECT channel, count(*) FROM tether_lg_blobs WHERE thread_id = %s GROUP BY channel",
        "t-inc",
    )  # fmt: skip
    per_channel = dict(counted)
    assert per_channel["corpus"] == 1  # written once, though 5 checkpoints hold it
    assert per_channel["seen"] == 5  # the input, then once per node: it changes every step
    assert "counter" not in per_channel  # a small number rides in the checkpoint's row
    assert (
        rows(url, "SELECT count(*) FROM tether_lg_checkpoints WHERE thread_id = %s", "t-inc")[0][0]
        == 6
    )
    for snapshot in graph.get_state_history(config("t-inc")):
        step = snapshot.metadata["step"]  # type: ignore[index]
        if step >= 0:
            assert snapshot.values["corpus"] == corpus  # reassembled from the one blob
            assert snapshot.values["counter"] == step
            assert len(snapshot.values["seen"]) == step


# -- serialization: never pickle -----------------------------------------------------------------


class OnlyPickles:
    """A plain object: pickle can store it, msgpack cannot."""

    def __init__(self) -> None:
        self.payload = 42


class Evil(TypedDict, total=False):
    thing: Any


def test_a_value_only_pickle_could_store_is_refused_and_nothing_is_pickled(
    saver: TetherSaver, url: str
) -> None:
    pickle.dumps(OnlyPickles())  # pickle would take it
    graph = StateGraph(Evil)
    graph.add_node("make", lambda state: {"thing": OnlyPickles()})
    graph.add_edge(START, "make")
    graph.add_edge("make", END)
    compiled = graph.compile(checkpointer=saver)
    with pytest.raises(TypeError, match="not msgpack serializable"):
        compiled.invoke({"thing": 1}, config("t-pickle"), durability="sync")
    for table in ("blobs", "writes"):
        assert rows(url, f"SELECT count(*) FROM tether_lg_{table} WHERE type = 'pickle'") == [(0,)]
    assert rows(
        url, "SELECT count(*) FROM tether_lg_checkpoints WHERE checkpoint_type = 'pickle'"
    ) == [(0,)]


def test_a_serde_that_falls_back_to_pickle_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="never stores pickles"):
        TetherSaver.from_url(
            f"sqlite:///{tmp_path}/x.db", serde=JsonPlusSerializer(pickle_fallback=True)
        )
    assert TetherSaver.from_url(f"sqlite:///{tmp_path}/x.db").serde.pickle_fallback is False  # type: ignore[attr-defined]


class XorCipher:
    """A toy cipher (CipherProtocol), enough to see that the saver's serde does the encoding."""

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return "xor", bytes(b ^ 0x5A for b in plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        assert ciphername == "xor"
        return bytes(b ^ 0x5A for b in ciphertext)


def test_the_savers_serde_encodes_every_value_and_checkpoint(url: str) -> None:
    with TetherSaver.from_url(url, serde=EncryptedSerializer(XorCipher())) as saver:
        graph = counting_graph(saver, nodes=2)
        graph.invoke({"corpus": ["secret plans"], "counter": 0}, config("t-enc"))
        assert graph.get_state(config("t-enc")).values["corpus"] == ["secret plans"]
    for table, column in (("blobs", "type"), ("writes", "type"),
                          ("checkpoints", "checkpoint_type")):  # fmt: skip
        types = {r[0] for r in rows(url, f"SELECT DISTINCT {column} FROM tether_lg_{table}")}
        assert types, table
        assert all(t.endswith("+xor") for t in types), (table, types)
    stored = rows(url, "SELECT blob FROM tether_lg_blobs WHERE channel = 'corpus'")
    assert b"secret plans" not in bytes(stored[0][0])


unpickled: list[str] = []


def record_unpickling(note: str) -> None:
    unpickled.append(note)


class Tripwire:
    """Unpickling it calls record_unpickling: proof that a pickle was loaded."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (record_unpickling, ("unpickled!",))


def test_a_pickle_planted_in_the_database_is_never_loaded(saver: TetherSaver, url: str) -> None:
    graph = counting_graph(saver, nodes=1)
    graph.invoke({"corpus": [], "counter": 0}, config("t-plant"), durability="sync")
    planted = pickle.dumps(Tripwire())
    if url.startswith("sqlite:"):
        with closing(sqlite3.connect(parse_sqlite_url(url)[0])) as conn, conn:
            conn.execute("UPDATE tether_lg_blobs SET type = 'pickle', blob = ?", (planted,))
    else:
        conninfo, schema = parse_postgres_url(url)
        with psycopg.connect(conninfo) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            conn.execute("UPDATE tether_lg_blobs SET type = 'pickle', blob = %s", (planted,))
    with pytest.raises(NotImplementedError, match="Unknown serialization type: pickle"):
        saver.get_tuple(config("t-plant"))
    assert unpickled == []


# -- retention -----------------------------------------------------------------------------------


def test_prune_keep_latest_leaves_one_checkpoint_and_only_the_values_it_uses(
    saver: TetherSaver, url: str
) -> None:
    graph = counting_graph(saver)
    graph.invoke({"corpus": ["kept"], "counter": 0}, config("t-prune"), durability="sync")
    graph.invoke({"corpus": ["other"], "counter": 0}, config("t-other"), durability="sync")
    before = graph.get_state(config("t-prune")).values
    saver.prune(["t-prune"], strategy="keep_latest")
    assert graph.get_state(config("t-prune")).values == before
    assert thread_rows(url, "t-prune")["checkpoints"] == 1
    versions = rows(url, "SELECT channel FROM tether_lg_blobs WHERE thread_id = %s", "t-prune")
    assert sorted(v[0] for v in versions) == ["corpus", "seen"]
    assert thread_rows(url, "t-other")["checkpoints"] == 6
    with pytest.raises(ValueError, match="unknown prune strategy"):
        saver.prune(["t-other"], strategy="keep_some")


class Chat(TypedDict, total=False):
    messages: Annotated[
        list[str], DeltaChannel(lambda state, writes: [*state, *(m for ms in writes for m in ms)])
    ]


def test_prune_keeps_the_ancestors_a_delta_channel_is_rebuilt_from(saver: TetherSaver) -> None:
    graph = StateGraph(Chat)
    for i in range(5):
        graph.add_node(f"say{i}", lambda state, i=i: {"messages": [f"m{i}"]})
    graph.add_edge(START, "say0")
    for i in range(4):
        graph.add_edge(f"say{i}", f"say{i + 1}")
    graph.add_edge("say4", END)
    compiled = graph.compile(checkpointer=saver)
    compiled.invoke({"messages": ["hi"]}, config("t-delta"), durability="sync")
    before = compiled.get_state(config("t-delta")).values
    assert before["messages"] == ["hi", "m0", "m1", "m2", "m3", "m4"]
    saver.prune(["t-delta"], strategy="keep_latest")
    assert compiled.get_state(config("t-delta")).values == before
    saver.prune(["t-delta"], strategy="delete")
    assert compiled.get_state(config("t-delta")).values == {}


def test_delete_for_runs_removes_a_runs_checkpoints_and_the_values_left_unused(
    saver: TetherSaver, url: str
) -> None:
    graph = counting_graph(saver, nodes=2)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    # LangGraph copies a run id given in the configurable into each checkpoint's metadata.
    graph.invoke({"corpus": ["a"], "counter": 0}, run_config("t-runs", first))
    kept = graph.get_state(config("t-runs")).values
    graph.invoke({"corpus": ["b"], "counter": 5}, run_config("t-runs", second))
    saver.delete_for_runs([second])
    assert graph.get_state(config("t-runs")).values == kept
    corpora = rows(url, "SELECT count(*) FROM tether_lg_blobs WHERE thread_id = %s "
                        "AND channel = 'corpus'", "t-runs")  # fmt: skip
    assert corpora == [(1,)]


# -- the database shared with the App; connections ----------------------------------------------


async def test_tether_saver_of_an_app_keeps_its_tables_in_the_apps_database(tmp_path: Path) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/shared.db")

    @app.workflow()
    async def noop() -> int:
        return 1

    async with app:
        assert await (await app.start("noop")).result(timeout=10) == 1
        async with TetherSaver(app) as saver:
            graph = pipeline([]).compile(checkpointer=saver)
            await graph.ainvoke({"topic": "shared"}, config("t-app"))
    tables = {r[0] for r in rows(app.url, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"tether_runs", "tether_migrations", "tether_lg_checkpoints", "tether_lg_blobs",
            "tether_lg_writes", "tether_lg_migrations"} <= tables  # fmt: skip
    assert rows(app.url, "PRAGMA journal_mode") == [("wal",)]


def test_an_app_without_a_database_has_no_place_for_checkpoints() -> None:
    with pytest.raises(ConfigurationError, match="keeps none"):
        TetherSaver(tether.App("memory://"))
    with pytest.raises(ConfigurationError, match="unknown database URL"):
        TetherSaver.from_url("mysql://db")


def test_migrations_run_once_however_many_savers_open_the_database(url: str) -> None:
    savers = [TetherSaver.from_url(url) for _ in range(4)]
    threads = [threading.Thread(target=s.get_tuple, args=(config("x"),)) for s in savers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for made in savers:
        made.close()
    assert rows(url, "SELECT version FROM tether_lg_migrations") == [(1,)]


async def test_sync_methods_called_inside_a_running_loop_do_not_deadlock(url: str) -> None:
    async with TetherSaver.from_url(url) as saver:
        graph = pipeline([]).compile(checkpointer=saver)
        graph.invoke({"topic": "loop"}, config("t-loop"), durability="sync")  # blocks, briefly
        assert saver.get_tuple(config("t-loop")) is not None
        assert len(list(saver.list(config("t-loop")))) == 5
        saver.delete_thread("t-loop")
        assert await saver.aget_tuple(config("t-loop")) is None


def test_versions_increase_and_sort_as_text(tmp_path: Path) -> None:
    saver = TetherSaver.from_url(f"sqlite:///{tmp_path}/v.db")
    versions = [saver.get_next_version(None, None)]
    for _ in range(12):
        versions.append(saver.get_next_version(versions[-1], None))
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)
    assert saver.get_next_version(7, None).startswith(f"{8:032}.")  # type: ignore[arg-type]


# -- concurrency: group commits --------------------------------------------------------------------


def test_graphs_in_many_threads_share_commits_and_lose_nothing(saver: TetherSaver) -> None:
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        graph = counting_graph(saver, nodes=3)
        try:
            for i in range(5):
                graph.invoke({"corpus": [str(worker)], "counter": i}, config(f"w{worker}-{i}"),
                             durability="sync")  # fmt: skip
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    graph = counting_graph(saver, nodes=3)
    for worker in range(8):
        for i in range(5):
            state = graph.get_state(config(f"w{worker}-{i}")).values
            assert state == {"corpus": [str(worker)], "counter": i + 3,
                             "seen": ["count0", "count1", "count2"]}  # fmt: skip


async def test_one_failing_write_in_a_shared_commit_fails_alone(asaver: TetherSaver) -> None:
    graph = counting_graph(asaver, nodes=1)
    await graph.ainvoke({"corpus": [], "counter": 0}, config("t-batch"))
    base = (await asaver.aget_tuple(config("t-batch"))).config  # type: ignore[union-attr]

    async def put(task: int, value: Any) -> None:
        await asaver.aput_writes(base, [("counter", value)], f"task-{task}")

    outcomes = await asyncio.gather(
        *(put(i, OnlyPickles() if i == 3 else i) for i in range(10)), return_exceptions=True
    )
    assert [type(o).__name__ for o in outcomes].count("TypeError") == 1
    assert isinstance(outcomes[3], TypeError)
    stored = await asaver.aget_tuple(base)
    assert stored is not None
    assert sorted(w[2] for w in stored.pending_writes or ()) == [0, 1, 2, 4, 5, 6, 7, 8, 9]


def test_the_example_resumes_its_graph_without_running_a_finished_node_again(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[2] / "examples" / "langgraph_example.py"
    out = subprocess.run(
        [sys.executable, str(example), "--db", f"sqlite:///{tmp_path}/example.db"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "nodes that ran overall: ['classify', 'draft', 'draft', 'send']" in out.stdout
    assert "tether_lg_checkpoints" in out.stdout


def test_a_new_saver_file_and_its_wal_and_shm_are_private_whatever_the_umask(
    tmp_path: Path,
) -> None:
    import os
    import stat

    path = tmp_path / "graph.db"
    old = os.umask(0o022)
    try:
        with TetherSaver.from_url(f"sqlite:///{path}") as made:
            from langgraph.checkpoint.base import empty_checkpoint

            made.put(config("t1"), empty_checkpoint(), {}, {})
            files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
            modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in files}
    finally:
        os.umask(old)
    assert modes == {"graph.db": 0o600, "graph.db-wal": 0o600, "graph.db-shm": 0o600}

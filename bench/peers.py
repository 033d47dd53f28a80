"""Tether beside its peers, measured in the same run on the same databases: DBOS
(dbos-transact-py), Absurd (its Python SDK, PostgreSQL only) and LangGraph's own checkpoint
savers. Prints steps per second, the raw commit rate of each database measured in the same run,
and Tether's ratio to each peer. Prints only; asserts nothing.

    python -m bench.peers [--quick] [--json] [--peers-python /tmp/peers-venv/bin/python]

Scenarios, each on a SQLite file (WAL, synchronous=FULL) and on one durable PostgreSQL cluster
made for the run (tests/postgres_server.py, fsync on, synchronous_commit=on):
- workflows of 10 trivial steps, each step checkpointed before the next starts, one workflow
  after another (sequential) and 200 started together (concurrent): Tether (bench.engine's
  make_app) against DBOS (bench/peers/dbos_steps.py, `async def` and plain `def`) and, on
  PostgreSQL, Absurd (bench/peers/absurd_steps.py: one async worker, and eight);
- a 10-node linear LangGraph graph, durability="sync", one invocation per thread id, sequential
  (invoke) and 200 at once (ainvoke): TetherSaver against SqliteSaver / AsyncSqliteSaver and
  PostgresSaver / AsyncPostgresSaver (bench/peers/langgraph_savers.py, whose graph and loops
  TetherSaver runs too).

Tether runs in this interpreter; each peer runs as a subprocess of the peers' interpreter (a
virtualenv outside the project; when it is missing the bench prints the commands that make one
and measures Tether alone), started once per scenario and warmed up once, then driven in turns
(bench/peers/peer_protocol.py): every turn measures the database's raw commit rate (bench.engine's
and bench.postgres's functions), then gives each contender the same number of runs in rotating
order, so a disk whose speed drifts during the run slows them alike. Each contender has a file
(SQLite) or a database or schema (PostgreSQL) of its own per scenario. "x raw" is steps/s over the
raw commit rate (8 connections for the concurrent scenarios on PostgreSQL, as bench.postgres
does); "Tether / it" is Tether's steps/s over the peer's.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import queue
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.postgres_server import with_schema  # noqa: E402

from bench.engine import make_app  # noqa: E402
from bench.engine import raw_commit_rate as sqlite_raw_rate  # noqa: E402
from bench.postgres import raw_commit_rate as postgres_raw_rate  # noqa: E402
from bench.postgres import raw_parallel_rate, server  # noqa: E402

PEERS = ROOT / "bench" / "peers"
DEFAULT_PEERS_PYTHON = "/tmp/peers-venv/bin/python"
STEPS = 10
REPLY_TIMEOUT = 300.0  # seconds a peer may take for one turn
PEER_MODULES = {  # what each peer script needs in the peers' interpreter: (modules, packages)
    "dbos": (["dbos"], ["dbos"]),
    "absurd": (["absurd_sdk", "absurdctl", "psycopg"], ["absurd-sdk", "absurdctl"]),
    "langgraph-sqlite": (
        ["langgraph.checkpoint.sqlite", "aiosqlite"],
        ["langgraph", "langgraph-checkpoint-sqlite"],
    ),
    "langgraph-postgres": (
        ["langgraph.checkpoint.postgres", "psycopg_pool"],
        ["langgraph-checkpoint-postgres", "psycopg"],
    ),
}
CHECK = """
import importlib, json, sys
from importlib.metadata import version
found = {}
for peer, (modules, packages) in json.loads(sys.argv[1]).items():
    try:
        for name in modules:
            importlib.import_module(name)
        found[peer] = {p: version(p) for p in packages}
    except Exception as exc:
        found[peer] = repr(exc)
print(json.dumps(found))
"""


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


def setup_commands(python: str) -> str:
    venv = str(Path(python).parent.parent)
    langgraph = _version("langgraph")
    pin = "langgraph" if langgraph == "?" else f"langgraph=={langgraph}"  # the graph code alike
    return (
        f"python3 -m venv {venv}\n"
        f"{venv}/bin/pip install dbos absurd-sdk absurdctl {pin} langgraph-checkpoint-sqlite \\\n"
        "    langgraph-checkpoint-postgres 'psycopg[binary]' psycopg-pool aiosqlite"
    )


# -- contenders -------------------------------------------------------------------------------


@dataclass
class Entry:
    """One contender in one scenario: `run(n)` returns the seconds n runs took."""

    label: str
    run: Callable[[int], float]
    close: Callable[[], None]
    settings: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    tether: bool = False
    seconds: float = 0.0
    runs: int = 0
    error: str | None = None

    def steps_per_s(self) -> float | None:
        if self.error or not self.seconds:
            return None
        return self.runs * STEPS / self.seconds


class PeerFailed(RuntimeError):
    pass


class Peer:
    """A peer script under the peers' interpreter, driven line by line (peer_protocol.py)."""

    def __init__(self, python: str, script: str, args: list[str], folder: Path) -> None:
        self.errors = (folder / f"stderr-{time.monotonic_ns()}.txt").open("w+")
        self.proc = subprocess.Popen(
            [python, str(PEERS / script), "--serve", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
            text=True, cwd=folder, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: TextIO) -> None:
        for line in stream:
            if line.startswith("{"):  # libraries may print other lines
                self.lines.put(line)
        self.lines.put(None)

    def reply(self) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=REPLY_TIMEOUT)
        except queue.Empty:
            self.kill()
            raise PeerFailed(f"no answer in {REPLY_TIMEOUT:.0f} s: {self.stderr_tail()}") from None
        if line is None:
            self.proc.wait()
            raise PeerFailed(f"exited {self.proc.returncode}: {self.stderr_tail()}")
        return json.loads(line)

    def stderr_tail(self) -> str:
        self.errors.flush()
        self.errors.seek(0)
        lines = [line.strip() for line in self.errors.read().splitlines() if line.strip()]
        return " | ".join(lines[-3:]) or "(no stderr)"

    def entry(self) -> Entry:
        """Waits until the peer is warmed up; the entry it returns drives its turns."""
        ready = self.reply()

        def run(n: int) -> float:
            assert self.proc.stdin is not None
            self.proc.stdin.write(f"{n}\n")
            self.proc.stdin.flush()
            return float(self.reply()["seconds"])

        return Entry(ready["contender"], run, self.close, ready["settings"], ready["versions"])

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
        self.errors.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def tether_versions() -> dict[str, str]:
    return {"tether": _version("tether")}


def tether_engine(url: str, scenario: str) -> Entry:
    """bench.engine's workflow of 10 steps: app.start + result, alone or 200 together."""
    loop = asyncio.new_event_loop()
    app, ten = make_app(url)
    loop.run_until_complete(app.__aenter__())  # `async with app:` across the turns

    async def sequential(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            await (await app.start(ten, 0)).result()
        return time.perf_counter() - start

    async def concurrent(n: int) -> float:
        start = time.perf_counter()
        handles = await asyncio.gather(*(app.start(ten, i) for i in range(n)))
        results = await asyncio.gather(*(h.result() for h in handles))
        elapsed = time.perf_counter() - start
        assert results == [i + STEPS for i in range(n)]
        return elapsed

    def run(n: int) -> float:
        work = sequential if scenario == "sequential" else concurrent
        return loop.run_until_complete(work(n))

    def close() -> None:
        loop.run_until_complete(app.__aexit__(None, None, None))
        loop.close()

    run(1)  # warm up: schema, caches
    settings = sqlite_settings(url)
    return Entry("Tether, async def", run, close, settings, tether_versions(), tether=True)


def tether_saver(url: str, scenario: str, graphs: ModuleType) -> Entry:
    """TetherSaver in langgraph_savers.py's graph and loops: invoke, or ainvoke together."""
    from tether.integrations.langgraph import TetherSaver

    saver = TetherSaver.from_url(url)
    invocations = graphs.Invocations(graphs.linear_graph(saver))
    if scenario == "sequential":
        run: Callable[[int], float] = invocations.sequential
        close = saver.close
        how = "invoke"
    else:
        loop = asyncio.new_event_loop()

        def run(n: int) -> float:
            return loop.run_until_complete(invocations.concurrent(n))

        def close() -> None:
            loop.run_until_complete(saver.aclose())
            loop.close()

        how = "ainvoke"
    run(1)  # warm up
    versions = {**tether_versions(), "langgraph": _version("langgraph")}
    return Entry(f"TetherSaver, {how}", run, close, sqlite_settings(url), versions, tether=True)


def sqlite_settings(url: str) -> dict[str, Any]:
    """journal_mode as the file keeps it, synchronous as the URL asks (Tether applies it)."""
    if not url.startswith("sqlite:"):
        return {}
    path, _, query = url.removeprefix("sqlite:///").partition("?")
    conn = sqlite3.connect(path)
    (journal,) = conn.execute("PRAGMA journal_mode").fetchone()
    conn.close()
    return {"journal_mode": journal, "synchronous": query.partition("synchronous=")[2] or "FULL"}


def load_graphs() -> ModuleType | None:
    """bench/peers/langgraph_savers.py as a module (it imports langgraph, not tether)."""
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_peers_langgraph_savers", PEERS / "langgraph_savers.py"
        )
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    except ImportError:
        return None
    return module


# -- turns ------------------------------------------------------------------------------------


@dataclass
class Scenario:
    database: str  # "sqlite" or "postgresql"
    name: str  # "workflows, sequential", ...
    kind: str  # "sequential" or "concurrent"
    turns: list[int]  # runs per contender per turn
    raw: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # (commits, seconds)
    entries: list[Entry] = field(default_factory=list)
    skipped: dict[str, list[str]] = field(default_factory=dict)  # why: which contenders

    def raw_rate(self, which: str) -> float:
        samples = self.raw[which]
        return sum(n for n, _ in samples) / sum(s for _, s in samples)


def contest(
    scenario: Scenario,
    tether: list[Callable[[], Entry]],
    peers: list[tuple[str, Callable[[], Peer]]],
    raws: dict[str, Callable[[int], tuple[int, float]]],
) -> None:
    """Starts the peers together, opens Tether's entries once the peers are warmed up, then runs
    the turns and closes every contender."""

    def failed(label: str, exc: Exception) -> Entry:
        return Entry(label, lambda n: 0.0, lambda: None, error=str(exc))

    started: list[tuple[str, Peer]] = []
    for name, start in peers:
        try:
            started.append((name, start()))
        except Exception as exc:
            scenario.entries.append(failed(name, exc))
    for name, peer in started:
        try:
            scenario.entries.append(peer.entry())
        except Exception as exc:
            peer.kill()
            scenario.entries.append(failed(name, exc))
    for position, make in enumerate(tether):
        try:
            scenario.entries.insert(position, make())
        except Exception as exc:
            scenario.entries.insert(position, failed("Tether", exc))
            scenario.entries[position].tether = True
    try:
        scale = max(1, 6 // len(scenario.turns))  # 200 to 1,200 one-connection commits a turn
        for turn, runs in enumerate(scenario.turns):
            for which, raw in raws.items():
                scenario.raw.setdefault(which, []).append(raw(scale))
            k = turn % len(scenario.entries)
            for entry in scenario.entries[k:] + scenario.entries[:k]:
                if entry.error:
                    continue
                try:
                    entry.seconds += entry.run(runs)
                    entry.runs += runs
                except Exception as exc:
                    entry.error = f"turn {turn + 1}: {exc}"
    finally:
        for entry in scenario.entries:
            try:
                entry.close()
            except Exception as exc:
                entry.error = entry.error or f"closing: {exc}"


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Plan:
    seq_sqlite: list[int]
    seq_postgres: list[int]
    seq_graph: list[int]
    concurrent: list[int]


def plan(quick: bool) -> Plan:
    if quick:
        return Plan([10] * 5, [10] * 3, [10] * 3, [200])
    return Plan([20] * 10, [10] * 10, [10] * 10, [200, 200])


class Section:
    """Scenarios on one database: the peers it can run, where each contender keeps its data."""

    def __init__(
        self, folder: Path, python: str | None, peers: dict[str, Any], graphs: ModuleType | None
    ) -> None:
        self.folder, self.python, self.peers, self.graphs = folder, python, peers, graphs
        self.scenarios: list[Scenario] = []

    def peer(self, needs: str, script: str, args: list[str]) -> Callable[[], Peer] | str:
        """A peer's starter, or why it cannot start."""
        if self.python is None:
            return "no peers' interpreter"
        if not isinstance(self.peers.get(needs), dict):
            return str(self.peers.get(needs, f"{needs} is not checked"))
        python = self.python
        return lambda: Peer(python, script, args, self.folder)

    def run(
        self,
        scenario: Scenario,
        tether: Callable[[], Entry],
        peers: list[tuple[str, Callable[[], Peer] | str]],
        raws: dict[str, Callable[[int], tuple[int, float]]],
    ) -> None:
        starters = []
        for name, starter in peers:
            if isinstance(starter, str):
                scenario.skipped.setdefault(starter, []).append(name)
            else:
                starters.append((name, starter))
        contest(scenario, [tether], starters, raws)
        self.scenarios.append(scenario)

    def graph_scenario(self, database: str, kind: str, turns: list[int]) -> Scenario | None:
        how = "invoke" if kind == "sequential" else "ainvoke together"
        s = Scenario(database, f"LangGraph, {STEPS}-node graph, {how}", kind, turns)
        if self.graphs is None:
            s.skipped["not installed in the project's interpreter"] = ["LangGraph"]
            self.scenarios.append(s)
            return None
        return s


def sqlite_section(section: Section, p: Plan) -> None:
    root = section.folder / "sqlite"
    root.mkdir()
    count = iter(range(10**6))

    def raw(scale: int) -> tuple[int, float]:
        sub = root / f"raw-{next(count)}"  # bench.engine's raw_commit_rate wants a new folder
        sub.mkdir()
        n = 200 * scale
        return n, n / sqlite_raw_rate(sub, n)

    def url(name: str) -> str:
        return f"sqlite:///{root / name}?synchronous=FULL"

    for kind, turns in (("sequential", p.seq_sqlite), ("concurrent", p.concurrent)):
        s = Scenario("sqlite", f"workflows of {STEPS} steps, {kind}", kind, turns)
        peers = [
            (f"DBOS {api}", section.peer("dbos", "dbos_steps.py", [
                "--url", f"sqlite:///{root / f'dbos-{api}-{kind}.db'}", "--scenario", kind,
                "--api", api,
            ]))
            for api in ("async", "sync")
        ]  # fmt: skip
        section.run(s, lambda kind=kind: tether_engine(url(f"tether-{kind}.db"), kind), peers,
                    {"1": raw})  # fmt: skip
    for kind, turns in (("sequential", p.seq_graph), ("concurrent", p.concurrent)):
        s = section.graph_scenario("sqlite", kind, turns)
        if s is None:
            continue
        saver = section.peer("langgraph-sqlite", "langgraph_savers.py", [
            "--saver", "sqlite", "--url", str(root / f"langgraph-{kind}.db"), "--scenario", kind,
        ])  # fmt: skip
        section.run(
            s, lambda kind=kind: tether_saver(url(f"tether-lg-{kind}.db"), kind, section.graphs),
            [("LangGraph's SQLite saver", saver)], {"1": raw},
        )  # fmt: skip


def postgres_section(section: Section, p: Plan) -> None:
    with server(None) as base:
        prefix = base.rsplit("/", 1)[0]

        def database(name: str) -> str:
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            return f"{prefix}/{name}"

        tether_db = database("tether")  # one schema per scenario in it

        def raw1(scale: int) -> tuple[int, float]:
            n = 200 * scale
            return n, n / postgres_raw_rate(base, n)

        def raw8(scale: int) -> tuple[int, float]:
            n = 800 * scale
            return n, n / asyncio.run(raw_parallel_rate(base, n, 8))

        for kind, turns in (("sequential", p.seq_postgres), ("concurrent", p.concurrent)):
            s = Scenario("postgresql", f"workflows of {STEPS} steps, {kind}", kind, turns)
            peers = [
                (f"DBOS {api}", section.peer("dbos", "dbos_steps.py", [
                    "--url", database(f"dbos_{api}_{kind}"), "--scenario", kind, "--api", api,
                ]))
                for api in ("async", "sync")
            ]  # fmt: skip
            for workers in (1, 8) if kind == "concurrent" else (1,):
                peers.append((f"Absurd, {workers} worker{'s' * (workers > 1)}", section.peer(
                    "absurd", "absurd_steps.py", [
                        "--url", database(f"absurd_{kind}_{workers}"), "--scenario", kind,
                        "--workers", str(workers),
                    ],
                )))  # fmt: skip
            url = with_schema(tether_db, f"engine_{kind}")
            raws = {"1": raw1} if kind == "sequential" else {"1": raw1, "8": raw8}
            section.run(s, lambda url=url, kind=kind: tether_engine(url, kind), peers, raws)
        for kind, turns in (("sequential", p.seq_graph), ("concurrent", p.concurrent)):
            s = section.graph_scenario("postgresql", kind, turns)
            if s is None:
                continue
            saver = section.peer("langgraph-postgres", "langgraph_savers.py", [
                "--saver", "postgres", "--url", database(f"langgraph_{kind}"), "--scenario", kind,
            ])  # fmt: skip
            url = with_schema(tether_db, f"langgraph_{kind}")
            raws = {"1": raw1} if kind == "sequential" else {"1": raw1, "8": raw8}
            section.run(
                s, lambda url=url, kind=kind: tether_saver(url, kind, section.graphs),
                [("LangGraph's PostgreSQL saver", saver)], raws,
            )  # fmt: skip


def check_peers(python: str) -> dict[str, Any]:
    request = {name: [modules, packages] for name, (modules, packages) in PEER_MODULES.items()}
    out = subprocess.run(
        [python, "-c", CHECK, json.dumps(request)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        return dict.fromkeys(PEER_MODULES, f"the interpreter failed: {out.stderr.strip()[-200:]}")
    return json.loads(out.stdout)


# -- printing ---------------------------------------------------------------------------------

DATABASES = {
    "sqlite": "SQLite file, WAL + synchronous=FULL",
    "postgresql": "PostgreSQL, one durable cluster (fsync on, synchronous_commit=on)",
}


def figures(scenarios: list[Scenario]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in scenarios:
        raw = {f"raw_commits_per_s_{k}_conn": round(s.raw_rate(k)) for k in s.raw}
        bound = s.raw_rate("8" if "8" in s.raw else "1") if s.raw else None
        tether = next((e.steps_per_s() for e in s.entries if e.tether), None)
        contenders = []
        for e in s.entries:
            rate = e.steps_per_s()
            contenders.append({
                "contender": e.label,
                "tether": e.tether,
                "runs": e.runs,
                "steps_per_s": None if rate is None else round(rate),
                "ratio_to_raw": None if rate is None or not bound else round(rate / bound, 2),
                "tether_ratio": (
                    round(tether / rate, 2) if rate and tether and not e.tether else None
                ),
                "settings": e.settings,
                "versions": e.versions,
                "error": e.error,
            })  # fmt: skip
        out.setdefault(s.database, {})[s.name] = {
            "runs_per_turn": s.turns,
            **raw,
            "ratio_to_raw_of": f"{'8' if '8' in s.raw else '1'}_conn",
            "contenders": contenders,
            "skipped": s.skipped,
        }
    return out


def print_table(scenarios: list[Scenario], header: list[str]) -> None:
    for line in header:
        print(line)
    width = max([len(e.label) for s in scenarios for e in s.entries] + [20])
    database = None
    for s in scenarios:
        if s.database != database:
            database = s.database
            print(f"\n{DATABASES[database]}")
        turns = f"{sum(s.turns)} runs each, {len(s.turns)} turn{'s' * (len(s.turns) > 1)}"
        turns += f" of {s.turns[0]}" if len(s.turns) > 1 else ""
        raw = ", ".join(f"{k} conn{'s' * (k != '1')} {s.raw_rate(k):,.0f}/s" for k in s.raw)
        print(f"  {s.name}: {turns}; raw commits: {raw or '-'}")
        which = "8" if "8" in s.raw else "1"
        bound = s.raw_rate(which) if s.raw else None
        tether = next((e.steps_per_s() for e in s.entries if e.tether), None)
        print(f"    {'':<{width}}  {'steps/s':>8}  {f'x raw {which}':>8}  {'Tether / it':>11}")
        for e in s.entries:
            rate = e.steps_per_s()
            if rate is None:
                print(f"    {e.label:<{width}}  failed: {e.error}")
                continue
            versus = f"{rate / bound:8.2f}" if bound else f"{'':8}"
            ratio = f"{tether / rate:9.2f} x" if tether and not e.tether else ""
            warn = ""
            journal, sync = e.settings.get("journal_mode"), e.settings.get("synchronous")
            if s.database == "sqlite" and (journal != "wal" or sync != "FULL"):
                warn = f"   (!) journal_mode={journal} synchronous={sync}"
            print(f"    {e.label:<{width}}  {rate:8,.0f}  {versus}  {ratio:>11}{warn}")
        for why, names in s.skipped.items():
            print(f"    skipped {', '.join(names)}: {why}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer runs and turns")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--peers-python", default=DEFAULT_PEERS_PYTHON, help="the peers' interpreter"
    )
    args = parser.parse_args()
    header = [
        "Tether beside its peers: same run, same machine, same databases; "
        "each turn gives every contender the same runs, in rotating order",
        f"Tether {_version('tether')} (langgraph {_version('langgraph')}): {sys.executable}",
    ]
    python: str | None = args.peers_python
    peers: dict[str, Any] = {}
    if not Path(args.peers_python).exists():
        header.append(
            f"no peers' interpreter at {args.peers_python}: peers skipped. Make one with\n"
            + setup_commands(args.peers_python)
        )
        python = None
    else:
        peers = check_peers(args.peers_python)
        found = {p: v for versions in peers.values() if isinstance(versions, dict)
                 for p, v in versions.items()}  # fmt: skip
        header.append(f"peers: {', '.join(f'{p} {v}' for p, v in sorted(found.items()))}: "
                      f"{args.peers_python}")  # fmt: skip
        missing = {name: why for name, why in peers.items() if not isinstance(why, dict)}
        if missing:
            header.append(f"peers missing there: {', '.join(missing)}; install with\n"
                          + setup_commands(args.peers_python))  # fmt: skip
        lg = found.get("langgraph")
        if lg and lg != _version("langgraph"):
            header.append(f"(!) langgraph {lg} for the peers, {_version('langgraph')} for Tether")
    graphs = load_graphs()
    p = plan(args.quick)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tether-bench-peers-", dir=ROOT / "bench") as tmp:
        folder = Path(tmp)
        section = Section(folder, python, peers, graphs)
        sqlite_section(section, p)
        try:
            postgres_section(section, p)
        except FileNotFoundError as exc:  # no initdb/pg_ctl here
            header.append(f"PostgreSQL skipped: {exc}")
        scenarios = section.scenarios
    elapsed = time.perf_counter() - started
    if args.json:
        print(json.dumps({"peers_python": python, "peers": peers, "seconds": round(elapsed),
                          **figures(scenarios)}))  # fmt: skip
        return
    print_table(scenarios, header)
    print(f"\n({elapsed:.0f} s)")


if __name__ == "__main__":
    main()

"""A workflow that fans out (gather of helper coroutines, each with steps, a recorded uuid4, one
with a child run) killed with SIGKILL at the commit of every one of its checkpoints, before and
after the commit; a fresh process then finishes the run. Whatever order the branches finished
in, the result is the same, every recorded uuid is the one the result shows, and no step whose
completion was committed runs again (flows in fanout_flows.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import tether
from tether.serde import Serde
from tether.store.port import CheckpointStatus, RunStatus

from .children import child_env
from .fanout_flows import CHECKPOINTS, CHILD, RUN_ID, STEPS, VALUES, make_app
from .flows import read_lines
from .matrix import on_backends

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]
SITES = ("before_commit", "after_commit")
CASES = {f"{c}-{s}": (c, s) for c in CHECKPOINTS for s in SITES}
# On PostgreSQL a branch's checkpoints, the child's start and the join (the rest is the same
# code on another database; $CRASH_POSTGRES_ALL=1 runs all).
ON_POSTGRES = [f"{c}-{s}" for c in ("add@1", "uuid4@0", "child:kid@2", "join:kid@2")
               for s in SITES]  # fmt: skip


def label(checkpoint: str) -> str:
    """The fault label of the commit that records `checkpoint`."""
    if checkpoint.startswith("join:"):  # the child's end, taken from the mailbox
        return f"take_event:{checkpoint}"
    return f"write_checkpoint:{checkpoint}:completed"


def process(db: str, side: Path, faults: str = "") -> int:
    env = child_env(**({"TETHER_FAULTS": faults} if faults else {}))
    done = subprocess.run(
        [sys.executable, "-m", "tests.crash.fanout_flows", db, str(side)],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode in (0, -9), done.stderr[-3000:]
    return done.returncode


def durable(db: str, side: Path) -> dict[str, tether.Checkpoint]:
    async def read() -> dict[str, tether.Checkpoint]:
        app = make_app(db, side)
        try:
            await app.open()
            return {c.name: c for c in await app.engine.store.load_history(RUN_ID)}
        finally:
            await app.close()

    return asyncio.run(read())


@pytest.mark.parametrize(("backend", "checkpoint", "site"), on_backends(CASES, ON_POSTGRES))
def test_a_fan_out_killed_at_any_commit_finishes_once_with_the_same_result(
    db_url: str, tmp_path: Path, checkpoint: str, site: str, crash_tally: dict[str, int]
) -> None:
    fault = f"store.{site}@{label(checkpoint)}=kill"
    assert process(db_url, tmp_path, fault) == -9, "the first process was not killed"
    crash_tally["crash_points"] += 1
    before = durable(db_url, tmp_path)
    committed = {n for n, c in before.items() if c.status is CheckpointStatus.COMPLETED}
    assert (checkpoint in committed) == (site == "after_commit")
    ran_before = Counter(line.split(" ", 1)[1] for line in read_lines(tmp_path / "bodies.txt")
                         if line.startswith("start "))  # fmt: skip

    assert process(db_url, tmp_path) == 0
    [result_file] = tmp_path.glob("result-*.json")
    result = json.loads(result_file.read_text())
    after = durable(db_url, tmp_path)
    assert [b["value"] for b in result["branches"]] == VALUES
    assert result["total"] == sum(VALUES)
    tokens = {
        n: Serde().loads(c.result or "null") for n, c in after.items() if n.startswith("uuid4")
    }
    assert [b["token"] for b in result["branches"]] == [
        str(tokens[f"uuid4@{i}"]) for i in range(len(VALUES))
    ]  # the uuids recorded are the ones the run used, also those drawn before the kill
    assert {n: c.status for n, c in after.items()} == dict.fromkeys(
        CHECKPOINTS, CheckpointStatus.COMPLETED
    )
    ran = Counter(line.split(" ", 1)[1] for line in read_lines(tmp_path / "bodies.txt")
                  if line.startswith("start "))  # fmt: skip
    again = {}
    for name in STEPS:
        key = f"{RUN_ID} {name}"
        if name in committed:  # recorded before the kill: never ran again
            assert ran[key] == ran_before[key] == 1, name
        else:
            assert 1 <= ran[key] <= ran_before[key] + 1, name
            again[name] = ran[key] - 1
    assert ran[f"{CHILD} add"] in (1, 2)
    crash_tally["duplicate_completions"] += sum(
        ran[f"{RUN_ID} {n}"] - 1 for n in STEPS if n in committed
    )
    assert all(n in (0, 1) for n in again.values())

    async def status() -> RunStatus:
        app = make_app(db_url, tmp_path)
        try:
            return await (await app.get(RUN_ID)).status()
        finally:
            await app.close()

    assert asyncio.run(status()) is RunStatus.SUCCEEDED

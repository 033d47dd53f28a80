"""Transaction steps and the outbox under SIGKILL, on real SQLite files and on PostgreSQL.

A process running the `ledger` workflow (tx_flows.py: two transaction steps writing business
rows and outbox messages, then an outbox call in workflow code) is killed at every boundary of
each transaction (before its write, inside its body with the transaction open, before and after
its commit), around the workflow's outbox commit, in the middle of a message's HTTP send and
before a delivery is recorded. After each death the business rows and the checkpoints never
disagree: a step's row exists exactly when its checkpoint is completed, and so do its messages.
A fresh process then finishes the run: each row once, each message delivered, and the receiver
(a real HTTP server in this process) applies each key once, however many sends it took.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .backends import ro_query
from .children import child_env
from .flows import read_lines
from .matrix import on_backends
from .receiver import Receiver
from .tx_flows import expected_result

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "tx-run"
PROC_TIMEOUT = 40.0
STEPS = ("debit", "credit")


@dataclass(frozen=True)
class Kill:
    """How the first process dies: at a fault site, in a hanging body, or while the receiver
    holds a send to `hold` without answering."""

    faults: str = ""
    hang: str = ""
    hold: str = ""
    lost: str = ""  # the checkpoint whose commit the kill came before: nothing of it is kept

    def env(self) -> dict[str, str]:
        env = {"TETHER_FAULTS": self.faults} if self.faults else {}
        if self.hang:
            env["CRASH_HANG_IN"] = self.hang
        return env


def at(site: str, checkpoint: str) -> Kill:
    lost = "" if site == "after_commit" else checkpoint
    return Kill(faults=f"store.{site}@run_transaction:{checkpoint}=kill", lost=lost)


CASES: dict[str, Kill] = {}
for _step in STEPS:
    CASES[f"{_step}-before-write"] = at("before_write", _step)
    CASES[f"{_step}-in-body"] = Kill(hang=_step, lost=_step)
    CASES[f"{_step}-before-commit"] = at("before_commit", _step)
    CASES[f"{_step}-after-commit"] = at("after_commit", _step)
CASES["outbox-before-commit"] = at("before_commit", "outbox")
CASES["outbox-after-commit"] = at("after_commit", "outbox")
CASES["in-the-middle-of-a-send"] = Kill(hold="/debit")
CASES["before-a-delivery-is-recorded"] = Kill(
    faults="store.before_commit@settle_outbox:delivered=kill"
)
# On PostgreSQL, one case of each kind (each case costs two processes there).
POSTGRES = [
    "debit-in-body",
    "debit-before-commit",
    "credit-after-commit",
    "outbox-before-commit",
    "in-the-middle-of-a-send",
    "before-a-delivery-is-recorded",
]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


class Proc:
    """One `python -m tests.crash.tx_proc` process, its output kept in a log file."""

    def __init__(self, db: str, side: Path, receiver: str, name: str, env: dict[str, str]) -> None:
        self.side, self.log = side, side / f"{name}.log"
        with open(self.log, "wb") as out:
            self.started = time.monotonic()
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "tests.crash.tx_proc", db, str(side), receiver, RUN_ID],
                cwd=ROOT, env=child_env(**env), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    async def wait(self) -> float:
        """Until the process ends; the seconds since it started."""
        deadline = time.monotonic() + PROC_TIMEOUT
        while self.popen.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"still running after {PROC_TIMEOUT}s:\n{self.output()}")
            await asyncio.sleep(0.005)
        return time.monotonic() - self.started

    def kill(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def result(self) -> Any:
        path = self.side / f"result-{self.popen.pid}.json"
        return json.loads(path.read_text()) if path.exists() else None


async def until(condition: Any, proc: Proc, what: str) -> None:
    deadline = time.monotonic() + PROC_TIMEOUT
    while not condition():
        if proc.popen.poll() is not None:
            pytest.fail(f"the process exited before {what}:\n{proc.output()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {PROC_TIMEOUT}s")
        await asyncio.sleep(0.005)


@dataclass
class State:
    """What the database holds for the run: completed checkpoints, business rows (step,
    amount), outbox messages (checkpoint, id, key, status, uncertain)."""

    completed: set[str]
    rows: list[tuple[str, int]]
    messages: list[tuple[str, str, str, str, int]]


def state(db: str) -> State:
    checkpoints = ro_query(
        db, "SELECT name FROM tether_checkpoints WHERE run_id = ? AND status = 'completed'", RUN_ID
    )
    try:
        rows = ro_query(db, "SELECT step, amount FROM ledger WHERE run_id = ?", RUN_ID)
    except Exception:  # no ledger table yet: the first body never committed
        rows = []
    messages = ro_query(db, "SELECT checkpoint, id, key, status, uncertain FROM tether_outbox "
                            "WHERE run_id = ? ORDER BY checkpoint", RUN_ID)  # fmt: skip
    return State({c[0] for c in checkpoints}, sorted((r[0], int(r[1])) for r in rows),
                 [(m[0], m[1], m[2], m[3], int(m[4])) for m in messages])  # fmt: skip


def check_agreement(s: State) -> None:
    """Business rows, messages and checkpoints never disagree, whatever was killed where."""
    for step in STEPS:
        committed = step in s.completed
        assert [r for r in s.rows if r[0] == step] == (
            [(step, -10 if step == "debit" else 10)] if committed else []
        ), (step, s)
        assert len([m for m in s.messages if m[0] == step]) == int(committed), (step, s)
    assert len([m for m in s.messages if m[0] == "outbox"]) == int("outbox" in s.completed), s


@pytest.mark.parametrize(("backend", "kill"), on_backends(CASES, POSTGRES))
async def test_business_rows_and_checkpoints_never_disagree_after_a_sigkill(
    kill: Kill, db_url: str, tmp_path: Path, receiver: Receiver, crash_tally: dict[str, int]
) -> None:
    if kill.hold:
        receiver.hold_paths.add(kill.hold)
    first = Proc(db_url, tmp_path, receiver.url, "process-1", kill.env())
    try:
        if kill.hang:
            marker = tmp_path / f"started-{kill.hang}"
            await until(marker.exists, first, f"body {kill.hang} hanging")
            os.kill(first.popen.pid, signal.SIGKILL)
        elif kill.hold:
            await until(receiver.held.is_set, first, "a send held by the receiver")
            os.kill(first.popen.pid, signal.SIGKILL)
        await first.wait()
    finally:
        first.kill()
    assert first.popen.returncode == -signal.SIGKILL, first.output()
    crash_tally["crash_points"] += 1
    before = state(db_url)
    bodies_before = read_lines(tmp_path / "bodies")
    check_agreement(before)
    if kill.lost:
        assert kill.lost not in before.completed, before
    elif kill.faults.startswith("store.after_commit"):
        assert kill.faults.split(":")[1].split("=")[0] in before.completed, before

    last = Proc(db_url, tmp_path, receiver.url, "process-2", {})
    seconds = await last.wait()
    crash_tally["slowest_recovery_ms"] = max(crash_tally["slowest_recovery_ms"],
                                             round(seconds * 1000))  # fmt: skip
    after = state(db_url)
    result = last.result()
    crash_tally["lost_runs"] += int(last.popen.returncode != 0 or result is None)
    assert last.popen.returncode == 0, last.output()

    # The run finished once, each business row once, with the result of a run never killed.
    (done,) = [m for m in after.messages if m[0] == "outbox"]
    assert result == expected_result(done[2])
    assert after.rows == [("credit", 10), ("debit", -10)]
    check_agreement(after)
    # A step whose commit was durable never ran again; one killed before it ran twice at most.
    again = Counter(read_lines(tmp_path / "bodies")[len(bodies_before) :])
    rerun = set(again) & before.completed
    crash_tally["duplicate_completions"] += len(rerun)
    assert not rerun, (again, before.completed)
    assert all(n == 1 for n in again.values()), again

    # Every message delivered, each key applied once by the receiver, every send of a key
    # with the same body; a send whose outcome was unknown was sent again under its key.
    assert [m[3] for m in after.messages] == ["delivered"] * 3, after.messages
    keys = {m[2] for m in after.messages}
    assert len(keys) == 3
    assert set(receiver.applied) == keys
    bodies_by_key: dict[str, set[str]] = {}
    for r in receiver.requests:
        bodies_by_key.setdefault(r.key, set()).add(json.dumps(r.body, sort_keys=True))
    assert set(bodies_by_key) == keys
    assert all(len(b) == 1 for b in bodies_by_key.values()), bodies_by_key
    # A message is sent once, plus once per send whose outcome was unknown (a worker killed
    # after claiming it; the send itself may not have gone out).
    sends = Counter(receiver.keys())
    assert all(1 <= sends[key] <= 1 + uncertain for _, _, key, _, uncertain in after.messages)
    if kill.hold:
        (key,) = set(receiver.keys(kill.hold))
        assert sends[key] == 2
        assert {m[2]: m[4] for m in after.messages}[key] == 1
    if kill.faults.endswith("settle_outbox:delivered=kill"):
        assert any(m[4] == 1 and sends[m[2]] == 2 for m in after.messages), after.messages

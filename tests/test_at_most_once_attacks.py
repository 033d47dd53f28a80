"""Adversarial tests of at-most-once steps: an effect must never happen twice, and a body whose
outcome is in doubt is reconciled, never run again blindly.

Attacks: two workers on one SQLite file where the live owner loses its lease in the middle of a
body (its heartbeats fail, its event loop is blocked, its marker's acknowledgement is slow, the
shared wall clock steps forward, a graceful shutdown outlasted by a sync body); reconcile hooks
that raise, or answer NOT_DONE until the retry policy is exhausted; timeouts exactly at the
boundary; cancellation of a run in the middle of a body or a hook; and at-most-once steps inside
asyncio.gather / TaskGroup branches. Every test counts body entries and effects in a Ledger
shared by every thread and loop of the process. A worker's fence (ending its process) is played
in-process here; tests/crash/test_stalls.py has it end a real one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

import tether
from tether.core import keepalive
from tether.store.port import Checkpoint, CheckpointStatus, Lease, RunStatus
from tether.store.sqlite import SqliteStore

T = TypeVar("T")
MakeApp = Callable[..., tether.App]

LEASE = timedelta(seconds=1.0)
TIMEOUT = timedelta(seconds=0.4)  # shorter than the lease, as required
SHORT = timedelta(seconds=0.3)  # for the fixture's Apps (their lease: the default 15 s)
TINY = timedelta(seconds=0.12)


# SQLite, plainly and in forced replay: the suite is kept within its time (the memory store
# runs the same engine code; the two-worker tests below run on SQLite files of their own).
MODES = [("sqlite", False), ("sqlite", True)]


@pytest.fixture(params=MODES, ids=[f"{b}{'-replay' if r else ''}" for b, r in MODES])
def mode(request: pytest.FixtureRequest) -> tuple[str, bool]:
    return request.param  # type: ignore[no-any-return]


# -- what bodies and hooks did ------------------------------------------------------------------


class Ledger:
    """Body entries, effects (by idempotency key) and reconcile calls, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entered: list[tuple[str, str]] = []  # (who, idempotency key)
        self.left: list[tuple[str, str]] = []  # bodies that returned or raised
        self.effects: list[tuple[str, str]] = []
        self.asked: list[tuple[str, str]] = []
        self.ended = threading.Event()  # A's process "ended" by its fence (see fenced)
        self.released = threading.Event()  # the test is done with A's "dead" thread
        self.fenced: list[tuple[int, int]] = []  # (B's body entries, B's hook calls) by then

    def enter(self, who: str) -> int:
        """A body starts: how many times a body of this key started, this one included."""
        key = tether.idempotency_key()
        with self._lock:
            self.entered.append((who, key))
            return sum(1 for _, k in self.entered if k == key)

    def leave(self, who: str) -> None:
        with self._lock:
            self.left.append((who, tether.idempotency_key()))

    def effect(self, who: str) -> None:
        with self._lock:
            self.effects.append((who, tether.idempotency_key()))

    def entries(self, who: str | None = None) -> int:
        with self._lock:
            return sum(1 for w, _ in self.entered if who is None or w == who)

    def exits(self, who: str | None = None) -> int:
        with self._lock:
            return sum(1 for w, _ in self.left if who is None or w == who)

    def effects_per_key(self) -> dict[str, int]:
        with self._lock:
            counts: dict[str, int] = {}
            for _, key in self.effects:
                counts[key] = counts.get(key, 0) + 1
            return counts

    def hook(self, who: str, found: Callable[..., object] | None = None) -> Callable[..., object]:
        """A reconcile hook that looks the step's key up among the effects: `found(*args)`
        (by default "paid") if the effect is there, else NOT_DONE."""

        def lookup(*args: Any, **kwargs: Any) -> object:
            key = tether.idempotency_key()
            with self._lock:
                self.asked.append((who, key))
                done = any(k == key for _, k in self.effects)
            if not done:
                return tether.NOT_DONE
            return "paid" if found is None else found(*args, **kwargs)

        return lookup


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def until_sync(check: Callable[[], bool], cap: float) -> bool:
    """In a thread: wait until `check()` or `cap` seconds passed; returns check()."""
    deadline = time.monotonic() + cap
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return check()


# -- two workers on one SQLite file ---------------------------------------------------------


@dataclasses.dataclass
class Knobs:
    """Faults of one worker's database handles (its own and its keepalive's)."""

    heartbeats_fail: bool = False  # the keepalive's heartbeats do not get through
    marker_ack_delay: float = 0.0  # the answer to a start marker's write comes late
    # COMPLETED writes fail for this long from the first one (the outage begins as the first
    # outcome is written, however long the worker took to get there)
    fail_completed_for: float = 0.0
    fail_completed_until: float | None = None
    completed_ack_lost: int = 0  # COMPLETED writes that commit but whose answer is lost


class FlakyStore(SqliteStore):
    def __init__(self, url: str, knobs: Knobs) -> None:
        super().__init__(url)
        self.knobs = knobs

    def another(self) -> FlakyStore:  # the keepalive's handle: the same faults
        return FlakyStore(self.url, self.knobs)

    async def heartbeat(self, worker_id: str, leases: Any, lease_until: float, now: float) -> Any:
        if self.knobs.heartbeats_fail:
            raise tether.StoreUnavailable("the heartbeat's connection dropped")
        return await super().heartbeat(worker_id, leases, lease_until, now)

    async def write_checkpoint(self, lease: Lease, checkpoint: Checkpoint, now: float) -> None:
        knobs, status = self.knobs, checkpoint.status
        if status is CheckpointStatus.COMPLETED and knobs.fail_completed_for:
            if knobs.fail_completed_until is None:
                knobs.fail_completed_until = time.monotonic() + knobs.fail_completed_for
            if time.monotonic() < knobs.fail_completed_until:
                raise tether.StoreUnavailable(
                    "the database went away before the outcome was written"
                )
        await super().write_checkpoint(lease, checkpoint, now)
        if status is CheckpointStatus.COMPLETED and knobs.completed_ack_lost > 0:
            knobs.completed_ack_lost -= 1
            raise tether.StoreUnavailable("the outcome was written, its acknowledgement lost")
        if status is CheckpointStatus.STARTED and knobs.marker_ack_delay:
            await asyncio.sleep(knobs.marker_ack_delay)


def worker_app(db: Path, knobs: Knobs | None = None, **settings: Any) -> tether.App:
    """A worker's App on the SQLite file `db`; it executes one run at a time, so it never
    claims back its own run: another worker on the file does."""
    app = tether.App(store=FlakyStore(f"sqlite:///{db}", knobs or Knobs()),
                     lease_duration=LEASE, concurrency=1)  # fmt: skip
    app.engine.settings = dataclasses.replace(app.engine.settings, poll_interval=0.05, **settings)
    return app


def run_row(db: Path, run_id: str) -> tuple[str, str | None, int]:
    """The run's (status, owner, epoch), read straight from the file."""
    with sqlite3.connect(db) as c:
        status, owner, epoch = c.execute(
            "SELECT status, owner, epoch FROM tether_runs WHERE id = ?", (run_id,)
        ).fetchone()
    return status, owner, epoch


class OwnLoop:
    """An event loop in a thread of its own: an App there can have its loop blocked (a sync
    call) while the test's loop, and another App on it, go on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="own-loop", daemon=True)
        self.thread.start()

    async def run(self, coro: Awaitable[T]) -> T:
        async def wrapped() -> T:
            return await coro

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(wrapped(), self.loop))

    def block(self, seconds: float) -> None:
        self.loop.call_soon_threadsafe(time.sleep, seconds)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def own_loop() -> Iterator[OwnLoop]:
    loop = OwnLoop()
    yield loop
    loop.close()


def register_pay(app: tether.App, ledger: Ledger, who: str, kind: str, *,
                 a_waits: bool = True, retry: tether.Retry | None = None) -> None:  # fmt: skip
    """Workflow `pay` around the at-most-once step `charge` (async or sync). Worker "A"'s body
    (with `a_waits`) makes its effect only once worker "B"'s body has started: the latest an
    owner still running its body could make it."""

    def b_started() -> bool:
        return ledger.entries("B") > 0

    if kind == "async":

        @app.step(at_most_once=True, reconcile=ledger.hook(who), timeout=TIMEOUT, retry=retry)
        async def charge(amount: int) -> str:
            ledger.enter(who)
            try:
                if who == "A" and a_waits:
                    while not b_started():
                        await asyncio.sleep(0.01)
                ledger.effect(who)
                return "paid"
            finally:
                ledger.leave(who)

    else:

        @app.step(at_most_once=True, reconcile=ledger.hook(who), timeout=TIMEOUT, retry=retry)
        def charge(amount: int) -> str:
            ledger.enter(who)
            try:
                if who == "A" and a_waits:
                    # A thread goes on past its timeout, until B's body started, or until the
                    # fence ended A's process (here, in one process: see Fenced).
                    until_sync(lambda: b_started() or ledger.ended.is_set(), cap=3.0)
                    if ledger.ended.is_set():  # a dead process's thread does nothing more
                        ledger.released.wait(10)
                        raise RuntimeError("the process ended: this thread died with it")
                ledger.effect(who)
                return "paid"
            finally:
                ledger.leave(who)

    @app.workflow()
    async def pay(amount: int) -> str:
        return await charge(amount)


@pytest.fixture
def fenced(monkeypatch: pytest.MonkeyPatch) -> Callable[[Ledger], None]:
    """The fence (keepalive.Fence) ends its process; here A shares the test's process, so its
    end is played: the fence's exit records what B had done by then (nothing may have begun)
    and A's sync body, like a thread of a dead process, does nothing more (until the test
    releases it, once B is done: then it raises, and A's late writes are fenced off)."""

    def watch(ledger: Ledger) -> None:
        def end() -> None:
            with ledger._lock:
                b_entries = sum(1 for w, _ in ledger.entered if w == "B")
                b_asked = sum(1 for w, _ in ledger.asked if w == "B")
            ledger.fenced.append((b_entries, b_asked))
            ledger.ended.set()

        monkeypatch.setattr(keepalive, "_exit", end)

    return watch


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_live_owner_whose_heartbeats_fail_mid_body_never_gets_the_effect_made_twice(
    tmp_path: Path, kind: str, fenced: Callable[[Ledger], None]
) -> None:
    """A sync body outlives its timeout while its worker cannot extend its lease: the fence
    ends the worker before B could reconcile it (an async body meets its deadline instead)."""
    ledger = Ledger()
    fenced(ledger)
    db = tmp_path / "t.db"
    a = worker_app(db, Knobs(heartbeats_fail=True))  # alive, but its leases are not extended
    b = worker_app(db)
    register_pay(a, ledger, "A", kind)
    register_pay(b, ledger, "B", kind)
    async with a:
        await a.start("pay", 7, id="p")
        await until(lambda: ledger.entries("A") == 1, "A's body")
        async with b:  # takes the run once A's lease ran out
            assert await (await b.get("p")).result(timeout=10) == "paid"
            ledger.released.set()
            await until(lambda: ledger.exits("A") == ledger.entries("A"), "A's bodies to end")
    assert len(ledger.effects) == 1, ledger.effects
    assert run_row(db, "p")[2] >= 2  # B did take the run over from the live A
    if kind == "sync":  # the fence ended A while B had done nothing yet
        assert ledger.fenced[:1] == [(0, 0)], ledger.fenced


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_live_owner_whose_loop_is_blocked_past_its_lease_never_gets_the_effect_made_twice(
    tmp_path: Path, own_loop: OwnLoop, kind: str, fenced: Callable[[Ledger], None]
) -> None:
    """A's loop is blocked (a sync call) longer than max_loop_stall: its keepalive stops, its
    lease lapses, B takes the run. When A's loop runs again its async body must meet its
    deadline; a sync body (a thread, not blocked by the loop) must not finish beside B's: the
    fence ends A before its lease runs out."""
    ledger = Ledger()
    fenced(ledger)
    db = tmp_path / "t.db"

    async def open_a() -> tether.App:
        app = worker_app(db, max_loop_stall=0.5)
        register_pay(app, ledger, "A", kind)
        await app.__aenter__()
        return app

    a = await own_loop.run(open_a())
    b = worker_app(db)
    register_pay(b, ledger, "B", kind)
    try:
        await own_loop.run(a.start("pay", 7, id="p"))
        await until(lambda: ledger.entries("A") == 1, "A's body")
        own_loop.block(2.0)
        async with b:
            assert await (await b.get("p")).result(timeout=10) == "paid"
            ledger.released.set()
            await until(lambda: ledger.exits("A") == ledger.entries("A"), "A's bodies to end")
            await asyncio.sleep(0.2)  # A's thawed loop goes on a little
    finally:
        await own_loop.run(a.close())
    assert len(ledger.effects) == 1, ledger.effects
    assert run_row(db, "p")[2] >= 2  # B did take the run over from the live A
    if ledger.fenced:  # the fence ended A while B had done nothing yet
        assert ledger.fenced[0] == (0, 0), ledger.fenced
    assert kind == "async" or ledger.fenced  # a sync body still ran: the fence acted


async def test_a_slow_marker_write_does_not_let_the_body_outlive_its_marker(tmp_path: Path) -> None:
    """retry_at counts from before the marker's write: a body whose marker took longer to
    write than its timeout never starts (its time is up), so it cannot outlive the marker
    while B reconciles it."""
    ledger = Ledger()
    db = tmp_path / "t.db"
    a = worker_app(db, Knobs(heartbeats_fail=True, marker_ack_delay=0.9))
    b = worker_app(db)
    register_pay(a, ledger, "A", "async")
    register_pay(b, ledger, "B", "async")
    async with a:
        await a.start("pay", 7, id="p")
        await until(lambda: checkpoint_statuses(db, "p") == ["started"], "A's marker")
        async with b:
            assert await (await b.get("p")).result(timeout=10) == "paid"
    assert ledger.entries("A") == 0  # no time was left for A's body once its marker landed
    assert [who for who, _ in ledger.effects] == ["B"]


def checkpoint_statuses(db: Path, run_id: str) -> list[str]:
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT status FROM tether_checkpoints WHERE run_id = ? ORDER BY seq",
                         (run_id,)).fetchall()  # fmt: skip
    return [status for (status,) in rows]


async def test_a_forward_step_of_the_shared_wall_clock_does_not_make_the_effect_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger()
    db = tmp_path / "t.db"
    a = worker_app(db)
    register_pay(a, ledger, "A", "async")
    async with a:
        await a.start("pay", 7, id="p")
        await until(lambda: ledger.entries("A") == 1, "A's body")
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 30.0)  # NTP steps the clock
        b = worker_app(db)
        register_pay(b, ledger, "B", "async")
        async with b:
            assert await (await b.get("p")).result(timeout=10) == "paid"
            await until(lambda: ledger.exits("A") == ledger.entries("A"), "A's body to end")
    assert len(ledger.effects) == 1, ledger.effects


# -- graceful shutdown outlasted by a sync body ------------------------------------------------


@pytest.mark.parametrize(
    "phase",
    [
        "within-its-timeout",
        "past-its-timeout",
    ],
)
async def test_a_shutdown_leaves_the_runs_of_a_still_running_sync_body_leased(
    tmp_path: Path, phase: str
) -> None:
    """Documented: a graceful shutdown waits shutdown_grace for sync bodies, and while one
    still runs it does not release their runs."""
    ledger = Ledger()
    db = tmp_path / "t.db"
    go = threading.Event()
    timeout = timedelta(seconds=0.8 if phase == "within-its-timeout" else 0.2)
    a = worker_app(db, shutdown_grace=0.1)

    @a.step(at_most_once=True, reconcile=ledger.hook("A"), timeout=timeout)
    def charge(amount: int) -> str:
        ledger.enter("A")
        go.wait(5)
        ledger.effect("A")
        ledger.leave("A")
        return "paid"

    @a.workflow()
    async def pay(amount: int) -> str:
        return await charge(amount)

    try:
        async with a:
            await a.start(pay, 7, id="p")
            await until(lambda: ledger.entries("A") == 1, "A's body")
            worker_id = a.worker_id
            if phase == "past-its-timeout":
                await asyncio.sleep(0.4)  # the run now waits for the thread, past its timeout
        # closed; the body still runs
        assert ledger.exits("A") == 0
        status, owner, _ = run_row(db, "p")
        assert (status, owner) == ("running", worker_id)
    finally:
        go.set()
        await until(lambda: ledger.exits("A") == 1, "the body to end")


async def test_the_next_worker_does_not_run_again_a_sync_body_that_outlasted_a_shutdown(
    tmp_path: Path,
) -> None:
    ledger = Ledger()
    db = tmp_path / "t.db"
    # A's leases are kept by its lingering keepalive for the 3 s its body runs on: a lease of
    # 3 s, so that a heartbeat slowed past a second on a loaded machine (measured: 1.46 s, the
    # SQLite file busy) does not end A by its fence, which this test is not about.
    a = worker_app(db, shutdown_grace=0.1, lease_duration=3.0)
    register_pay(a, ledger, "A", "sync")
    async with a:
        await a.start("pay", 7, id="p")
        await until(lambda: ledger.entries("A") == 1, "A's body")
    b = worker_app(db)
    register_pay(b, ledger, "B", "sync")
    async with b:
        assert await (await b.get("p")).result(timeout=10) == "paid"
        await until(lambda: ledger.exits("A") == 1, "A's body to end")
    assert len(ledger.effects) == 1, ledger.effects


@pytest.mark.parametrize(
    "outage",
    [False, True],
    ids=["no-outage", "after-an-outage"],
)
async def test_a_keepalive_whose_heartbeats_failed_for_a_while_extends_leases_again(
    tmp_path: Path, outage: bool
) -> None:
    ledger = Ledger()
    db = tmp_path / "t.db"
    knobs = Knobs(heartbeats_fail=outage)  # the database is away for the keepalive a while
    a = worker_app(db, knobs, max_loop_stall=0.5)
    b = worker_app(db)

    def register(app: tether.App, who: str) -> None:
        @app.step(at_most_once=True, reconcile=ledger.hook(who), timeout=TIMEOUT)
        async def send(i: int) -> str:
            ledger.enter(who)
            await asyncio.sleep(0.25)
            ledger.effect(who)
            return "sent"

        @app.workflow()
        async def batch() -> int:
            for i in range(6):  # 1.5 s: longer than the lease, kept by heartbeats
                await send(i)
            return 6

    register(a, "A")
    register(b, "B")
    async with a:
        if outage:
            await asyncio.sleep(1.0)  # failing heartbeats, for longer than max_loop_stall
            knobs.heartbeats_fail = False  # the database is back
            await asyncio.sleep(0.5)
        await a.start("batch", id="b")
        await until(lambda: ledger.entries("A") == 1, "A's first body")
        async with b:
            assert await (await b.get("b")).result(timeout=10) == 6
    assert len(ledger.effects) == 6
    assert ledger.asked == []  # nothing was in doubt: the live owner kept its lease
    assert run_row(db, "b")[2] == 1  # nobody else ever claimed it


# -- the outcome's write fails --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize("fault", ["outage", "lost-ack"])
async def test_a_failed_write_of_the_outcome_is_reconciled_not_run_again(
    tmp_path: Path, kind: str, fault: str
) -> None:
    ledger = Ledger()
    db = tmp_path / "t.db"
    knobs = Knobs()
    a = worker_app(db, knobs, store_outage=0.2)
    register_pay(a, ledger, "A", kind, a_waits=False)
    if fault == "outage":  # longer than store_outage: the run is abandoned, resumed later
        knobs.fail_completed_for = 0.6
    else:
        knobs.completed_ack_lost = 1
    async with a:
        handle = await a.start("pay", 7, id="p")
        assert await handle.result(timeout=10) == "paid"
    assert ledger.entries() == 1
    assert len(ledger.effects) == 1
    assert len(ledger.asked) == (1 if fault == "outage" else 0)


# -- reconcile hooks that raise, or say NOT_DONE until the retries run out ---------------------


@pytest.mark.parametrize("where", ["after-a-timeout", "after-a-restart"])
async def test_a_reconcile_hook_that_raises_never_lets_the_body_run_again(
    make_app: MakeApp, where: str
) -> None:
    ledger = Ledger()
    calls: list[int] = []
    lookup = ledger.hook("w")

    def flaky_lookup(amount: int) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the receiver's lookup API is unreachable")
        return lookup(amount)

    def register(app: tether.App) -> None:
        @app.step(at_most_once=True, reconcile=flaky_lookup, timeout=SHORT,
                  retry=tether.Retry(max_attempts=3, initial_delay=timedelta(0)))  # fmt: skip
        async def charge(amount: int) -> str:
            ledger.enter("w")
            ledger.effect("w")  # the effect happens, then the answer hangs
            await asyncio.sleep(30)
            return "answered"

        @app.workflow()
        async def pay(amount: int) -> str:
            return await charge(amount)

    first = make_app()
    register(first)
    if where == "after-a-restart":  # stopped mid-body: the next worker reconciles
        async with first:
            await first.start("pay", 7, id="r")
            await until(lambda: len(ledger.effects) == 1, "the effect")
        app = make_app()
        register(app)
    else:
        app = first
    async with app:
        if where == "after-a-restart":
            handle = await app.get("r")
        else:
            handle = await app.start("pay", 7, id="r")
        with pytest.raises(tether.RunFailed) as info:
            await handle.result(timeout=10)
        assert "unreachable" in str(info.value.error)
        assert ledger.entries() == 1  # the hook's failure is not a verdict: no new attempt
        await app.resume("r")  # the operator fixed the lookup
        assert await handle.result(timeout=10) == "paid"
    assert ledger.entries() == 1
    assert len(ledger.effects) == 1
    assert len(calls) == 2


async def test_a_hook_that_always_says_not_done_exhausts_the_retries_then_fails(
    make_app: MakeApp,
) -> None:
    app = make_app()
    ledger = Ledger()

    @app.step(at_most_once=True, reconcile=ledger.hook("w"), timeout=TINY,
              retry=tether.Retry(max_attempts=3, initial_delay=timedelta(0)))  # fmt: skip
    async def charge(amount: int) -> str:
        ledger.enter("w")
        await asyncio.sleep(30)  # times out before its effect, every time
        ledger.effect("w")
        return "paid"

    @app.workflow()
    async def pay(amount: int) -> str:
        return await charge(amount)

    async with app:
        with pytest.raises(tether.RunFailed) as info:
            await (await app.start(pay, 7, id="n")).result(timeout=10)
        await asyncio.sleep(0.1)  # nothing runs after the failure
    assert info.value.error["type"] == "tether.errors.StepTimeout"
    assert ledger.entries() == 3  # max_attempts, never more
    assert len(ledger.asked) == 3  # each attempt in doubt was reconciled before the next
    assert ledger.effects == []


@pytest.mark.parametrize("max_attempts", [1, 2])
async def test_an_interrupted_last_attempt_reconciled_as_not_done_is_not_retried_past_the_policy(
    make_app: MakeApp, max_attempts: int
) -> None:
    ledger = Ledger()
    go = asyncio.Event()

    def register(app: tether.App) -> None:
        retry = tether.Retry(max_attempts=max_attempts, initial_delay=timedelta(0))

        @app.step(at_most_once=True, reconcile=ledger.hook("w"), timeout=SHORT, retry=retry)
        async def charge(amount: int) -> str:
            n = ledger.enter("w")
            if n < max_attempts:
                raise ConnectionResetError("dropped before the request went out")  # NOT_DONE
            await go.wait()  # the last attempt: its worker stops here, before the effect
            ledger.effect("w")
            return "paid"

        @app.workflow()
        async def pay(amount: int) -> str:
            return await charge(amount)

    first = make_app()
    register(first)
    async with first:
        await first.start("pay", 7, id="x")
        await until(lambda: ledger.entries() == max_attempts, "the last attempt")
    go.set()
    second = make_app()
    register(second)
    async with second:
        with pytest.raises(tether.RunFailed):
            await (await second.get("x")).result(timeout=10)
    assert ledger.entries() == max_attempts
    assert ledger.effects == []


# -- timeouts at the boundary ---------------------------------------------------------------


def test_the_timeout_may_come_within_a_millisecond_of_the_lease_but_not_reach_it() -> None:
    app = tether.App("memory://", lease_duration=timedelta(seconds=1))

    async def body() -> None: ...

    app.step(at_most_once=True, timeout=timedelta(milliseconds=999))(body)
    for timeout in (timedelta(seconds=1), timedelta(seconds=1, microseconds=1)):
        with pytest.raises(tether.ConfigurationError, match="not shorter than the lease"):
            app.step(at_most_once=True, timeout=timeout)(body)


@pytest.mark.parametrize("effect_at", ["start", "end"])
async def test_an_async_body_that_lasts_exactly_its_timeout(
    make_app: MakeApp, effect_at: str
) -> None:
    app = make_app()
    ledger = Ledger()

    @app.step(at_most_once=True, reconcile=ledger.hook("w"), timeout=TINY,
              retry=tether.Retry(max_attempts=2, initial_delay=timedelta(0)))  # fmt: skip
    async def charge(amount: int) -> str:
        ledger.enter("w")
        if effect_at == "start":
            ledger.effect("w")
        await asyncio.sleep(TINY.total_seconds())  # exactly the timeout
        if effect_at == "end":
            ledger.effect("w")
        return "sent"

    @app.workflow()
    async def pay(amount: int) -> str:
        return await charge(amount)

    async with app:
        handle = await app.start(pay, 7, id="b")
        error: dict[str, Any] | None = None
        result: str | None = None
        try:
            result = await handle.result(timeout=10)
        except tether.RunFailed as exc:
            error = exc.error or {}
    if error is not None:
        assert error.get("type") == "tether.errors.StepTimeout"
    assert len(ledger.effects) <= 1
    assert (result is not None) == (len(ledger.effects) == 1)  # failed only without effect
    assert ledger.entries() <= 2
    if effect_at == "start":
        assert ledger.entries() == 1  # found by the hook, never attempted again
    if result == "paid":  # the hook found it: it was asked before anything ran again
        assert len(ledger.asked) == ledger.entries()


async def test_a_sync_body_that_lasts_exactly_its_timeout_is_waited_for(make_app: MakeApp) -> None:
    app = make_app()
    ledger = Ledger()

    @app.step(at_most_once=True, reconcile=ledger.hook("w"), timeout=TINY)
    def charge(amount: int) -> str:
        ledger.enter("w")
        time.sleep(TINY.total_seconds())
        ledger.effect("w")
        return "sent"

    @app.workflow()
    async def pay(amount: int) -> str:
        return await charge(amount)

    async with app:
        assert await (await app.start(pay, 7, id="s")).result(timeout=10) == "sent"
    assert ledger.entries() == 1
    assert len(ledger.effects) == 1
    assert ledger.asked == []


# -- cancellation ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize("effect_at", ["before-cancel", "after-cancel"])
async def test_cancelling_a_run_mid_body_never_runs_the_body_again(
    make_app: MakeApp, kind: str, effect_at: str
) -> None:
    app = make_app()
    ledger = Ledger()
    reached, go = threading.Event(), threading.Event()
    timeout = timedelta(seconds=2)

    if kind == "async":

        @app.step(at_most_once=True, reconcile=ledger.hook("w"), timeout=timeout)
        async def charge(amount: int) -> str:
            ledger.enter("w")
            if effect_at == "before-cancel":
                ledger.effect("w")
            reached.set()
            while not go.is_set():
                await asyncio.sleep(0.01)
            ledger.effect("w")  # never: the cancellation stops the body first
            return "paid"

    else:

        @app.step(at_most_once=True, reconcile=ledger.hook("w"), timeout=timeout)
        def charge(amount: int) -> str:
            ledger.enter("w")
            if effect_at == "before-cancel":
                ledger.effect("w")
            reached.set()
            go.wait(5)
            if effect_at == "after-cancel":  # a thread cannot be stopped: it goes on
                ledger.effect("w")
            ledger.leave("w")
            return "paid"

    @app.workflow()
    async def pay(amount: int) -> str:
        return await charge(amount)

    async with app:
        handle = await app.start(pay, 7, id="c")
        await asyncio.to_thread(reached.wait, 5)
        await handle.cancel()
        with pytest.raises(tether.RunCancelled):
            await handle.result(timeout=10)
        go.set()
        if kind == "sync":
            await until(lambda: ledger.exits() == 1, "the thread to end")
        await asyncio.sleep(0.1)
        assert await handle.status() is RunStatus.CANCELLED
    assert ledger.entries() == 1
    assert len(ledger.effects) == (1 if kind == "sync" or effect_at == "before-cancel" else 0)


@pytest.mark.parametrize("at", ["in-the-hook", "in-the-backoff"])
async def test_cancelling_a_run_while_it_reconciles_or_backs_off(
    make_app: MakeApp, at: str
) -> None:
    app = make_app()
    ledger = Ledger()
    in_hook = asyncio.Event()
    lookup = ledger.hook("w")

    async def slow_lookup(amount: int) -> object:
        found = lookup(amount)
        if at == "in-the-hook":
            in_hook.set()
            await asyncio.sleep(30)
        return found

    @app.step(at_most_once=True, reconcile=slow_lookup, timeout=SHORT,
              retry=tether.Retry(max_attempts=3, initial_delay=timedelta(seconds=5)))  # fmt: skip
    async def charge(amount: int) -> str:
        ledger.enter("w")
        if at == "in-the-hook":
            ledger.effect("w")
            await asyncio.sleep(30)  # times out: the hook is asked, and hangs
        raise ConnectionResetError("dropped")  # in doubt, NOT_DONE: the retry waits 5 s

    @app.workflow()
    async def pay(amount: int) -> str:
        return await charge(amount)

    async with app:
        handle = await app.start(pay, 7, id="h")
        if at == "in-the-hook":
            await asyncio.wait_for(in_hook.wait(), 10)
        else:
            await until(lambda: len(ledger.asked) == 1, "the reconciliation")
            await asyncio.sleep(0.1)
        await handle.cancel()
        with pytest.raises(tether.RunCancelled):
            await handle.result(timeout=10)
        await asyncio.sleep(0.2)
    assert ledger.entries() == 1
    assert len(ledger.asked) == 1
    assert len(ledger.effects) == (1 if at == "in-the-hook" else 0)


# -- inside asyncio.gather / TaskGroup branches ------------------------------------------------


async def test_at_most_once_steps_in_gather_branches_each_take_effect_once(
    make_app: MakeApp,
) -> None:
    app = make_app()
    ledger = Ledger()
    retry = tether.Retry(max_attempts=3, initial_delay=timedelta(0))

    def found(tag: str) -> str:
        return f"found-{tag}"

    @app.step(at_most_once=True, reconcile=ledger.hook("w", found), timeout=SHORT, retry=retry)
    async def publish(tag: str) -> str:
        n = ledger.enter("w")
        if tag == "hangs":  # made, then its answer hangs: found
            ledger.effect("w")
            await asyncio.sleep(30)
        if tag == "drops" and n == 1:  # dropped before it went out: NOT_DONE, retried
            raise ConnectionResetError("dropped")
        if tag == "stalls" and n == 1:  # timed out before it went out: NOT_DONE, retried
            await asyncio.sleep(30)
        ledger.effect("w")
        return f"sent-{tag}"

    @app.step(at_most_once=True, reconcile=ledger.hook("w", found), timeout=SHORT, retry=retry)
    def publish_sync(tag: str) -> str:
        n = ledger.enter("w")
        time.sleep(0.05)
        if n == 1 and tag == "sync-drops":
            raise ConnectionResetError("dropped")
        ledger.effect("w")
        return f"sent-{tag}"

    @app.workflow()
    async def fan() -> list[str]:
        return list(await asyncio.gather(
            publish("a"), publish("hangs"), publish("drops"), publish("stalls"),
            publish_sync("b"), publish_sync("sync-drops"), publish("a"),
        ))  # fmt: skip

    async with app:
        result = await (await app.start(fan, id="g")).result(timeout=20)
    assert result == ["sent-a", "found-hangs", "sent-drops", "sent-stalls", "sent-b",
                      "sent-sync-drops", "sent-a"]  # fmt: skip
    per_key = ledger.effects_per_key()
    assert len(per_key) == 7  # seven keys (one per call, the same tag twice included) ...
    assert set(per_key.values()) == {1}  # ... each made once
    assert ledger.entries() == 7 + 3  # one more attempt for drops, stalls, sync-drops


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_gather_sibling_failing_mid_body_then_resume_reconciles_the_body(
    make_app: MakeApp, kind: str
) -> None:
    app = make_app()
    ledger = Ledger()
    made = threading.Event()
    checks: list[int] = []
    timeout = timedelta(seconds=0.5)

    if kind == "async":

        @app.step(at_most_once=True, reconcile=ledger.hook("w"), timeout=timeout)
        async def charge() -> str:
            ledger.enter("w")
            ledger.effect("w")
            made.set()
            await asyncio.sleep(30)  # cancelled (the workflow failed) or timed out: in doubt
            return "answered"

    else:

        @app.step(at_most_once=True, reconcile=ledger.hook("w"), timeout=timeout)
        def charge() -> str:
            ledger.enter("w")
            ledger.effect("w")
            made.set()
            time.sleep(0.3)
            return "answered"

    @app.step(retry=tether.NO_RETRY)
    async def check() -> str:
        checks.append(1)
        await asyncio.to_thread(made.wait, 5)
        if len(checks) == 1:
            raise ValueError("the first check fails")
        return "checked"

    @app.workflow()
    async def flow() -> str:
        paid, checked = await asyncio.gather(charge(), check())
        return f"{paid}/{checked}"

    async with app:
        handle = await app.start(flow, id="f")
        with pytest.raises(tether.RunFailed):
            await handle.result(timeout=10)
        await app.resume("f")
        result = await handle.result(timeout=10)
    assert result in ("paid/checked", "answered/checked")
    assert ledger.entries() == 1
    assert len(ledger.effects) == 1


async def test_a_taskgroup_cancelling_an_at_most_once_branch_never_runs_it_again(
    make_app: MakeApp,
) -> None:
    app = make_app()
    ledger = Ledger()
    made = asyncio.Event()

    @app.step(at_most_once=True, reconcile=ledger.hook("w"), timeout=timedelta(seconds=0.5))
    async def charge() -> str:
        ledger.enter("w")
        ledger.effect("w")
        made.set()
        await asyncio.sleep(30)
        return "answered"

    @app.step(retry=tether.NO_RETRY)
    async def check() -> str:
        await asyncio.wait_for(made.wait(), 5)
        raise ValueError("the check fails")

    @app.step()
    async def after() -> str:
        return "after"

    @app.workflow()
    async def flow() -> str:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(charge())
                tg.create_task(check())
        except* ValueError:
            pass
        return await after()

    async with app:
        assert await (await app.start(flow, id="t")).result(timeout=10) == "after"
    assert ledger.entries() == 1
    assert len(ledger.effects) == 1

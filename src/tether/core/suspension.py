"""When an execution waits as a whole: the tasks parked on Tether (waits, retry delays, the
replay frontier) and the moment every task of the workflow waits.

A task parks until it may have news (an event for the run, a child's end, its timer), or the
execution ends. Each time something could have changed, `look` checks whether every workflow
task waits and nothing is busy. Then the execution suspends once each parked wait has held
the run in memory for its short while: the suspension stores the union of their wake keys and
the earliest deadline, so any of them wakes the run. A replay that waits while recorded
checkpoints were never asked for diverged. It does no I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tether.core.execution import RunContext
from tether.core.positions import internal, runnable
from tether.core.signals import EndOfHistory, Suspend

_END = object()  # a park's result when the execution ends

# How long a replay may look diverged (every task waits, a recorded checkpoint not asked for)
# while some task waits on something other than Tether (asyncio.sleep, asyncio.wait_for's
# timer, a future of its own) before it is taken as diverged: that task may yet go on.
FOREIGN_GRACE = 2.0


@dataclass(eq=False, slots=True)
class Park:
    """One task waiting on Tether."""

    task: asyncio.Task[Any]
    future: asyncio.Future[object]
    keys: tuple[str, ...] = ()  # mailbox keys whose arrival is news
    deadline: float | None = None  # when its timer fires (the engine's clock)
    hold_until: float = 0.0  # until when it may keep the run in memory
    frontier: bool = False  # it waits for the replay frontier (or for its turn)
    timer: asyncio.Task[None] | None = field(default=None)
    turn: int | None = None  # the seq of the outcome it waits to be handed (see turn)

    def wake(self) -> None:
        if not self.future.done():
            self.future.set_result(None)

    def end(self) -> None:
        if not self.future.done():
            self.future.set_result(_END)


async def park(
    ctx: RunContext,
    *,
    keys: Sequence[str] = (),
    deadline: float | None = None,
    frontier: bool = False,
    since: float | None = None,
    news: asyncio.Future[object] | None = None,
    turn: int | None = None,
) -> None:
    """Wait until this task may have news: an event for the run or a child's end (the run is
    woken), `deadline`, or (frontier) every recorded checkpoint asked for. `since`: when the
    wait this park is part of began (news that was not for it does not hold the run longer);
    `news`: the run's wake future, registered before the caller looked for news (a wake-up
    since then returns at once); `turn`: the seq of the outcome this task waits to be handed
    (see turn).
    Raises the execution's end signal when it ends meanwhile (it suspends, replays, is
    abandoned)."""
    if ctx.delivered:
        assert ctx.ending is not None
        raise ctx.ending
    if not ctx.executing:
        raise ctx.left_behind()
    engine = ctx.engine
    clock = engine.clock
    now = clock.now()
    if (deadline is not None and deadline <= now) or (news is not None and news.done()):
        return
    task = asyncio.current_task()
    assert task is not None
    # Waits hold the run in memory a short while (a quick answer resumes it at once), unless
    # too many runs do already.
    first = not ctx.parks
    crowded = first and engine.held_waits >= engine.settings.max_held_waits
    hold = 0.0 if crowded or frontier else engine.settings.inline_wait_max
    # Resolved by engine.wake(run id) as well: news for this run.
    future = news if news is not None else engine.wake_future(ctx.run_id)
    frontier = frontier or turn is not None
    here = Park(task, future, tuple(keys), deadline, (now if since is None else since) + hold,
                frontier, turn=turn)  # fmt: skip
    if deadline is not None:
        here.timer = internal(_ring(here, clock, deadline - now))
    ctx.parks.add(here)
    if turn is not None:
        ctx.turns.gated += 1
    if first and not crowded:
        engine.held_waits += 1
        ctx.holds_wait = True
        worker = engine.worker
        if worker is not None and worker.capacity() == 1:
            worker.notify()  # this run made room: the worker may claim the next one
    ctx.look()
    try:
        outcome = await future
    finally:
        if turn is not None:
            ctx.turns.gated -= 1
        ctx.parks.discard(here)
        if not ctx.parks:
            if ctx.holds_wait:
                engine.held_waits -= 1
                ctx.holds_wait = False
        else:
            # Other tasks still wait: look again once this one has run on. It may next wait
            # on something of its own (an asyncio.Queue another branch feeds), and nothing
            # else would look then (a look that woke it to hand an outcome returned).
            ctx.look()
        if here.timer is not None:
            here.timer.cancel()
        engine.drop_wake_future(ctx.run_id, future)
    if outcome is _END:
        assert ctx.ending is not None
        raise ctx.ending


async def _ring(here: Park, clock: Any, seconds: float) -> None:
    await clock.sleep(seconds)
    here.wake()


def at_once(ctx: RunContext, seq: int) -> bool:
    """Whether the outcome at `seq` reached its task at once (see turn): it is not kept (an
    older history, or written while the workflow had one task), or the workflow has one task
    (an outcome ranked before it would be another task's, which exists until it was handed)."""
    turns = ctx.turns
    if seq not in turns.ranked:
        return True
    if not ctx.tasks:
        _hand(ctx, seq)
        return True
    return False


async def turn(ctx: RunContext, seq: int) -> None:
    """Until the outcome at `seq` (recorded, or just written) may reach its task: once every
    outcome ranked before it did, and no other workflow task can run (turns.py). Right away
    in the common case (see at_once)."""
    if at_once(ctx, seq):
        return
    turns = ctx.turns
    try:
        while turns.first() != seq or _moving(ctx, but=asyncio.current_task()):
            await park(ctx, turn=seq)
    finally:
        _hand(ctx, seq)


def _hand(ctx: RunContext, seq: int) -> None:
    turns = ctx.turns
    replaying = bool(turns.recorded)
    turns.handed(seq)
    if replaying and not turns.recorded and not ctx.unrequested:
        ctx.frontier_reached()  # the last recorded outcome was handed: the replay is over
    if turns.gated:
        ctx.look()  # the next outcome's turn, once this task waits again


def _moving(ctx: RunContext, but: asyncio.Task[Any] | None = None) -> bool:
    """Whether a workflow task (other than `but`) can run, or just finished: a task still
    among ctx.tasks once done has not run its done-callbacks, which wake whoever awaits it."""
    return any(runnable(t) for t in ctx.live() if t is not but) or any(t.done() for t in ctx.tasks)


def _serve(ctx: RunContext) -> bool:
    """Hand the next outcome to its task if it waits for its turn and nothing else can run;
    whether the look is done (or due again)."""
    if _moving(ctx):
        ctx.look()
        return True
    first = ctx.turns.first()
    for here in ctx.parks:
        if here.turn is not None and here.turn == first:
            here.wake()
            return True
    return False  # its task has not asked for it yet: see what everything waits for


def look(ctx: RunContext) -> None:
    """Called soon after anything changed: a task parked, an I/O ended, a task finished."""
    ctx.checking = None
    if ctx.turns.gated and ctx.ending is None and ctx.executing and _serve(ctx):
        return
    if ctx.ending is not None:
        if ctx.delivered and ctx.busy == 0 and ctx.unwind():
            ctx.look()  # a task about to run meets the ending; look again after it ran
        return
    if ctx.busy or not ctx.parks or not ctx.executing:
        return  # busy: looked at again when the I/O ends; no park: nothing waits on Tether
    if _moving(ctx):
        ctx.foreign_since = None  # it goes on: a grace starts anew
        ctx.look()  # the next loop turn: what runs now may park, or do I/O, or finish
        return
    # Every workflow task waits, and nothing is busy.
    diverged = ctx.unreplayed() or ctx.unhanded()
    if diverged is None or not _foreign(ctx):
        ctx.foreign_since = None
    elif _grace(ctx):  # a task waits on a timer of its own, say: it may still ask for it
        return
    if diverged is not None:  # nothing can ask for the rest of the history any more
        ctx.abandon(diverged)
        return
    if ctx.replay_only:
        ctx.end(EndOfHistory())
        return
    waits = [p for p in ctx.parks if not p.frontier]
    if not waits:
        return
    now = ctx.engine.clock.now()
    latest = max(p.hold_until for p in waits)
    if now >= latest:
        deadlines = [p.deadline for p in waits if p.deadline is not None]
        keys = sorted({key for p in waits for key in p.keys})
        ctx.end(Suspend(min(deadlines, default=None), keys))
        return
    ctx.checking = internal(_later(ctx, latest - now))


def _foreign(ctx: RunContext) -> bool:
    """Whether some workflow task waits on something other than Tether and its own tasks (a
    timer of asyncio's, say: a plain future; a gather's or another task's end is not)."""
    parked = {p.task for p in ctx.parks}
    for task in ctx.live():
        if task in parked:
            continue
        waiter = getattr(task, "_fut_waiter", None)
        if not isinstance(waiter, asyncio.Task) and type(waiter).__name__ != "_GatheringFuture":
            return True
    return False


def _grace(ctx: RunContext) -> bool:
    """Whether the FOREIGN_GRACE is still running (a look is due at its end)."""
    now = asyncio.get_running_loop().time()
    if ctx.foreign_since is None:
        ctx.foreign_since = now
    left = ctx.foreign_since + FOREIGN_GRACE - now
    if left <= 0:
        return False
    ctx.checking = internal(_later(ctx, left, real=True))
    return True


async def _later(ctx: RunContext, seconds: float, *, real: bool = False) -> None:
    await (asyncio.sleep(seconds) if real else ctx.engine.clock.sleep(seconds))
    if ctx.checking is asyncio.current_task():
        look(ctx)

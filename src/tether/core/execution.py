"""One execution (or replay) of one run by this worker: its history, the checkpoints its code
asks for, its store writes, and how it ends as a whole.

Checkpoints are found by position (positions.py), so replay hands each call its own recorded
outcome however the workflow's tasks interleave. Nothing new happens (a step body, a write)
until every recorded checkpoint was asked for again and matched: a divergence is found before
any effect. Store access goes through `durable`, which also counts the execution busy; the
execution ends as a whole through `end` (suspension.py decides when it waits as a whole).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from tether.core.context import _STEP
from tether.core.outage import MISSING, retry_store
from tether.core.positions import _FRAME, Frame, here, runnable
from tether.core.signals import Abandon, ReplayNow, Signal
from tether.core.slot import Slot
from tether.core.turns import Turns
from tether.errors import (
    LeaseLost,
    NonDeterminismError,
    SerializationError,
    StoreUnavailable,
)
from tether.store.port import Checkpoint, Lease

if TYPE_CHECKING:
    from tether.core.engine import Engine
    from tether.core.suspension import Park


log = logging.getLogger("tether.runner")
T = TypeVar("T")


@dataclass(eq=False, slots=True)
class RunContext:
    """One execution (or replay) of one run by this worker."""

    engine: Engine
    run_id: str
    workflow: str
    lease: Lease
    history: dict[str, Checkpoint]  # by position
    replay_only: bool = False  # checking a history: never execute, stop where it ends
    next_seq: int = 0  # the row of the next new checkpoint: after every recorded one
    unrequested: set[str] = field(default_factory=set)  # recorded, not asked for again yet
    requested: list[str] = field(default_factory=list)  # names asked for, in order
    pending: list[Checkpoint] = field(default_factory=list)  # recorded helpers not yet written
    busy: int = 0  # store writes and step bodies in flight now
    idle: list[asyncio.Future[None]] = field(default_factory=list)  # waiting for busy == 0
    ending: Signal | None = None  # how this execution ends, once decided
    delivered: bool = False  # the ending reached the tasks (once nothing was busy)
    writes: int = 0  # checkpoints this execution wrote: whether it made progress
    executing: bool = False  # the workflow's code runs now (between begin and close)
    root: Frame | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)  # the workflow's other tasks
    parks: set[Park] = field(default_factory=set)  # tasks waiting on Tether (suspension.py)
    # Counted in engine.held_waits while its tasks wait: not when its first wait found the
    # worker crowded (it is let go at once, holding nothing).
    holds_wait: bool = False
    root_cancels: int = 0  # cancellations `end` made of the root task (the runner's)
    checking: asyncio.Handle | asyncio.Task[None] | None = None  # a look for quiescence due
    # Since when (the loop's clock) the replay has looked diverged while some task waits on
    # something other than Tether (see suspension.look).
    foreign_since: float | None = None
    turns: Turns = field(init=False)  # the order outcomes reach the tasks in (turns.py)
    raised: dict[int, tuple[BaseException, str]] = field(default_factory=dict)  # by id(exc)

    def __post_init__(self) -> None:
        self.turns = Turns(self.history.values() if self.history else ())
        if self.history:
            self.unrequested = set(self.history)
            self.next_seq = max(c.seq for c in self.history.values()) + 1

    # -- the workflow's tasks --------------------------------------------------------------

    def begin(self) -> None:
        """The workflow starts in the current task: it becomes the root task."""
        task = asyncio.current_task()
        assert task is not None
        self.root = Frame(self, (), task)
        _FRAME.set(self.root)
        self.executing = True

    def places(self, parent: Frame) -> bool:
        """Whether a task created now by `parent`'s code is a workflow task of this execution
        (not one of a step's, nor created once the execution is ending)."""
        return (self.executing and not self.delivered and _STEP.get() is None
                and parent.task is asyncio.current_task())  # fmt: skip

    def adopt(self, task: asyncio.Task[Any]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        # The execution's own end, met in that task, is no error of it: retrieved, so asyncio
        # does not log it (peeked first: the code's own exceptions stay its to retrieve).
        if isinstance(getattr(task, "_exception", None), Signal):
            task.exception()
        if self.parks:
            self.look()

    def live(self) -> list[asyncio.Task[Any]]:
        """The workflow's tasks that have not finished, the root first."""
        root = [] if self.root is None or self.root.task is None else [self.root.task]
        return [t for t in (*root, *self.tasks) if not t.done()]

    # -- checkpoints -----------------------------------------------------------------------

    def slot(self, base: str, kind: str, args: str | None = None) -> Slot:
        """The next checkpoint of the current task, called `base` (of `kind`, called with
        `args`: see arguments), and what the history holds there. Raises
        Abandon(NonDeterminismError) if the history holds another name, kind or arguments
        there, and the execution's end signal once it reached the tasks."""
        if self.delivered:
            assert self.ending is not None
            raise self.ending
        if not self.executing:
            raise self.left_behind()
        frame = _FRAME.get()
        if frame is None or frame.ctx is not self or frame.task is not asyncio.current_task():
            frame = here(self)  # raises: a task Tether did not place
        local = frame.next
        frame.next += 1
        position = frame.prefix + str(local) if frame.prefix else str(local)
        counts = frame.counts  # the readable name: base, base#2 ... (see Frame.name)
        count = counts[base] = counts.get(base, 0) + 1
        name = f"{base}{frame.label}" if count == 1 else f"{base}{frame.label}#{count}"
        self.requested.append(name)
        recorded = self.history.get(position)
        if recorded is None:
            seq = self.next_seq
            self.next_seq += 1
            return Slot(seq, position, name, kind, None, args)
        if (
            recorded.name != name
            or recorded.kind != kind
            or (args is not None and recorded.args is not None and args != recorded.args)
        ):
            raise self.abandon(self.mismatch(recorded, name, kind, args))
        self.unrequested.discard(position)
        if not self.unrequested:
            self.frontier_reached()
        return Slot(recorded.seq, position, name, kind, recorded, args)

    def left_behind(self) -> asyncio.CancelledError:
        """What a task that outlived the workflow's code meets at its next checkpoint or
        wait (close() cancelled it; the cleanup it runs can record nothing any more)."""
        return asyncio.CancelledError(
            f"run {self.run_id!r}: the workflow's code returned; a task it left running "
            f"was cancelled and can make no more checkpoints or waits"
        )

    def peek(self, base: str) -> tuple[Checkpoint | None, str]:
        """What the history holds at the current task's next position, and the name a
        checkpoint called `base` would get there, without asking for it."""
        frame = here(self)
        return self.history.get(frame.position(frame.next)), frame.name(base, peek=True)

    def replaying(self) -> bool:
        """Whether the history holds checkpoints not asked for yet, in any task: the run went
        on past this point under the code that recorded it (a checkpoint of the parent after
        the join, too), so a new path taken here (tether.patched) could only wait for them at
        the frontier. New paths are taken once the whole history replayed."""
        here(self)  # raises for a task Tether did not place
        return bool(self.unrequested)

    def recorded(self, checkpoint: Checkpoint) -> None:
        """`checkpoint` was written durably by this execution."""
        self.history[checkpoint.at] = checkpoint
        self.writes += 1

    def mismatch(
        self, recorded: Checkpoint, name: str, kind: str, args: str | None
    ) -> NonDeterminismError:
        at = recorded.at
        if recorded.name != name or recorded.kind != kind:
            what = (f"recorded {recorded.name!r} at position {at}, this code asked for "
                    f"{name!r}")  # fmt: skip
            if recorded.name == name:
                what += f" as a {kind} (recorded as a {recorded.kind})"
            return self.divergence(what, at, (recorded.name, name))
        what = (f"recorded {recorded.name!r} at position {at} with other arguments: recorded "
                f"{_shown(recorded.args)}, this code passes {_shown(args)}")  # fmt: skip
        return self.divergence(what, at, (recorded.name, name))

    def unhanded(self) -> NonDeterminismError | None:
        """The divergence when every task waits but a recorded outcome that was asked for is
        not awaited by its task (so no later one can be handed back), if any."""
        seq = self.turns.first()
        if seq is None or seq not in self.turns.recorded:
            return None
        found = next(c for c in self.history.values() if c.seq == seq)
        return self.divergence(
            f"this code never awaited the recorded outcome of {found.name!r} at position "
            f"{found.at} while its other tasks waited for their turn after it",
            found.at,
            (found.name, None),
        )

    def unreplayed(self) -> NonDeterminismError | None:
        """The divergence when recorded checkpoints were never asked for again, if any."""
        if not self.unrequested:
            return None
        first = min(self.unrequested, key=lambda p: self.history[p].seq)
        return self.divergence(
            f"this code never asked for the recorded {self.history[first].name!r} at "
            f"position {first} (it stopped after {len(self.requested)} checkpoints)",
            first,
            (self.history[first].name, None),
        )

    def divergence(
        self, what: str, position: str | None, difference: tuple[str | None, str | None]
    ) -> NonDeterminismError:
        recorded = [c.name for c in sorted(self.history.values(), key=lambda c: c.seq)]
        requested = list(self.requested)
        return NonDeterminismError(
            f"run {self.run_id!r} of workflow {self.workflow!r} no longer replays: {what}. "
            f"Recorded: {recorded}; requested: {requested}. Let runs started on the old "
            f"code finish on it (deploy the change beside it, or roll it back: the run is "
            f"held until code that replays it comes), or start them anew.",
            recorded=recorded,
            requested=requested,
            position=position,
            difference=difference,
        )

    # -- the frontier: nothing new before the whole history was asked for -------------------

    async def at_frontier(self) -> None:
        """Before anything new (a step attempt, a store write): wait until every recorded
        checkpoint was asked for again (the history replayed; in replay-only mode, forever),
        and meet the execution's end if it is ending."""
        if self.ending is not None:
            await self.meet_end()
        if self.unrequested or self.replay_only or self.turns.recorded:
            from tether.core.suspension import park

            while self.unrequested or self.replay_only or self.turns.recorded:
                await park(self, frontier=True)

    async def before_effect(self) -> None:
        """Before a new effect that runs user code (a step body): the frontier, then the
        recorded helpers written."""
        await self.at_frontier()
        if self.pending:
            await self.flush()

    async def meet_end(self) -> None:
        """Raise the execution's end signal here, once it reaches the tasks (when nothing is
        busy: in-flight attempts finish and record first)."""
        from tether.core.suspension import park

        while True:
            await park(self)

    def frontier_reached(self) -> None:
        for park in list(self.parks):
            if park.frontier and not self.replay_only:
                park.wake()

    # -- store writes ----------------------------------------------------------------------

    def io(self) -> Busy:
        """Tether's own I/O (or a step body) on this execution's behalf, as a context
        manager: it is busy, and tasks created meanwhile are not workflow tasks."""
        return Busy(self)

    def settled(self) -> Awaitable[None]:
        """Until nothing is busy."""
        future = asyncio.get_running_loop().create_future()
        if self.busy == 0:
            future.set_result(None)
        else:
            self.idle.append(future)
        return future

    def _idle(self) -> None:
        for future in self.idle:
            if not future.done():
                future.set_result(None)
        self.idle.clear()
        if self.ending is not None and not self.delivered:
            self.deliver()
        elif self.parks or self.ending is not None:
            self.look()

    async def write(self, checkpoint: Checkpoint) -> None:
        """Write a checkpoint durably (with any recorded helpers queued before it)."""
        if self.ending is not None and isinstance(self.ending, Abandon):
            raise self.ending
        store, clock = self.engine.store, self.engine.clock
        checkpoint = self.turns.stamp(checkpoint, clock, not self.tasks)
        pending = self.pending
        self.pending = []

        async def flush_and_write() -> None:
            now = clock.now()
            await asyncio.gather(*(store.write_checkpoint(self.lease, c, now) for c in pending))
            await store.write_checkpoint(self.lease, checkpoint, now)

        def call() -> Awaitable[None]:
            if pending:
                return flush_and_write()
            return store.write_checkpoint(self.lease, checkpoint, clock.now())

        async def read_back() -> object:
            history = {c.at: c for c in await store.load_history(self.run_id)}
            written = all(
                (found := history.get(c.at)) is not None
                and (found.status, found.attempts) == (c.status, c.attempts)
                for c in [*pending, checkpoint]
            )
            return None if written else MISSING

        try:
            await self.durable(call, read_back)
        except BaseException:
            self.turns.handed(checkpoint.seq)  # no outcome to wait for
            raise
        for done in pending:
            self.history[done.at] = done
        self.history[checkpoint.position or checkpoint.at] = checkpoint
        self.writes += 1

    async def take_event(self, keys: Sequence[str], done: Checkpoint, now: float) -> str | None:
        """Consume the oldest event for `keys` into the checkpoint `done` (see Store)."""
        if isinstance(self.ending, Abandon):
            raise self.ending
        if self.pending:
            await self.flush()
        store = self.engine.store
        done = self.turns.stamp(done, self.engine.clock, not self.tasks)

        async def call() -> str | None:
            return await store.take_event(self.lease, keys, done, self.engine.clock.now())

        async def read_back() -> object:
            # Taken before the acknowledgement was lost: the checkpoint holds it. Taking again
            # would consume a second event.
            found = {c.at: c for c in await store.load_history(self.run_id)}.get(done.at)
            return found.result if found is not None else MISSING

        try:
            taken = await self.durable(call, read_back)
        except BaseException:
            self.turns.handed(done.seq)
            raise
        if taken is not None:
            self.recorded(done)
        else:
            self.turns.handed(done.seq)  # nothing taken: no outcome yet
        return None if taken is None else str(taken)

    async def durable(
        self, call: Callable[[], Awaitable[object]], read_back: Callable[[], Awaitable[object]]
    ) -> Any:
        """A store write on this run's behalf, through retry_store; losing the lease or the
        database for good abandons the run. A new one waits for the history to replay (and
        meets the execution's end); one inside Tether's I/O (an attempt recording how it
        ended) goes on."""
        frame = _FRAME.get()  # inside Tether's I/O already (busy): an attempt's record
        inside = frame is not None and frame.quiet > 0
        # Once the workflow's code is done, the runner's own writes (the helpers flushed as
        # it suspends) go on: there is no task left to meet the end.
        if (not inside and self.executing
                and (self.ending is not None or self.unrequested or self.replay_only
                     or self.turns.recorded)):  # fmt: skip
            await self.at_frontier()
        if self.ending is not None and isinstance(self.ending, Abandon):
            raise self.ending
        try:
            if inside:
                try:
                    return await call()
                except StoreUnavailable as exc:  # the hot path pays only for the call
                    return await retry_store(self.engine, call, read_back, failed=exc)
            with Busy(self):
                try:
                    return await call()
                except StoreUnavailable as exc:
                    return await retry_store(self.engine, call, read_back, failed=exc)
        except (LeaseLost, StoreUnavailable) as exc:
            raise self.abandon(exc) from None

    def decode(self, recorded: Checkpoint | str, load: Callable[[], T]) -> T:
        """`load()`: the value of a recorded checkpoint (or of what `recorded` names) decoded.
        One that cannot be (its text is not JSON, or no longer fits the code's type hint)
        stops this execution: user code cannot catch that, since going on would take another
        path than the recorded one. The runner counts it as a failed execution."""
        try:
            return load()
        except Exception as exc:  # only decoding runs in load: it does not fit this code
            what = (recorded if isinstance(recorded, str)
                    else f"checkpoint {recorded.name!r} (position {recorded.at})")  # fmt: skip
            raise self.abandon(SerializationError(
                f"{what} of run {self.run_id!r} cannot be decoded by this code: {exc}. Deploy "
                f"code that reads it (the type hint it was recorded under), or repair the row, "
                f"then `tether runs resume {self.run_id}`"
            )) from None  # fmt: skip

    async def flush(self) -> None:
        """Write the recorded helpers still queued (before any other effect, or the end)."""
        while self.pending:
            last = self.pending.pop()
            await self.write(last)

    def unwritten(self) -> list[Checkpoint]:
        """Take the recorded helpers still queued (for the run's end, which writes them)."""
        taken, self.pending = self.pending, []
        return taken

    def failed_at(self, error: BaseException, position: str) -> None:
        """`error` is what the step at `position` raised into the workflow (so a run that
        fails with it names the checkpoint, for `app.resume`)."""
        self.raised[id(error)] = (error, position)

    def position_of(self, error: BaseException) -> str | None:
        found = self.raised.get(id(error))
        return found[1] if found is not None and found[0] is error else None

    # -- ending the execution as a whole -----------------------------------------------------

    def abandon(
        self, cause: LeaseLost | NonDeterminismError | StoreUnavailable | SerializationError
    ) -> Abandon:
        """End the execution because the run cannot go on here; returns the signal to raise."""
        self.end(Abandon(cause))
        assert isinstance(self.ending, Abandon)
        return self.ending

    async def replay_now(self) -> None:
        """Forced-replay mode: end the execution (once the attempts in flight recorded how
        they ended) to replay it from the store."""
        self.end(ReplayNow())
        await self.meet_end()

    def end(self, signal: Signal) -> None:
        """Decide how the execution ends (the first decision holds, but an Abandon overrides
        any other). It reaches the tasks once nothing is busy (at once for an Abandon, which
        stops in-flight work too): parked tasks raise it, tasks waiting on anything else are
        cancelled, new checkpoints are refused."""
        if self.ending is not None and (
            not isinstance(signal, Abandon) or isinstance(self.ending, Abandon)
        ):
            return
        self.ending = signal
        if self.busy == 0 or isinstance(signal, Abandon):
            self.deliver()

    def deliver(self) -> None:
        """The ending reaches the tasks (see end)."""
        self.delivered = True
        for park in list(self.parks):
            park.end()
        self.look()

    def unwind(self) -> bool:
        """Cancel the workflow's tasks that wait on something other than Tether (a future of
        their own, another task): the ending reaches them too. Called once nothing is busy;
        returns whether some task is about to run (it meets the ending at its next checkpoint,
        or blocks and is cancelled at the next look)."""
        if not self.executing:
            return False
        parked = {park.task for park in self.parks}
        ready = False
        for task in self.live():
            if task in parked:
                continue
            if runnable(task):
                ready = True
                continue
            if self.root is not None and task is self.root.task:
                self.root_cancels += 1
            task.cancel()
        return ready

    def look(self) -> None:
        """Look soon whether the execution waits as a whole, or can unwind (suspension.py):
        at the next loop turn, also when a later look was due (something changed)."""
        if isinstance(self.checking, asyncio.Task):
            self.checking.cancel()
            self.checking = None
        if self.checking is None and self.executing:
            from tether.core.suspension import look

            self.checking = asyncio.get_running_loop().call_soon(look, self)

    async def close(self) -> None:
        """The workflow's code returned or raised: let in-flight writes settle when the
        execution ends to be replayed, then cancel its remaining tasks and wait for them."""
        if isinstance(self.ending, ReplayNow) and self.busy:
            await self.settled()
        self.executing = False
        if self.checking is not None:
            self.checking.cancel()
            self.checking = None
        if self.tasks:
            leftover = [t for t in self.tasks if not t.done()]
            for task in leftover:
                task.cancel()
            await asyncio.gather(*leftover, return_exceptions=True)
        if self.busy:
            await self.settled()


class Busy:
    """RunContext.io(): counts the execution busy, and marks Tether's own I/O in the current
    workflow task (the task factory places no task created meanwhile)."""

    __slots__ = ("ctx", "frame")

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def __enter__(self) -> None:
        self.ctx.busy += 1
        frame = self.frame = _FRAME.get()
        if frame is not None:
            frame.quiet += 1

    def __exit__(self, *exc: object) -> None:
        if self.frame is not None:
            self.frame.quiet -= 1
        ctx = self.ctx
        ctx.busy -= 1
        if ctx.busy == 0 and (ctx.idle or ctx.parks or ctx.ending is not None):
            ctx._idle()


def _shown(args: str | None) -> str:
    if args is None:
        return "arguments that are not kept"
    from tether.redact import redact_text

    text = redact_text(args)
    return text if len(text) <= 300 else text[:300] + "..."


__all__ = ["Busy", "RunContext"]

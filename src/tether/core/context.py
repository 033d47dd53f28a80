"""The ambient state of a run being executed, and the control-flow signals that unwind it.

A RunContext lives in a context variable inside the run's task: workflow code and the recorded
helpers (now, uuid4, random) find their run through it, steps their idempotency key through a
StepContext. It does no I/O except through the RunContext's engine, and holds no policy.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from tether.errors import (
    ConfigurationError,
    LeaseLost,
    NonDeterminismError,
    NotInWorkflow,
    SerializationError,
    StoreUnavailable,
)
from tether.store.base import Checkpoint, CheckpointStatus, Lease

if TYPE_CHECKING:
    from tether.core.engine import Engine


log = logging.getLogger("tether.runner")
T = TypeVar("T")


class _Signal(BaseException):
    """Base of Tether's control-flow signals. They derive from BaseException so that user code's
    `except Exception` cannot swallow them; user code must never catch them (nor BaseException)."""


class Suspend(_Signal):
    """The run releases its worker until wake_at (a durable retry delay, a timer), or until an
    event arrives for one of the wake_on keys."""

    def __init__(self, wake_at: float | None, wake_on: Sequence[str] = ()) -> None:
        super().__init__(wake_at)
        self.wake_at = wake_at
        self.wake_on = tuple(wake_on)


class ReplayNow(_Signal):
    """Forced-replay mode: restart the workflow from the store after a new checkpoint."""


class EndOfHistory(_Signal):
    """Replay-only mode reached a checkpoint the history does not hold: all before matched."""


class Abandon(_Signal):
    """The run cannot go on here: the lease was lost, replay diverged from the history, or a
    recorded checkpoint cannot be decoded (SerializationError: the engine cannot execute the
    run, and counts the failure; see Runner)."""

    def __init__(
        self, cause: LeaseLost | NonDeterminismError | StoreUnavailable | SerializationError
    ) -> None:
        super().__init__(str(cause))
        self.cause = cause


# Told how a step attempt's body ended (None: it returned; else what it raised), before the
# attempt's checkpoint is written: what was attached to the attempt settles (a stream writer
# flushes its buffered chunks, or retracts them). An Exception means the attempt failed; any
# other BaseException (a cancellation, a lost lease) that it is being interrupted: no store
# writes then.
Finalizer = Callable[[BaseException | None], Awaitable[None]]


@dataclass(slots=True)
class StepContext:
    run_id: str
    name: str
    attempt: int
    finalizers: list[Finalizer] = field(default_factory=list)
    # What helpers above core attach to this attempt, by a key of their own.
    attached: dict[object, object] = field(default_factory=dict)

    @property
    def idempotency_key(self) -> str:
        return idempotency_key_for(self.run_id, self.name)

    async def finish(self, error: BaseException | None) -> None:
        """Await the finalizers, in the order they were added, each once."""
        finalizers, self.finalizers = self.finalizers, []
        for finalizer in finalizers:
            await finalizer(error)


def idempotency_key_for(run_id: str, checkpoint_name: str) -> str:
    digest = hashlib.sha256(f"{len(run_id)}:{run_id}:{checkpoint_name}".encode()).hexdigest()
    return f"tether-{digest[:40]}"


@dataclass(slots=True)
class RunContext:
    """One execution (or replay) of one run by this worker."""

    engine: Engine
    run_id: str
    workflow: str
    lease: Lease
    history: dict[int, Checkpoint]
    next_seq: int = 0
    occurrences: Counter[str] = field(default_factory=Counter)
    requested: list[str] = field(default_factory=list)
    pending: list[Checkpoint] = field(default_factory=list)  # recorded helpers not yet written
    inflight: int = 0  # step bodies executing now
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    abandoned: BaseException | None = None
    replay_only: bool = False  # checking a history: never execute, stop where it ends
    writes: int = 0  # checkpoints this execution wrote: whether it made progress

    def __post_init__(self) -> None:
        self.settled.set()

    def next_name(self, base: str) -> str:
        """The name the next checkpoint called `base` would get (`base`, `base#2`, ...)."""
        count = self.occurrences[base] + 1
        return base if count == 1 else f"{base}#{count}"

    def slot(self, base: str, kind: str) -> tuple[int, str, Checkpoint | None]:
        """The next position in the history for a checkpoint named `base`, and what is recorded
        there. Raises Abandon(NonDeterminismError) if the history holds another name there."""
        self.occurrences[base] += 1
        count = self.occurrences[base]
        name = base if count == 1 else f"{base}#{count}"
        seq = self.next_seq
        self.next_seq += 1
        self.requested.append(name)
        recorded = self.history.get(seq)
        if recorded is not None and (recorded.name != name or recorded.kind != kind):
            raise Abandon(self.divergence(seq))
        if self.replay_only and (recorded is None or recorded.status not in _FINAL):
            raise EndOfHistory()
        return seq, name, recorded

    def divergence(self, seq: int) -> NonDeterminismError:
        recorded = [c.name for _, c in sorted(self.history.items())]
        at = self.history.get(seq)
        what = (
            f"recorded {at.name!r} at position {seq}, this code asked for {self.requested[seq]!r}"
            if at is not None and seq < len(self.requested)
            else f"this code stopped after {len(self.requested)} checkpoints"
        )
        return NonDeterminismError(
            f"run {self.run_id!r} of workflow {self.workflow!r} no longer replays: {what}. "
            f"Recorded: {recorded}; requested: {self.requested}. Let runs started on the old "
            f"code finish on it (deploy the change beside it), or start them anew.",
            recorded=recorded,
            requested=list(self.requested),
        )

    def unreplayed(self) -> int | None:
        """The first recorded position this execution never asked for, if any."""
        missing = [seq for seq in self.history if seq >= self.next_seq]
        return min(missing) if missing else None

    async def write(self, checkpoint: Checkpoint) -> None:
        """Write a checkpoint durably (with any recorded helpers queued before it)."""
        if self.abandoned is not None:
            raise self.abandoned
        store = self.engine.store
        pending = self.pending
        self.pending = []

        async def call() -> None:
            now = self.engine.clock.now()
            if pending:
                await asyncio.gather(*(store.write_checkpoint(self.lease, c, now) for c in pending))
            await store.write_checkpoint(self.lease, checkpoint, now)

        async def read_back() -> object:
            history = {c.seq: c for c in await store.load_history(self.run_id)}
            written = all(
                (found := history.get(c.seq)) is not None
                and (found.status, found.attempts) == (c.status, c.attempts)
                for c in [*pending, checkpoint]
            )
            return None if written else MISSING

        await self.durable(call, read_back)
        self.history[checkpoint.seq] = checkpoint
        self.writes += 1

    async def take_event(self, keys: Sequence[str], done: Checkpoint, now: float) -> str | None:
        """Consume the oldest event for `keys` into the checkpoint `done` (see Store)."""
        if self.abandoned is not None:
            raise self.abandoned
        if self.pending:
            await self.flush()
        store = self.engine.store

        async def call() -> str | None:
            return await store.take_event(self.lease, keys, done, self.engine.clock.now())

        async def read_back() -> object:
            # Taken before the acknowledgement was lost: the checkpoint holds it. Taking again
            # would consume a second event.
            found = {c.seq: c for c in await store.load_history(self.run_id)}.get(done.seq)
            return found.result if found is not None else MISSING

        taken = await self.durable(call, read_back)
        if taken is not None:
            self.history[done.seq] = done
            self.writes += 1
        return None if taken is None else str(taken)

    async def durable(
        self, call: Callable[[], Awaitable[object]], read_back: Callable[[], Awaitable[object]]
    ) -> Any:
        """A store write on this run's behalf, through retry_store; losing the lease or the
        database for good abandons the run."""
        try:
            return await retry_store(self.engine, call, read_back)
        except (LeaseLost, StoreUnavailable) as exc:
            self.abandoned = Abandon(exc)
            raise self.abandoned from None

    def decode(self, recorded: Checkpoint | str, load: Callable[[], T]) -> T:
        """`load()`: the value of a recorded checkpoint (or of what `recorded` names) decoded.
        One that cannot be (its text is not JSON, or no longer fits the code's type hint)
        stops this execution: user code cannot catch that, since going on would take another
        path than the recorded one. The runner counts it as a failed execution."""
        try:
            return load()
        except Exception as exc:  # only decoding runs in load: it does not fit this code
            what = (recorded if isinstance(recorded, str)
                    else f"checkpoint {recorded.name!r} (position {recorded.seq})")  # fmt: skip
            self.abandoned = Abandon(SerializationError(
                f"{what} of run {self.run_id!r} cannot be decoded by this code: {exc}. Deploy "
                f"code that reads it (the type hint it was recorded under), or repair the row, "
                f"then `tether runs resume {self.run_id}`"
            ))  # fmt: skip
            raise self.abandoned from None

    def peek(self) -> Checkpoint | None:
        """What the history holds at the next position, without taking it."""
        return self.history.get(self.next_seq)

    def replaying(self) -> bool:
        """Whether the history holds checkpoints at or after the next position."""
        return any(seq >= self.next_seq for seq in self.history)

    async def flush(self) -> None:
        """Write the recorded helpers still queued (before a step body runs or the run ends)."""
        while self.pending:
            last = self.pending.pop()
            await self.write(last)

    def enter_body(self) -> None:
        self.inflight += 1
        self.settled.clear()

    def leave_body(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self.settled.set()


_FINAL = (CheckpointStatus.COMPLETED, CheckpointStatus.FAILED)

MISSING = object()  # what a read-back returns when the write did not happen


async def retry_store(
    engine: Engine, call: Callable[[], Awaitable[T]], read_back: Callable[[], Awaitable[object]]
) -> T:
    """Run a store write; while the database is unreachable, try again with backoff (for up to
    settings.store_outage seconds). A write whose acknowledgement was lost is resolved by
    reading it back, never by writing twice: `read_back` returns the outcome if the write
    happened, MISSING if not."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + engine.settings.store_outage
    delay = 0.05
    while True:
        try:
            return await call()
        except StoreUnavailable as exc:
            if loop.time() >= give_up:
                raise
            log.warning("the database is unreachable (%s); retrying in %.2fs", exc, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
        try:
            found = await read_back()
        except StoreUnavailable:
            continue
        if found is not MISSING:
            return found  # type: ignore[return-value]


_RUN: ContextVar[RunContext | None] = ContextVar("tether_run", default=None)
_STEP: ContextVar[StepContext | None] = ContextVar("tether_step", default=None)


def current_run(helper: str) -> RunContext:
    ctx = _RUN.get()
    if ctx is None or _STEP.get() is not None:
        raise NotInWorkflow(
            f"tether.{helper}() only works inside a running workflow (not in a step or outside "
            f"a run); inside a step use ordinary Python, its result is recorded as a whole"
        )
    return ctx


def current_step() -> StepContext | None:
    return _STEP.get()


def current_scope(helper: str) -> tuple[RunContext, StepContext | None]:
    """The run being executed and, inside one of its steps, the step attempt: for helpers
    that work in workflow code and in steps alike. Raises NotInWorkflow outside a run."""
    ctx = _RUN.get()
    if ctx is None:
        raise NotInWorkflow(
            f"tether.{helper}() only works inside a running workflow or one of its steps; "
            f"call it from the workflow or step code that App executes"
        )
    return ctx, _STEP.get()


def ambient() -> tuple[RunContext | None, StepContext | None]:
    """The run being executed here and its step attempt, each None when there is none: for
    code that only describes where it is (log records), never raises."""
    return _RUN.get(), _STEP.get()


def _recorded(helper: str, make: Any) -> Any:
    ctx = current_run(helper)
    seq, name, recorded = ctx.slot(helper, helper)
    serde = ctx.engine.serde
    if recorded is not None:
        return ctx.decode(recorded, lambda: serde.loads(recorded.result or "null"))
    value = make()
    text = serde.dumps(value, what=f"tether.{helper}()")
    now = ctx.engine.clock.now()
    ctx.pending.append(
        Checkpoint(
            seq=seq,
            name=name,
            kind=helper,
            status=CheckpointStatus.COMPLETED,
            result=text,
            attempts=1,
            started_at=now,
            finished_at=now,
        )
    )
    return serde.loads(text)


def now_seconds() -> float:
    ctx = current_run("now")
    return float(_recorded("now", ctx.engine.clock.now))


def uuid4() -> uuid.UUID:
    """A random UUID, recorded: the same value when the run replays."""
    value = _recorded("uuid4", lambda: uuid.UUID(bytes=secrets.token_bytes(16), version=4))
    assert isinstance(value, uuid.UUID)
    return value


def random() -> float:
    """A random float in [0, 1), recorded: the same value when the run replays."""
    return float(_recorded("random", lambda: secrets.randbits(53) / (1 << 53)))


def patched(change_id: str) -> bool:
    """Whether this run takes the new code path of a change: True for runs that reach this call
    under the new code (a marker is recorded), False when replaying a history recorded before
    the change. Gate a changed sequence of steps with it, and remove it once old runs ended."""
    if not isinstance(change_id, str) or not change_id:
        raise ConfigurationError(f"tether.patched() takes a non-empty change id, not {change_id!r}")
    ctx = current_run("patched")
    base = f"patch:{change_id}"
    at = ctx.peek()
    if at is not None and at.kind == "patch" and at.name == ctx.next_name(base):
        ctx.slot(base, "patch")
        return True
    if ctx.replaying():
        return False  # recorded before the change: keep the old path
    seq, name, _ = ctx.slot(base, "patch")
    now = ctx.engine.clock.now()
    ctx.pending.append(
        Checkpoint(
            seq=seq,
            name=name,
            kind="patch",
            status=CheckpointStatus.COMPLETED,
            result="true",
            attempts=1,
            started_at=now,
            finished_at=now,
        )
    )
    return True


def idempotency_key() -> str:
    """A key for the current step's side effect: the same across its attempts and replays,
    different for every other step and run. Pass it to the receiver of the effect."""
    step = _STEP.get()
    if step is None:
        raise NotInWorkflow(
            "tether.idempotency_key() only works inside a step of a running workflow; "
            "call it from the step that performs the side effect"
        )
    return step.idempotency_key

"""A transaction step: a step whose body gets a connection to Tether's own database and runs in
the transaction that writes its completed checkpoint (one Store.run_transaction per attempt,
fenced by the lease), and the outbox messages such a body records. Replay, attempts and
retries are the step's (core.step). The connection is opaque here: this module imports no
database driver and touches the store only through the run's context.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar

from tether.core.context import _RUN, _STEP, StepContext
from tether.core.execution import RunContext
from tether.core.outage import MISSING
from tether.core.retry import Retry
from tether.core.slot import Slot, arguments
from tether.core.step import DEFAULT_RETRY, _execute
from tether.core.workflow import type_hints
from tether.errors import ConfigurationError, NotInWorkflow
from tether.store.keys import message_id
from tether.store.port import Checkpoint, CheckpointStatus
from tether.store.port.outbox import NewOutboxMessage, TransactionOutcome

if TYPE_CHECKING:
    from tether.core.engine import Engine

C = TypeVar("C")
P = ParamSpec("P")
R = TypeVar("R")

KIND = "transaction"  # the checkpoint kind of a transaction step


@dataclass(slots=True)
class TxScope:
    """The transaction body being executed: the messages it records with its commit."""

    engine: Engine
    run_id: str
    checkpoint: str
    messages: list[NewOutboxMessage] = field(default_factory=list)

    def add(self, destination: str, payload: str, key: str | None) -> NewOutboxMessage:
        """Record a message; its id comes from the run, the step and its index in the body,
        so every attempt of the body gives its messages the same ids."""
        mid = message_id(self.run_id, self.checkpoint, len(self.messages))
        message = NewOutboxMessage(mid, destination, key or mid, payload)
        self.messages.append(message)
        return message


_SCOPE = object()  # where a transaction body's TxScope is attached to its StepContext


def current_transaction() -> TxScope | None:
    """The transaction body executing here, if any."""
    step = _STEP.get()
    scope = None if step is None else step.attached.get(_SCOPE)
    return scope if isinstance(scope, TxScope) else None


class Transaction(Generic[C, P, R]):
    """A step whose body `fn(connection, *args)` runs inside the database transaction that
    records its checkpoint. Await it inside a workflow, without the connection."""

    def __init__(
        self,
        fn: Callable[Concatenate[C, P], R],
        *,
        name: str,
        retry: Retry | None,
        on_commit: Callable[[int], None] | None = None,
    ) -> None:
        if inspect.iscoroutinefunction(fn) or not callable(fn):
            raise ConfigurationError(
                f"@app.transaction() needs a plain `def` taking the connection first; "
                f"{getattr(fn, '__qualname__', fn)!r} is not one (the body runs inside the "
                f"database transaction, which it must not leave to await)"
            )
        if retry is not None and not isinstance(retry, Retry):
            raise ConfigurationError(f"retry= takes a tether.Retry, not {retry!r}")
        self.fn = fn
        self.name = name
        self.retry = retry or DEFAULT_RETRY
        self.timeout: float | None = None  # a body inside a transaction cannot be interrupted
        self.at_most_once = False  # its effect commits with its checkpoint: never uncertain
        self.in_doubt: tuple[type[BaseException], ...] = ()
        self.return_hint: object = type_hints(fn).get("return", Any)
        # Told how many messages a committed attempt recorded (the App wakes its delivery).
        self.on_commit = on_commit
        self.__name__ = getattr(fn, "__name__", name)
        self.__qualname__ = getattr(fn, "__qualname__", name)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<tether transaction step {self.name!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        ctx = _RUN.get()
        if ctx is None or _STEP.get() is not None:
            raise NotInWorkflow(
                f"transaction step {self.name!r} runs only in workflow code (await it there, "
                f"without the connection); to try its body alone, call "
                f"{self.__name__}.fn(connection, ...)"
            )
        slot = ctx.slot(self.name, KIND, arguments(args, kwargs))
        commit = functools.partial(_commit, self, ctx, slot, args, kwargs)
        return _execute(self, ctx, slot, args, kwargs, commit=commit)


async def _commit(
    tx: Transaction[Any, ..., Any],
    ctx: RunContext,
    slot: Slot,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    step_ctx: StepContext,
    outcome: Callable[..., Checkpoint],
) -> tuple[Any, Checkpoint]:
    """One attempt: the body and its completed checkpoint, in one store transaction. Returns
    the body's value and the checkpoint written; what the body raised propagates (all of its
    writes rolled back)."""
    name = slot.name
    engine = ctx.engine
    clock, serde, store = engine.clock, engine.serde, engine.store
    what = f"result of transaction step {name!r}"
    base = contextvars.copy_context()
    last: dict[str, Any] = {}  # the value, text and messages of the body's last execution

    def body(conn: object) -> TransactionOutcome:
        scope = TxScope(engine, ctx.run_id, name)

        def run() -> tuple[Any, str]:
            _STEP.set(step_ctx)
            step_ctx.attached[_SCOPE] = scope
            value = tx.fn(conn, *args, **kwargs)
            if inspect.isawaitable(value):
                getattr(value, "close", lambda: None)()
                raise ConfigurationError(
                    f"transaction step {name!r} returned an awaitable; its body must be a "
                    f"plain def that does its work before returning"
                )
            return value, serde.dumps(value, what=what)

        # In a context of the run's own: the body may run on another thread (the store's
        # writer), and again after a database outage (one execution at a time).
        value, text = base.run(run)
        finished = clock.now()
        last.update(value=value, text=text, messages=len(scope.messages), finished=finished)
        return TransactionOutcome(text, tuple(scope.messages), finished)

    template = outcome(status=CheckpointStatus.COMPLETED, finished_at=clock.now())

    async def call() -> str:
        return await store.run_transaction(ctx.lease, body, template, clock.now())

    async def read_back() -> object:
        # Committed before the acknowledgement was lost: the checkpoint holds its result.
        found = {c.at: c for c in await store.load_history(ctx.run_id)}.get(slot.position)
        if (
            found is not None
            and found.status is CheckpointStatus.COMPLETED
            and found.attempts == template.attempts
        ):
            return found.result
        return MISSING

    try:
        text = await ctx.durable(call, read_back)
    except BaseException as exc:
        await step_ctx.finish(exc)
        raise
    await step_ctx.finish(None)
    done = replace(template, result=text, finished_at=last.get("finished", template.finished_at))
    ctx.recorded(done)
    if tx.on_commit is not None:
        tx.on_commit(int(last.get("messages", 1)))
    if last.get("text") == text:
        return last["value"], done
    return ctx.decode(done, lambda: serde.loads(text or "null", tx.return_hint, what=what)), done

"""The App's side of transactions and the outbox: `@app.transaction()`, the senders given to
`App(senders=...)` (with the delivery service they feed, registered with the engine), and the
look-ups `app.list_outbox()` and `app.retry_outbox()`. A thin facade: it validates what callers
pass, then calls core and the store. It must not import a backend, the server or the CLI.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast, overload

from tether.core.retry import Retry
from tether.core.transaction import Transaction
from tether.errors import ConfigurationError
from tether.outbox.delivery import OUTBOX_RETRY, SERVICE, Delivery
from tether.outbox.senders import Sender
from tether.store.port.outbox import OutboxMessage, OutboxStatus

if TYPE_CHECKING:
    from tether.core.engine import Engine

C = TypeVar("C")
P = ParamSpec("P")
R = TypeVar("R")


class _TransactionDecorator:
    """What `@app.transaction(...)` with options returns; typed so the step keeps its types."""

    def __init__(
        self, register: Callable[[Callable[..., Any]], Transaction[Any, ..., Any]]
    ) -> None:
        self._register = register

    def __call__(self, fn: Callable[Concatenate[C, P], R], /) -> Transaction[C, P, R]:
        return cast("Transaction[C, P, R]", self._register(fn))


class OutboxMixin:
    """The App's transaction and outbox methods (App inherits them)."""

    engine: Engine
    _delivery: Delivery

    if TYPE_CHECKING:

        async def open(self) -> None: ...

    def _init_outbox(self, senders: Mapping[str, Sender] | None) -> None:
        """Called by App.__init__ with its `senders=`: check them and register the delivery
        service with the engine (the worker runs it)."""
        checked: dict[str, Sender] = {}
        for name, sender in (senders or {}).items():
            if not isinstance(name, str) or not name or len(name) > 256:
                raise ConfigurationError(f"a sender's name is a non-empty str, not {name!r}")
            if not inspect.iscoroutinefunction(getattr(sender, "send", None)):
                raise ConfigurationError(
                    f"sender {name!r} ({sender!r}) has no `async def send(message)`; subclass "
                    f"tether.Sender, or use tether.HttpSender(url)"
                )
            checked[name] = sender
        self._delivery = Delivery(self.engine, checked, OUTBOX_RETRY)
        self.engine.services[SERVICE] = self._delivery

    @property
    def outbox_retry(self) -> Retry:
        """The retry policy of outbox sends whose sender has none of its own (by default 10
        attempts, from 1 s apart up to 5 min)."""
        return self._delivery.retry

    @outbox_retry.setter
    def outbox_retry(self, policy: Retry) -> None:
        if not isinstance(policy, Retry):
            raise ConfigurationError(f"outbox_retry takes a tether.Retry, not {policy!r}")
        self._delivery.retry = policy

    @overload
    def transaction(self, fn: Callable[Concatenate[C, P], R], /) -> Transaction[C, P, R]: ...
    @overload
    def transaction(
        self, /, *, name: str | None = None, retry: Retry | None = None
    ) -> _TransactionDecorator: ...

    def transaction(
        self, fn: Any = None, /, *, name: str | None = None, retry: Retry | None = None
    ) -> Any:
        """Register `def f(conn, *args)` as a transaction step: awaited in a workflow as
        `await f(*args)`, its body gets a connection to Tether's own database (SQLite or
        PostgreSQL) inside the transaction that also records the step's checkpoint, so its
        writes and the checkpoint commit together or not at all. A body that raises is rolled
        back, then retried per `retry`. `tether.outbox()` inside it commits with it."""

        def register(f: Callable[..., Any]) -> Transaction[Any, ..., Any]:
            label = name or str(getattr(f, "__name__", "transaction"))
            return Transaction(f, name=label, retry=retry, on_commit=self._committed)

        return register(fn) if fn is not None else _TransactionDecorator(register)

    def _committed(self, messages: int) -> None:
        if messages:
            self._delivery.wake()

    async def list_outbox(
        self,
        *,
        status: OutboxStatus | str | None = None,
        run_id: str | None = None,
        limit: int = 100,
    ) -> list[OutboxMessage]:
        """Outbox messages, oldest first: `status` "pending", "sending", "delivered" or
        "failed" (a failed one holds its last error, `uncertain` counts the sends whose
        outcome was unknown), of one run or all."""
        try:
            wanted = None if status is None else OutboxStatus(status)
        except ValueError:
            raise ConfigurationError(
                f"unknown outbox status {status!r}; use {[s.value for s in OutboxStatus]}"
            ) from None
        await self.open()
        return await self.engine.store.list_outbox(status=wanted, run_id=run_id, limit=limit)

    async def retry_outbox(self, message_id: str) -> OutboxMessage:
        """Send a failed message again (after a fix on the receiver's side): it becomes
        pending, due now, with a fresh count of attempts and the same idempotency key.
        ConfigurationError for an unknown message or one that has not failed."""
        await self.open()
        engine = self.engine
        found = await engine.store.retry_outbox(message_id, engine.clock.now())
        if found is None:
            raise ConfigurationError(
                f"no outbox message has id {message_id!r}; list them with app.list_outbox()"
            )
        if found.status is not OutboxStatus.PENDING:
            raise ConfigurationError(
                f"outbox message {message_id!r} is {found.status.value}; only a failed one is "
                f"sent again"
            )
        self._delivery.wake()
        return found

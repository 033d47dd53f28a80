"""Recording an outgoing message: `tether.outbox(destination, payload)`. Inside a transaction
step's body the message commits with the body; in workflow code `await` it: the message and a
checkpoint of its own commit in one transaction, and replay finds the checkpoint and writes
nothing. Ids come from the run and the checkpoint, so no retry records a second message.
It never sends (the delivery service does) and touches the store only through the run's context.
"""

from __future__ import annotations

import json
from collections.abc import Coroutine, Generator
from typing import Any

from tether.core.context import current_scope
from tether.core.engine import Engine
from tether.core.execution import RunContext
from tether.core.outage import MISSING
from tether.core.slot import Slot
from tether.core.transaction import current_transaction
from tether.errors import ConfigurationError, NotInWorkflow
from tether.outbox.delivery import SERVICE, Delivery
from tether.store.keys import message_id
from tether.store.port import CheckpointStatus
from tether.store.port.outbox import NewOutboxMessage, TransactionOutcome

KIND = "outbox"  # the checkpoint kind (and name) of an outbox call in workflow code
_MAX_DESTINATION = 2048
_MAX_KEY = 255


class Outgoing:
    """A message recorded by `tether.outbox()`: its `id`, its idempotency `key` (the same on
    every send) and its `destination`. In workflow code, await it: the message is recorded
    when the await returns (it returns this Outgoing)."""

    __slots__ = ("_commit", "destination", "id", "key")

    def __init__(
        self,
        id: str,
        key: str,
        destination: str,
        commit: Coroutine[Any, Any, Outgoing] | None = None,
    ) -> None:
        self.id, self.key, self.destination = id, key, destination
        self._commit = commit

    def __repr__(self) -> str:
        return f"<tether outbox message {self.id} to {self.destination!r}>"

    def __await__(self) -> Generator[Any, None, Outgoing]:
        if self._commit is None:
            raise ConfigurationError(
                "this message was recorded inside a transaction step and commits with its "
                "body; there is nothing to await"
            )
        return self._commit.__await__()


def outbox(destination: str, payload: object, *, key: str | None = None) -> Outgoing:
    """Record an outgoing message to `destination` (a sender's name, or an http(s):// URL),
    committed with the current checkpoint and then delivered by the worker, carrying `key` as
    its idempotency key (by default its id, derived from the run and the checkpoint).

    Inside an `@app.transaction()` body: the message commits with the body's writes. In
    workflow code: `await tether.outbox(...)`; the message and its checkpoint commit together,
    and replay records nothing again. Elsewhere (outside a run, in a plain step): NotInWorkflow.
    An unknown destination raises ConfigurationError here, not at delivery."""
    if not isinstance(destination, str) or not destination or len(destination) > _MAX_DESTINATION:
        raise ConfigurationError(
            f"an outbox destination is a sender's name or an http(s):// URL (a str of 1-"
            f"{_MAX_DESTINATION} characters), not {destination!r}"
        )
    if key is not None and (not isinstance(key, str) or not key or len(key) > _MAX_KEY):
        raise ConfigurationError(f"an outbox key is a str of 1-{_MAX_KEY} characters: {key!r}")
    scope = current_transaction()
    if scope is not None:
        _check_destination(scope.engine, destination)
        text = scope.engine.serde.dumps(payload, what=f"the payload of a message to {destination}")
        message = scope.add(destination, text, key)
        return Outgoing(message.id, message.key, destination)
    ctx, step = current_scope("outbox")
    if step is not None:
        raise NotInWorkflow(
            "tether.outbox() works in workflow code (await it) or inside an "
            "@app.transaction() body, where the message commits with a checkpoint; a plain "
            "step has no commit to join: return the data and record the message from the "
            "workflow, or make the step a transaction step"
        )
    _check_destination(ctx.engine, destination)
    text = ctx.engine.serde.dumps(payload, what=f"the payload of a message to {destination}")
    slot = ctx.slot(KIND, KIND)
    mid = message_id(ctx.run_id, slot.name, 0)
    message = NewOutboxMessage(mid, destination, key or mid, text)
    return Outgoing(mid, message.key, destination, _record(ctx, slot, message))


def _check_destination(engine: Engine, destination: str) -> None:
    delivery = engine.services.get(SERVICE)
    if isinstance(delivery, Delivery):
        delivery.resolve(destination)


async def _record(ctx: RunContext, slot: Slot, message: NewOutboxMessage) -> Outgoing:
    """The message and its checkpoint, in one store transaction (nothing when replaying)."""
    recorded = slot.recorded
    if recorded is not None:
        data = ctx.decode(recorded, lambda: json.loads(recorded.result or "{}"))
        return Outgoing(str(data["id"]), str(data["key"]), str(data["destination"]))
    await ctx.at_frontier()
    if ctx.pending:
        await ctx.flush()  # recorded helpers before it: the payload may depend on them
    engine = ctx.engine
    store, clock = engine.store, engine.clock
    now = clock.now()
    result = json.dumps({"id": message.id, "key": message.key, "destination": message.destination})
    done = slot.checkpoint(CheckpointStatus.COMPLETED, result=result, attempts=1,
                           started_at=now, finished_at=now)  # fmt: skip

    def body(conn: object) -> TransactionOutcome:
        return TransactionOutcome(result, (message,))

    async def call() -> str:
        return await store.run_transaction(ctx.lease, body, done, clock.now())

    async def read_back() -> object:
        # Committed before the acknowledgement was lost: the checkpoint is there.
        found = {c.at: c for c in await store.load_history(ctx.run_id)}.get(slot.position)
        return MISSING if found is None else found.result

    await ctx.durable(call, read_back)
    ctx.recorded(done)
    delivery = engine.services.get(SERVICE)
    if isinstance(delivery, Delivery):
        delivery.wake()
    if engine.settings.force_replay:
        await ctx.replay_now()
    return Outgoing(message.id, message.key, message.destination)

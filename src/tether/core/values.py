"""Publishing a value from workflow code (`await tether.set_value(key, value)`), as a checkpoint.

A set_value takes a checkpoint slot (`value:<key>`, kind "value"); the store writes the value's
next version and that checkpoint in one transaction, so replay finds the checkpoint and writes
nothing, and a lost acknowledgement is resolved by reading the checkpoint back. It never reads
values (callers do, through the App) and touches the store only through the run's context.
"""

from __future__ import annotations

from tether.core.context import current_run
from tether.core.engine import Engine
from tether.core.outage import MISSING
from tether.errors import ConfigurationError
from tether.store.port import CheckpointStatus

KEY_MAX = 200


def check_value_key(key: str) -> str:
    """A value's key: 1-200 characters without '#' (which names a checkpoint's occurrence)."""
    if not isinstance(key, str) or not key or len(key) > KEY_MAX or "#" in key:
        raise ConfigurationError(
            f"a value key is a str of 1-{KEY_MAX} characters without '#', not {key!r}"
        )
    return key


def wake_key(key: str) -> str:
    """Where this process's readers of value `key` wait (Engine.stream_future): a set_value
    here wakes them at once, and so does the end of the run's execution here. A user stream
    of the same name only wakes them for nothing: they read again and wait on."""
    return f"tether:value:{key}"


async def set_value(key: str, value: object) -> None:
    """Publish `value` under `key` for callers of this run (`app.get_value(run_id, key)`):
    durable when this returns; the latest value of a key wins. Replay writes nothing. The
    value is JSON like a step's result (PayloadTooLarge before anything is written).
    Workflow code only: NotInWorkflow outside a run and inside steps."""
    check_value_key(key)
    ctx = current_run("set_value")
    slot = ctx.slot(f"value:{key}", "value")
    if slot.recorded is not None:
        return  # published when it was recorded
    engine = ctx.engine
    text = engine.serde.dumps(value, what=f"value {key!r}")
    await ctx.at_frontier()
    if ctx.pending:
        await ctx.flush()  # recorded helpers before it: no value can depend on an unrecorded one
    now = engine.clock.now()
    done = slot.checkpoint(CheckpointStatus.COMPLETED, attempts=1, started_at=now,
                           finished_at=now)  # fmt: skip

    async def call() -> int:
        return await engine.store.set_value(ctx.lease, key, text, done, engine.clock.now())

    async def read_back() -> object:
        # Written before the acknowledgement was lost: the checkpoint is there, and writing
        # again would publish a second version.
        found = {c.at: c for c in await engine.store.load_history(ctx.run_id)}.get(slot.position)
        return MISSING if found is None else 0

    await ctx.durable(call, read_back)
    ctx.recorded(done)
    published(engine, ctx.run_id, key)


def published(engine: Engine, run_id: str, key: str) -> None:
    """A value was set: wake this process's readers waiting for it."""
    engine.stream_appended(run_id, wake_key(key))

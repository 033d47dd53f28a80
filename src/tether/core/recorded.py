"""The recorded helpers of workflow code: `tether.now()`, `uuid4()`, `random()` and `patched()`.

Each takes a checkpoint slot: the first execution makes the value and queues its checkpoint
(written with the next write, before any other effect), replay returns the recorded value.
It does no I/O of its own.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from typing import Any

from tether.core.context import current_run
from tether.errors import ConfigurationError
from tether.store.port import CheckpointStatus


def _recorded(helper: str, make: Callable[[], object]) -> Any:
    ctx = current_run(helper)
    slot = ctx.slot(helper, helper)
    serde = ctx.engine.serde
    recorded = slot.recorded
    if recorded is not None:
        return ctx.decode(recorded, lambda: serde.loads(recorded.result or "null"))
    text = serde.dumps(make(), what=f"tether.{helper}()")
    now = ctx.engine.clock.now()
    ctx.pending.append(slot.checkpoint(CheckpointStatus.COMPLETED, result=text, attempts=1,
                                       started_at=now, finished_at=now))  # fmt: skip
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
    at, name = ctx.peek(base)
    if at is not None and at.kind == "patch" and at.name == name:
        ctx.slot(base, "patch")
        return True
    if ctx.replaying():
        return False  # recorded before the change: keep the old path
    slot = ctx.slot(base, "patch")
    now = ctx.engine.clock.now()
    ctx.pending.append(slot.checkpoint(CheckpointStatus.COMPLETED, result="true", attempts=1,
                                       started_at=now, finished_at=now))  # fmt: skip
    return True

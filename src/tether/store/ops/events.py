"""The operations on runs' mailboxes: deliver an event, take one (with the checkpoint that
records it), and follow the events other processes delivered.

Written once for both SQL dialects; it must not touch a connection or a driver.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from tether.errors import RunNotFound
from tether.store.ops.checkpoints import write_checkpoint
from tether.store.ops.common import deliver, fence, lease_lost
from tether.store.port import Checkpoint, EventRef, Lease, RunRecord
from tether.store.query import Op, Query, one, select
from tether.store.rows import run_from_row


def deliver_event(run_id: str, key: str, payload: str, now: float) -> Op[RunRecord]:
    row = yield from one("get_run", id=run_id)
    if row is None:
        raise RunNotFound(f"no run has id {run_id!r}; check the id with `tether runs list`")
    record = run_from_row(row)
    if not record.status.terminal:
        yield from deliver(run_id, key, payload, now)
    return record


def has_event(run_id: str, keys: Sequence[str]) -> Op[bool]:
    """Whether the mailbox holds an unconsumed event among `keys` (a read: a look at an empty
    mailbox costs no write)."""
    return (yield from one("oldest_event", run_id=run_id, keys=list(keys))) is not None


def take_event(
    lease: Lease, keys: Sequence[str], checkpoint: Checkpoint, now: float
) -> Op[str | None]:
    if (yield from one("lease_held", **fence(lease))) is None:
        raise (yield from lease_lost(lease))
    row = yield from one("oldest_event", run_id=lease.run_id, keys=list(keys))
    if row is None:
        return None
    event_id, key, payload = row
    yield Query("consume_event", {"id": event_id, "by": checkpoint.name, "now": now})
    result = f'{{"key":{json.dumps(key)},"value":{payload}}}'
    yield from write_checkpoint(lease, checkpoint, result)
    return result


def events_after(event_id: int, limit: int) -> Op[list[EventRef]]:
    rows = yield from select("events_after", after=event_id, limit=limit)
    return [EventRef(*r) for r in rows]


def last_event_id() -> Op[int]:
    row = yield from one("last_event_id")
    assert row is not None
    return int(row[0])

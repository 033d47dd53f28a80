"""The names the store derives: mailbox keys on which a run learns of its child's end and of
its approval's decision, and the ids of outbox messages. Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
import json

from tether.store.port.runs import (
    RunStatus,
)


def child_key(child_id: str) -> str:
    """The mailbox key on which a parent learns that its child run ended."""
    return f"tether:child:{child_id}"


def child_outcome(status: RunStatus | str, result: str | None, error: str | None) -> str:
    """The payload of a child's end in its parent's mailbox: how it ended, with the texts of
    its result and error (the mailbox row is the parent's record of the child's end)."""
    return json.dumps({"status": str(status), "result": result, "error": error})


def approval_key(approval_id: str) -> str:
    """The mailbox key on which a run learns that its approval was decided or closed."""
    return f"tether:approval:{approval_id}"


def message_id(run_id: str, checkpoint: str, index: int) -> str:
    """The id (and default idempotency key) of the `index`-th message recorded with the
    checkpoint `checkpoint` of run `run_id`: the same on every retry and replay."""
    text = f"{len(run_id)}:{run_id}:{checkpoint}:{index}"
    return f"tether-msg-{hashlib.sha256(text.encode()).hexdigest()[:40]}"

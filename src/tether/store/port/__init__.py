"""The Store port: the short list of atomic operations Tether needs from a database, by concept.

- runs.py (CorePort): workers (register, heartbeat, release), runs (create, claim, suspend,
  finish, fail, hold, cancel, resume, dead-letter), checkpoints (load, write), mailboxes
  (deliver, take, follow), counts; the records they share (RunRecord, Checkpoint, Lease...).
- approvals.py (ApprovalsPort), users.py (UsersPort), streams.py (StreamsPort), outbox.py
  (OutboxPort: transaction steps and messages), schedules.py (SchedulesPort), values.py
  (ValuesPort: values and forks), retention.py (RetentionPort): each feature's operations
  beside its records.
- actions.py (ActionsPort): the trail of what people did to runs and messages (append, list).
- maintenance.py (Maintenance): upkeep only the SQL drivers implement (pages, VACUUM, WAL).

Each operation is one transaction: it happens whole or not at all. Writes made for a run are
fenced by a Lease (run id, worker id, epoch): a worker whose lease was taken over gets
LeaseLost. Backends implement this and nothing more; all engine logic lives above it, once.
It must not import tether.core or any backend.
"""

from __future__ import annotations

from typing import Protocol

from tether.store.port.actions import ActionsPort
from tether.store.port.approvals import ApprovalsPort
from tether.store.port.maintenance import Maintenance
from tether.store.port.outbox import OutboxPort
from tether.store.port.retention import RetentionPort
from tether.store.port.runs import (
    POSITIONS,
    TERMINAL_STATUSES,
    Checkpoint,
    CheckpointStatus,
    CorePort,
    EventRef,
    HeartbeatReply,
    Lease,
    NewRun,
    QueueLimits,
    RunRecord,
    RunStatus,
    StoreStats,
    WorkerInfo,
)
from tether.store.port.schedules import SchedulesPort
from tether.store.port.streams import StreamsPort
from tether.store.port.users import UsersPort
from tether.store.port.values import ValuesPort

__all__ = [
    "POSITIONS",
    "TERMINAL_STATUSES",
    "ActionsPort",
    "ApprovalsPort",
    "Checkpoint",
    "CheckpointStatus",
    "CorePort",
    "EventRef",
    "HeartbeatReply",
    "Lease",
    "Maintenance",
    "NewRun",
    "OutboxPort",
    "QueueLimits",
    "RetentionPort",
    "RunRecord",
    "RunStatus",
    "SchedulesPort",
    "Store",
    "StoreStats",
    "StreamsPort",
    "UsersPort",
    "ValuesPort",
    "WorkerInfo",
]


class Store(
    CorePort,
    ApprovalsPort,
    UsersPort,
    StreamsPort,
    OutboxPort,
    SchedulesPort,
    ValuesPort,
    RetentionPort,
    ActionsPort,
    Maintenance,
    Protocol,
):
    """A database that Tether can run on: every part of the port. One method, one
    transaction."""

"""The approvals part of the Store port: the approval row, its hash-chained audit entries, the
change a caller asks the store to apply atomically, and the operations on them.

The store never judges a decision: it locks the row, calls the caller's pure `change` with what
it holds and writes the outcome in one transaction (tether.store.audit chains the entries).
It must not import tether.core or any backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tether.store.port.runs import Lease

PENDING = "pending"

APPROVED = "approved"

REJECTED = "rejected"

EXPIRED = "expired"

CANCELLED = "cancelled"

# Every status an approval can have. An option id may not be one of them: options other than
# `approve` decide with their own id as the status, so an option `approved` would approve.
STATUSES = frozenset({PENDING, APPROVED, REJECTED, EXPIRED, CANCELLED})

GENESIS = "0" * 64  # the prev_hash of an approval's first audit entry


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """One approval. `operation` and `context` are stored redacted (what reviewers see); the
    digest covers the raw operation. JSON fields are text made by tether.serde or json."""

    id: str
    run_id: str
    step: str  # the checkpoint name of the approval call in its run
    title: str
    description: str
    options: str  # JSON list of {id, label, style, schema}
    operation: str  # JSON, redacted
    operation_digest: str
    reviewers: str  # JSON list of names and "group:<name>"; "*" is anyone
    required: int  # distinct approvers needed
    separate_duties: bool  # the run's starter may not decide
    starter: str | None  # who started the run
    context: str  # JSON, redacted
    response_schema: str | None  # JSON schema every response must satisfy, if any
    created_at: float
    expires_at: float
    status: str = PENDING  # pending, approved, rejected, expired, cancelled, or an option id
    decision: str | None = None  # JSON {option, reviewer, approvers, comment, response, at}
    votes: str = "[]"  # JSON list of approvals given so far towards `required`
    outcomes: str = "[]"  # JSON list of {ref, outcome, detail, at} reported by the run
    audit_count: int = 0
    audit_head: str = GENESIS  # the hash of the newest audit entry
    updated_at: float = 0.0
    viewers: str = "[]"  # JSON list of the reviewers whose look is in the trail (once each)


@dataclass(frozen=True, slots=True)
class AuditEntry:
    approval_id: str
    seq: int  # 1, 2, ... per approval
    at: float
    event: str  # created, viewed, voted, decided, refused, expired, cancelled, outcome
    actor: str | None
    detail: str  # JSON object
    prev_hash: str
    hash: str


@dataclass(frozen=True, slots=True)
class Note:
    """An audit entry to append: the store gives it its place in the chain."""

    event: str
    actor: str | None = None
    detail: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ApprovalChange:
    """What a `change` function asks for: the approval's new state (None: unchanged), audit
    entries to append, and a payload to deliver to the run under approval_key(id), all in one
    transaction. `refused` carries the reason a request was refused (audit it in `notes`)."""

    record: ApprovalRecord | None = None
    notes: tuple[Note, ...] = ()
    event: str | None = None
    refused: str | None = None


@dataclass(frozen=True, slots=True)
class Eligible:
    """Who lists approvals to decide: `name`, and the `entries` of an approval's reviewers that
    admit them (their name, "*", "group:<g>" for each group); `after` (created_at, id) pages."""

    name: str
    entries: tuple[str, ...]
    after: tuple[float, str] = (float("-inf"), "")


# change(stored record, the run's status or None if the run is gone, now) -> ApprovalChange
ChangeFn = Callable[[ApprovalRecord, str | None, float], ApprovalChange]


class ApprovalsPort(Protocol):
    """Approvals and their audit trail."""

    async def create_approval(
        self, lease: Lease, record: ApprovalRecord, now: float
    ) -> tuple[ApprovalRecord, bool]:
        """Insert the approval with its first audit entry (audit.created_note: "created", actor
        None, detail {title, covers: the digest of its fixed fields, fixed: the main ones}),
        unless one with its id exists. Returns (the stored approval,
        whether it was created). Raises LeaseLost if the lease is not held."""

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        """The approval with this id, or None."""

    async def list_approvals(
        self,
        *,
        status: str | None = None,
        run_id: str | None = None,
        limit: int = 100,
        reviewer: Eligible | None = None,
    ) -> list[ApprovalRecord]:
        """Approvals, oldest first (by created_at, then id), filtered by status and run; with
        `reviewer`, only those whose reviewers hold one of `reviewer.entries` and whose
        separation of duties admits `reviewer.name` (a run starter is refused, and everyone when
        the starter is unknown), after `reviewer.after`. The filter is in the query, so approvals
        for others never crowd a reviewer's out of `limit`."""

    async def change_approval(
        self, approval_id: str, change: ChangeFn, now: float
    ) -> tuple[ApprovalRecord, ApprovalChange]:
        """Atomically: lock the approval, call `change(record, status of its run or None,
        now)` (pure, no I/O), store apply_change's row and audit entries, and deliver
        `change.event` (if any) to the run's mailbox under approval_key(id), as deliver_event
        does. Returns (the approval as stored after, the change). Raises ApprovalNotFound."""

    async def approval_audit(self, approval_id: str) -> list[AuditEntry]:
        """The approval's audit entries ordered by seq (empty if none)."""

    async def approval_steps(
        self, after: tuple[str, int] = ("", 0), limit: int = 1000
    ) -> list[tuple[str, int, str]]:
        """(run id, seq, name) of the checkpoints that record a run creating an approval (kind
        "approval"), ordered by run id and seq, after `after`: each names an approval that must
        exist (flow.approval_id(run id, name)) while its run does."""

    async def database_secret(self, name: str, fresh: str, now: float) -> str:
        """The secret this database keeps under `name` (such as the key of operation digests):
        the first call stores `fresh`, every later call, from any process, returns what was
        stored. Never shown by any API; rotating it is not supported."""

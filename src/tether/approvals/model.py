"""The public shapes of approvals: options, reviewers, the approval people see, the decision a
workflow gets, audit entries, and the digest that binds a decision to an operation.

Pure values: no store access, no clock. Converting a stored row into what people see happens
here, so every display shows the same redacted operation and context.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tether.clock import to_datetime
from tether.errors import ConfigurationError
from tether.serde import canonical
from tether.store.port.approvals import APPROVED, PENDING, STATUSES, ApprovalRecord, AuditEntry

_OPTION_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
STYLES = ("primary", "destructive", "default")
ANYONE = "*"
# Groups of service accounts (a metrics scraper): a user whose groups are all among these is
# never a reviewer, whatever the approval's reviewers say, `*` included.
SERVICE_GROUPS = frozenset({"metrics"})


@dataclass(frozen=True, slots=True)
class Option:
    """A choice offered to reviewers. The option `approve` approves; any other option decides
    the approval with its own id as the status (`reject` gives `rejected`). `schema` (a JSON
    schema) makes the option carry a typed response, validated before the decision counts."""

    id: str
    label: str
    style: str = "default"  # primary, destructive or default: how the inbox draws it
    schema: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _OPTION_ID.fullmatch(self.id):
            raise ConfigurationError(
                f"an option id is 1-64 chars of a-z, 0-9, '_' and '-', not {self.id!r}"
            )
        if self.id in STATUSES:
            raise ConfigurationError(
                f"option id {self.id!r} is reserved: {', '.join(sorted(STATUSES))} are the "
                "statuses of an approval, and an option decides with its id as the status. Use "
                "'approve' to approve, 'reject' to reject, or another word such as 'defer'"
            )
        if not isinstance(self.label, str) or not self.label.strip():
            raise ConfigurationError(f"option {self.id!r} needs a non-empty label")
        if self.style not in STYLES:
            raise ConfigurationError(f"option {self.id!r}: style is one of {STYLES}")
        check_schema(self.schema, f"option {self.id!r}")

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "label": self.label, "style": self.style, "schema": self.schema}


def _stored_option(data: dict[str, Any]) -> Option:
    """An option as stored. One stored before status words were reserved is shown as it is (a
    vote for it is refused by rules.vote), rather than making the approval unreadable."""
    if data.get("id") not in STATUSES:
        return Option(**data)
    option = object.__new__(Option)
    for name in ("id", "label", "style", "schema"):
        object.__setattr__(option, name, data.get(name, "default" if name == "style" else None))
    return option


def check_schema(schema: object, what: str) -> None:
    if schema is None:
        return
    if not isinstance(schema, dict):
        raise ConfigurationError(f"{what}: a response schema is a dict (JSON schema)")
    # Imported here: most programs never ask for a typed response, and `import tether` stays light.
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ConfigurationError(f"{what}: invalid JSON schema: {exc.message}") from None


APPROVE_REJECT = (
    Option("approve", "Approve", style="primary"),
    Option("reject", "Reject", style="destructive"),
)


@dataclass(frozen=True, slots=True)
class Reviewer:
    """Who decides: a name and the groups they belong to (`group:<name>` in an approval's
    reviewers admits every member)."""

    name: str
    groups: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or len(self.name) > 200:
            raise ConfigurationError(f"a reviewer needs a name of 1-200 chars, not {self.name!r}")
        object.__setattr__(self, "groups", frozenset(self.groups))

    @property
    def service(self) -> bool:
        """A service account (only SERVICE_GROUPS): it never decides an approval."""
        return bool(self.groups) and self.groups <= SERVICE_GROUPS

    def may_decide(self, reviewers: Sequence[str]) -> bool:
        if self.service:
            return False
        return (
            ANYONE in reviewers
            or self.name in reviewers
            or any(f"group:{group}" in reviewers for group in self.groups)
        )


def as_reviewer(reviewer: Reviewer | str) -> Reviewer:
    return reviewer if isinstance(reviewer, Reviewer) else Reviewer(reviewer)


def operation_digest(run_id: str, step: str, operation: object, *, key: bytes | None = None) -> str:
    """What a decision is bound to: HMAC-SHA256 under `key` (the database's digest key, see
    tether.approvals.digest) of the canonical JSON of (run id, step, operation). Without a key,
    the plain SHA-256 approvals made before keyed digests carry (it confirms guesses of a
    redacted value, so new approvals never use it)."""
    text = canonical([run_id, step, operation]).encode()
    if key is None:
        return hashlib.sha256(text).hexdigest()
    return hmac.new(key, text, hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class Decision:
    """How an approval ended, as the workflow sees it. `status` is approved, rejected, expired,
    cancelled, another option's id, or pending (a vote towards a quorum, from `app.decide`).
    For an option whose response carries `arguments`, `operation` is the edited operation and
    `operation_digest` its own digest: nobody approved that one yet (see docs/approvals.md)."""

    approval_id: str
    status: str
    option: str | None = None
    reviewer: str | None = None
    comment: str | None = None
    decided_at: datetime | None = None
    response: Any = None
    approvers: tuple[str, ...] = ()
    operation: Any = None
    operation_digest: str | None = None
    run_id: str = ""
    step: str = ""

    @property
    def approved(self) -> bool:
        return self.status == APPROVED

    async def report(self, outcome: str, *, detail: object = None) -> None:
        """Record in the approval's history what happened after the decision (inside the
        workflow; recorded once, also across replays)."""
        from tether.approvals.flow import report

        await report(self, outcome, detail)


def decision_from(
    approval_id: str, status: str, data: dict[str, Any] | None, run_id: str = "", step: str = ""
) -> Decision:
    """A Decision from the JSON a decision or closure stores (see rules.decision_json)."""
    data = data or {}
    at = data.get("at")
    return Decision(
        approval_id=approval_id,
        status=status,
        option=data.get("option"),
        reviewer=data.get("reviewer"),
        comment=data.get("comment"),
        decided_at=None if at is None else to_datetime(at),
        response=data.get("response"),
        approvers=tuple(data.get("approvers") or ()),
        run_id=run_id,
        step=step,
    )


@dataclass(frozen=True, slots=True)
class Approval:
    """An approval as reviewers see it: `operation` and `context` are redacted; the digest
    covers the operation as the workflow passed it."""

    id: str
    run_id: str
    step: str
    title: str
    description: str
    options: tuple[Option, ...]
    operation: Any
    operation_digest: str
    reviewers: tuple[str, ...]
    context: Any
    expires_at: datetime
    status: str
    created_at: datetime
    required: int = 1
    separate_duties: bool = False
    starter: str | None = None
    response_schema: dict[str, Any] | None = None
    approvers: tuple[str, ...] = ()  # approvals given so far towards `required`
    decision: Decision | None = None
    outcomes: tuple[dict[str, Any], ...] = ()

    @classmethod
    def of(cls, record: ApprovalRecord, now: float) -> Approval:
        """What people see of a stored approval; a pending one past its expiry shows as
        expired even before its run has closed it."""
        status = record.status
        if status == PENDING and now >= record.expires_at:
            status = "expired"
        decision_data = json.loads(record.decision) if record.decision else None
        return cls(
            id=record.id,
            run_id=record.run_id,
            step=record.step,
            title=record.title,
            description=record.description,
            options=tuple(_stored_option(o) for o in json.loads(record.options)),
            operation=json.loads(record.operation),
            operation_digest=record.operation_digest,
            reviewers=tuple(json.loads(record.reviewers)),
            context=json.loads(record.context),
            expires_at=to_datetime(record.expires_at),
            status=status,
            created_at=to_datetime(record.created_at),
            required=record.required,
            separate_duties=record.separate_duties,
            starter=record.starter,
            response_schema=json.loads(record.response_schema) if record.response_schema else None,
            approvers=tuple(v["reviewer"] for v in json.loads(record.votes)),
            decision=None
            if decision_data is None
            else decision_from(record.id, record.status, decision_data, record.run_id, record.step),
            outcomes=tuple(json.loads(record.outcomes)),
        )

    def may_decide(self, reviewer: Reviewer | str) -> bool:
        """Whether this reviewer is one of those who may decide (not whether they may now)."""
        who = as_reviewer(reviewer)
        if self.separate_duties and (self.starter is None or who.name == self.starter):
            return False  # nobody is told apart from an unknown starter: rules.vote refuses
        return who.may_decide(self.reviewers)


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One entry of an approval's audit trail."""

    at: datetime
    event: str  # created, viewed, voted, decided, refused, expired, cancelled, outcome
    actor: str | None
    detail: dict[str, Any]
    seq: int = 0
    hash: str = ""

    @classmethod
    def of(cls, entry: AuditEntry) -> HistoryEntry:
        return cls(to_datetime(entry.at), entry.event, entry.actor, json.loads(entry.detail),
                   entry.seq, entry.hash)  # fmt: skip

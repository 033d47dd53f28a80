"""The JSON forms of runs, steps, approvals, decisions and audit entries that people and
programs see, shared by the CLI, the HTTP API and the inbox so every surface shows the same.

What reaches a person passes the redactor: step results and errors are shown redacted like
approval contexts. Pure functions of values; no I/O.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from tether.approvals.model import Approval, Decision, HistoryEntry, Option
from tether.clock import to_datetime
from tether.core.handle import ForkInfo, RunInfo
from tether.redact import redact, redact_text
from tether.store.port import Checkpoint
from tether.values import ValueInfo


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def takes_response(option: Option, approval: Approval) -> bool:
    return option.schema is not None or approval.response_schema is not None


def decision_json(decision: Decision) -> dict[str, Any]:
    return {
        "approval_id": decision.approval_id, "status": decision.status,
        "option": decision.option, "reviewer": decision.reviewer, "comment": decision.comment,
        "decided_at": iso(decision.decided_at), "response": redact(decision.response),
        "approvers": list(decision.approvers), "run_id": decision.run_id, "step": decision.step,
        "operation_digest": decision.operation_digest,
    }  # fmt: skip


def approval_json(a: Approval) -> dict[str, Any]:
    options = [{**o.to_json(), "takes_response": takes_response(o, a)} for o in a.options]
    return {
        "id": a.id, "title": a.title, "description": a.description, "status": a.status,
        "run_id": a.run_id, "step": a.step, "reviewers": list(a.reviewers),
        "required": a.required, "approvers": list(a.approvers),
        "separate_duties": a.separate_duties, "starter": a.starter,
        "created_at": iso(a.created_at), "expires_at": iso(a.expires_at),
        "operation": a.operation, "operation_digest": a.operation_digest, "context": a.context,
        "options": options, "response_schema": a.response_schema,
        "decision": None if a.decision is None else decision_json(a.decision),
        "outcomes": list(a.outcomes),
    }  # fmt: skip


def history_json(entry: HistoryEntry) -> dict[str, Any]:
    return {"seq": entry.seq, "at": iso(entry.at), "event": entry.event, "actor": entry.actor,
            "detail": redact(entry.detail), "hash": entry.hash}  # fmt: skip


def run_json(info: RunInfo) -> dict[str, Any]:
    error = info.error or {}
    message = error.get("message")
    return {
        "id": info.id, "workflow": info.workflow, "status": str(info.status),
        "attempt": info.attempt, "failures": info.failures, "owner": info.owner,
        "created_at": iso(info.created_at),
        "updated_at": iso(info.updated_at), "finished_at": iso(info.finished_at),
        "error_type": error.get("type"),
        "error_message": None if message is None else redact_text(str(message)),
        "forked_from": fork_json(info.fork),
        # Where a held run's replay first differed from its history (the message says how).
        "diverged_at": error.get("position") if str(info.status) == "held" else None,
    }  # fmt: skip


def held_reason(run_id: str) -> str:
    """What an operator can do about a held run, in one line."""
    return (f"its replay diverged from its history under the deployed code; deploy code that "
            f"replays it (roll the change back, or gate it with tether.patched), and a worker "
            f"takes it on again; `tether runs resume {run_id}` tries at once, `tether runs "
            f"cancel {run_id}` gives up on it")  # fmt: skip


def fork_json(fork: ForkInfo | None) -> dict[str, Any] | None:
    """A fork link: run `run_id` reuses run `source_run_id`'s checkpoints before `from_step`."""
    if fork is None:
        return None
    return {"run_id": fork.run_id, "source_run_id": fork.source_run_id,
            "from_step": fork.from_step, "created_at": iso(fork.created_at)}  # fmt: skip


def value_json(value: ValueInfo, plain: Any) -> dict[str, Any]:
    """A value a run set, given in its JSON form (`plain`), redacted like step results (the
    library returns values as they were set)."""
    return {"key": value.key, "value": redact(plain), "version": value.version,
            "set_at": iso(value.set_at)}  # fmt: skip


def checkpoint_json(cp: Checkpoint) -> dict[str, Any]:
    duration = None
    if cp.started_at is not None and cp.finished_at is not None:
        duration = round((cp.finished_at - cp.started_at) * 1000, 3)
    return {
        "seq": cp.seq, "position": cp.at, "name": cp.name, "kind": cp.kind,
        "status": str(cp.status), "attempts": cp.attempts, "duration_ms": duration,
        "arguments": stored(cp.args), "result": stored(cp.result),
        "error": stored_error(cp.error),
        # The times a timeline is drawn from: the attempt's start and end, and a retrying
        # step's next attempt (an at-most-once marker's timeout, a wait's deadline).
        "started_at": moment(cp.started_at), "finished_at": moment(cp.finished_at),
        "retry_at": moment(cp.retry_at),
    }  # fmt: skip


def moment(seconds: float | None) -> str | None:
    """A stored time (seconds since the epoch) in ISO 8601, UTC."""
    return None if seconds is None else iso(to_datetime(seconds))


def stored(text: str | None) -> Any:
    """A stored JSON value as people see it, redacted. Text that is not JSON (a row changed
    in the database: what leaves a run dead) is shown too, as {"undecodable": its start}."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return {"undecodable": redact_text(text[:200])}
    return redact(value)


def stored_error(text: str | None) -> dict[str, Any] | None:
    """A stored error {type, message, traceback} as people see it, redacted (see stored)."""
    value = stored(text)
    if value is None or (isinstance(value, dict) and "undecodable" not in value):
        return value
    shown = value["undecodable"] if isinstance(value, dict) else value
    return {"type": "undecodable", "message": str(shown)}

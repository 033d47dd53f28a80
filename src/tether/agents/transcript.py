"""An agent run's transcript, read back from its checkpoints: the conversation, each model call
(model, latency, tokens, cost), each tool call with the approval that guarded it, and totals.

Pure functions of what a run recorded: no I/O, no clock, no guessing. Tokens come only from the
usage a provider reported, cost only from a price table the caller gives. What it shows is
redacted and large values are folded; it never feeds replay and must not import the server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, ClassVar

from tether.agents.models import ToolCall, response_from_json
from tether.approvals.model import Approval
from tether.core.handle import RunInfo
from tether.core.slot import arguments
from tether.errors import ConfigurationError
from tether.redact import redact, redact_text
from tether.store.keys import approval_key
from tether.store.port import Checkpoint, CheckpointStatus

FOLD_AT = 2000  # characters of a value shown before it is folded

# A checkpoint's name is its base, then "@1.0" in a workflow task, then "#2" from the second
# call on (core/positions.py); the agent's model step's base is "<agent name>.model".
_NAME = re.compile(r"^(?P<base>.+?)(?:@\d+(?:\.\d+)*)?(?:#\d+)?$")
_MODEL_STEP = re.compile(r"^(?P<agent>.+)\.model$")


@dataclass(frozen=True, slots=True)
class Price:
    """What a model costs per million tokens, in the caller's currency."""

    input: float
    output: float


@dataclass(frozen=True, slots=True)
class MessageEntry:
    """A message of the conversation: the input (recorded as the first model call's arguments)
    and the assistant's text. `text` None: the input was not kept (arguments longer than
    tether.core.execution.ARGS_KEPT keep only their digest); its role is then "input"."""

    kind: ClassVar[str] = "message"
    role: str
    text: str | None
    folded: bool = False


@dataclass(frozen=True, slots=True)
class ModelCallEntry:
    """One model call (a step). `model` is the name the provider answered with; tokens are
    None where the provider reported no usage; cost None unless the price table has the model.
    Latency is that of the attempt that answered."""

    kind: ClassVar[str] = "model_call"
    step: str
    agent: str
    status: str
    model: str | None
    tokens_in: int | None
    tokens_out: int | None
    cost: float | None
    latency_ms: float | None
    attempts: int
    at: datetime | None
    error: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ApprovalEntry:
    """The approval asked before a tool call, just before that call's entry."""

    kind: ClassVar[str] = "approval"
    id: str
    step: str
    tool: str
    title: str | None  # None: the approval itself was not given (only its checkpoints)
    status: str  # pending, approved, rejected, expired, cancelled, or another option's id
    option: str | None
    reviewer: str | None
    approvers: tuple[str, ...]
    comment: str | None
    decided_at: datetime | None


@dataclass(frozen=True, slots=True)
class ToolCallEntry:
    """A tool call the model asked for. `status`: completed, failed, retrying, running (a step
    recorded), waiting (for its approval), refused (not approved), pending (not reached yet),
    or not_run (the run went on without it: an unknown tool or arguments that did not match
    its schema, told to the model as an error)."""

    kind: ClassVar[str] = "tool_call"
    tool: str
    call_id: str | None
    step: str | None  # its checkpoint's name, when it ran
    status: str
    arguments: Any
    result: Any = None
    error: dict[str, Any] | None = None
    latency_ms: float | None = None
    attempts: int = 0
    at: datetime | None = None
    folded: tuple[str, ...] = ()  # the fields cut at fold_at characters


Entry = MessageEntry | ModelCallEntry | ApprovalEntry | ToolCallEntry


@dataclass(frozen=True, slots=True)
class Totals:
    """Sums over the run. Tokens and cost add up the calls that report them (None: none did);
    `unmetered` model calls reported no usage, `unpriced` ones have no cost."""

    model_calls: int = 0
    tool_calls: int = 0
    approvals: int = 0
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost: float | None = None
    unmetered: int = 0
    unpriced: int = 0
    wall_ms: float | None = None  # from the run's creation to its end; None while it goes on


@dataclass(frozen=True, slots=True)
class Transcript:
    """A run's transcript. A run that made no agent model call (not an agent run, or one that
    has not called its model yet) has no entries and zero totals."""

    run_id: str
    workflow: str
    status: str
    entries: tuple[Entry, ...] = ()
    totals: Totals = field(default_factory=Totals)


def transcript_of(
    run_info: RunInfo,
    checkpoints: Sequence[Checkpoint],
    approvals: Sequence[Approval] = (),
    *,
    prices: Mapping[str, Price] | None = None,
    fold_at: int = FOLD_AT,
) -> Transcript:
    """The transcript of a run from its checkpoints (`handle.checkpoints()`) and its approvals
    (`app.list_approvals(None, run_id=...)`). `prices` is keyed by the model name the provider
    answered with, exactly as the entries show it: a model not in it has no cost."""
    for name, price in (prices or {}).items():
        if not isinstance(price, Price) or min(price.input, price.output) < 0:
            raise ConfigurationError(f"prices[{name!r}] is a Price(input=, output=) >= 0")
    if not isinstance(fold_at, int) or fold_at < 1:
        raise ConfigurationError(f"fold_at is an int >= 1, not {fold_at!r}")
    reader = _Reader(run_info, approvals, dict(prices or {}), fold_at)
    for cp in sorted(checkpoints, key=_position):
        reader.read(cp)
    entries = tuple(e for turn in reader.turns for e in reader.finish(turn))
    return Transcript(run_info.id, run_info.workflow, str(run_info.status), entries,
                      _totals(run_info, entries))  # fmt: skip


def transcript_json(t: Transcript) -> dict[str, Any]:
    """The transcript as JSON for the API: each entry with its `kind`, times in ISO 8601."""
    return {"run_id": t.run_id, "workflow": t.workflow, "status": t.status,
            "entries": [{"kind": e.kind, **_fields_json(e)} for e in t.entries],
            "totals": _fields_json(t.totals)}  # fmt: skip


# --- reading the checkpoints ----------------------------------------------------------------


@dataclass
class _Call:
    """A tool call of a turn, and the checkpoints found for it."""

    call: ToolCall
    approval: Checkpoint | None = None
    step: Checkpoint | None = None


@dataclass
class _Turn:
    head: list[Entry]  # its input messages, the model call, the assistant's text
    calls: list[_Call]


class _Reader:
    def __init__(self, info: RunInfo, approvals: Sequence[Approval], prices: dict[str, Price],
                 fold_at: int) -> None:  # fmt: skip
        self.info = info
        self.approvals = {a.id: a for a in approvals}
        self.prices = prices
        self.fold_at = fold_at
        self.turns: list[_Turn] = []
        self.open: dict[str, _Turn] = {}  # by workflow task: the turn whose tools run there
        self.agents: set[tuple[str, str]] = set()  # (task, agent) that called its model
        self.decisions: dict[str, dict[str, Any]] = {}  # approval id -> what its wait got

    def read(self, cp: Checkpoint) -> None:
        task, _, _ = cp.at.rpartition("/")
        base = _base(cp.name)
        agent = _MODEL_STEP.match(base)
        if cp.kind == "step" and agent is not None and (turn := self._model(cp, task, agent[1])):
            self.turns.append(turn)
            self.open[task] = turn
            return
        turn = self.open.get(task)
        if cp.kind == "approval-wait":
            value = _decoded(cp.result)
            if isinstance(value, dict) and isinstance(value.get("value"), dict):
                self.decisions[str(value.get("key"))] = value["value"]
        elif turn is not None and cp.kind == "approval":
            _guarded(turn, cp, self.approvals.get(_approval_id(cp)))
        elif turn is not None and cp.kind == "step":
            _ran(turn, cp, base)

    def _model(self, cp: Checkpoint, task: str, agent: str) -> _Turn | None:
        value = _decoded(cp.result)
        if cp.result is not None and not (isinstance(value, dict) and "tool_calls" in value):
            return None  # a step of that name that is not an agent's model call
        response = response_from_json(value) if isinstance(value, dict) else None
        usage = response.usage if response is not None else {}
        model = response.model if response is not None else None
        tokens_in = _count(usage.get("input_tokens"))
        tokens_out = _count(usage.get("output_tokens"))
        price = self.prices.get(model) if model is not None else None
        cost = None
        if price is not None and tokens_in is not None and tokens_out is not None:
            cost = (tokens_in * price.input + tokens_out * price.output) / 1_000_000
        head: list[Entry] = list(self._input(cp, (task, agent)))
        head.append(ModelCallEntry(
            cp.name, agent, str(cp.status), model, tokens_in, tokens_out, cost, _latency(cp),
            cp.attempts, _when(cp.started_at), self._error(cp.error),
        ))  # fmt: skip
        if response is not None and response.text:
            text, folded = _fold(redact_text(response.text), self.fold_at)
            head.append(MessageEntry("assistant", text, folded))
        return _Turn(head, [_Call(c) for c in (response.tool_calls if response else [])])

    def _input(self, cp: Checkpoint, who: tuple[str, str]) -> list[MessageEntry]:
        """The messages a model call is the first to show: all of its agent's first call's,
        then only new input after the last assistant turn (tool results are the tools')."""
        first = who not in self.agents
        self.agents.add(who)
        value = _decoded(cp.args)
        given = value.get("args") if isinstance(value, dict) else None
        if not (isinstance(given, list) and given and isinstance(given[0], list)):
            return [MessageEntry("input", None)] if first else []
        messages = [m for m in given[0] if isinstance(m, dict)]
        if not first:
            last = max((n for n, m in enumerate(messages) if m.get("role") == "assistant"),
                       default=-1)  # fmt: skip
            messages = [m for m in messages[last + 1 :] if m.get("role") != "tool"]
        shown = []
        for m in messages:
            content = m.get("content")
            text = content if isinstance(content, str) else json.dumps(redact(content))
            text, folded = _fold(redact_text(text), self.fold_at)
            shown.append(MessageEntry(str(m.get("role")), text, folded))
        return shown

    def finish(self, turn: _Turn) -> list[Entry]:
        entries = list(turn.head)
        for c in turn.calls:
            approval = None
            if c.approval is not None:
                approval = self._approval(c.approval, c.call.name)
                entries.append(approval)
            entries.append(self._tool(c, approval))
        return entries

    def _approval(self, cp: Checkpoint, tool: str) -> ApprovalEntry:
        aid = _approval_id(cp)
        found = self.approvals.get(aid)
        if found is not None:
            d = found.decision
            if d is None:
                return ApprovalEntry(aid, cp.name, tool, redact_text(found.title), found.status,
                                     None, None, found.approvers, None, None)  # fmt: skip
            return ApprovalEntry(
                aid, cp.name, tool, redact_text(found.title), found.status, d.option, d.reviewer,
                found.approvers, None if d.comment is None else redact_text(d.comment),
                d.decided_at,
            )  # fmt: skip
        told = self.decisions.get(approval_key(aid), {})
        at = told.get("at")
        comment = told.get("comment")
        return ApprovalEntry(
            aid, cp.name, tool, None, str(told.get("status") or "pending"), told.get("option"),
            told.get("reviewer"), tuple(told.get("approvers") or ()),
            redact_text(comment) if isinstance(comment, str) else None,
            _when(at) if isinstance(at, int | float) else None,
        )  # fmt: skip

    def _tool(self, c: _Call, approval: ApprovalEntry | None) -> ToolCallEntry:
        args, args_folded = self._shown(c.call.arguments)
        folded: tuple[str, ...] = ("arguments",) if args_folded else ()
        cp = c.step
        if cp is None:
            if approval is not None and approval.status == "pending":
                status = "waiting"
            elif approval is not None and approval.status != "approved":
                status = "refused"
            else:
                status = "not_run" if self.info.status.terminal else "pending"
            return ToolCallEntry(c.call.name, c.call.id, None, status, args, folded=folded)
        result, result_folded = self._shown(_decoded(cp.result)) if cp.result else (None, False)
        if result_folded:
            folded += ("result",)
        status = {CheckpointStatus.STARTED: "running"}.get(cp.status, str(cp.status))
        return ToolCallEntry(c.call.name, c.call.id, cp.name, status, args, result,
                             self._error(cp.error), _latency(cp), cp.attempts,
                             _when(cp.started_at), folded)  # fmt: skip

    def _shown(self, value: Any) -> tuple[Any, bool]:
        """A value as people see it: redacted, then folded (so no secret is cut in two and
        left unrecognised)."""
        return _fold(redact(value), self.fold_at)

    def _error(self, text: str | None) -> dict[str, Any] | None:
        value = _decoded(text)
        if value is None:
            return None
        if not isinstance(value, dict):
            value = {"type": "undecodable", "message": str(value)}
        message, _ = _fold(redact_text(str(value.get("message") or "")), self.fold_at)
        return {"type": str(value.get("type") or "Error"), "message": message}


def _guarded(turn: _Turn, cp: Checkpoint, approval: Approval | None) -> None:
    """Pin an approval to the call it was asked for: the loop asks them in the order of the
    calls, so the next call of its tool without one; of those, the first whose arguments agree
    with the (masked) operation, when the approval is known."""
    asked = [n for n, c in enumerate(turn.calls) if c.approval is not None]
    after = asked[-1] + 1 if asked else 0
    operation = approval.operation if approval is not None else None
    tool = operation.get("tool") if isinstance(operation, dict) else None
    candidates = [c for c in turn.calls[after:] if c.approval is None and c.step is None
                  and (tool is None or c.call.name == tool)]  # fmt: skip
    if isinstance(operation, dict):
        agreeing = [c for c in candidates if _agrees(operation.get("arguments"), c.call.arguments)]
        candidates = agreeing or candidates
    if candidates:
        candidates[0].approval = cp


def _ran(turn: _Turn, cp: Checkpoint, base: str) -> None:
    """Pin a tool's step to its call: the same tool, the recorded arguments the same (tool
    steps take their checkpoints in the order of the calls)."""
    for c in turn.calls:
        if (
            c.step is None
            and c.call.name == base
            and (cp.args is None or cp.args == arguments((), c.call.arguments))
        ):
            c.step = cp
            return


def _agrees(shown: Any, raw: Any) -> bool:
    """Whether arguments as a reviewer saw them (secrets masked) can be these raw ones."""
    if shown == raw:
        return True
    if isinstance(shown, dict) and isinstance(raw, dict):
        return shown.keys() == raw.keys() and all(_agrees(shown[k], raw[k]) for k in shown)
    if isinstance(shown, list) and isinstance(raw, list):
        return len(shown) == len(raw) and all(map(_agrees, shown, raw))
    return isinstance(shown, str) and ("[hidden secret" in shown or "[WARNING" in shown)


def _totals(info: RunInfo, entries: Sequence[Entry]) -> Totals:
    calls = [e for e in entries if isinstance(e, ModelCallEntry)]
    ins = [e.tokens_in for e in calls if e.tokens_in is not None]
    outs = [e.tokens_out for e in calls if e.tokens_out is not None]
    costs = [e.cost for e in calls if e.cost is not None]
    wall = None
    if info.finished_at is not None:
        wall = round((info.finished_at - info.created_at).total_seconds() * 1000, 3)
    return Totals(
        model_calls=len(calls),
        tool_calls=sum(isinstance(e, ToolCallEntry) for e in entries),
        approvals=sum(isinstance(e, ApprovalEntry) for e in entries),
        tokens_in=sum(ins) if ins else None, tokens_out=sum(outs) if outs else None,
        cost=sum(costs) if costs else None,
        unmetered=sum(e.tokens_in is None and e.tokens_out is None for e in calls),
        unpriced=len(calls) - len(costs), wall_ms=wall,
    )  # fmt: skip


# --- small readers ----------------------------------------------------------------------------


def _position(cp: Checkpoint) -> tuple[int, ...]:
    """A position as numbers: a task's checkpoints in their order, each task after the
    checkpoints taken before it was created."""
    try:
        return tuple(int(p) for p in cp.at.split("/"))
    except ValueError:
        return (cp.seq,)


def _base(name: str) -> str:
    found = _NAME.match(name)
    return found["base"] if found else name


def _approval_id(cp: Checkpoint) -> str:
    value = _decoded(cp.result)
    return str(value.get("id")) if isinstance(value, dict) else ""


def _decoded(text: str | None) -> Any:
    """A stored JSON value; text that is not JSON (a row changed by hand) as its redacted
    start, as tether.views shows it."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return {"undecodable": redact_text(text[:200])}


def _fold(value: Any, limit: int) -> tuple[Any, bool]:
    """A value cut to `limit` characters (a string itself, anything else as its JSON text),
    and whether it was."""
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    if len(text) <= limit:
        return value, False
    return text[:limit] + "…", True


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _latency(cp: Checkpoint) -> float | None:
    if cp.started_at is None or cp.finished_at is None:
        return None
    return round((cp.finished_at - cp.started_at) * 1000, 3)


def _when(moment: float | None) -> datetime | None:
    return None if moment is None else datetime.fromtimestamp(moment, UTC)


def _fields_json(record: Any) -> dict[str, Any]:
    return {f.name: _plain(getattr(record, f.name)) for f in fields(record)}


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return list(value) if isinstance(value, tuple) else value


__all__ = [
    "FOLD_AT",
    "ApprovalEntry",
    "Entry",
    "MessageEntry",
    "ModelCallEntry",
    "Price",
    "ToolCallEntry",
    "Totals",
    "Transcript",
    "transcript_json",
    "transcript_of",
]

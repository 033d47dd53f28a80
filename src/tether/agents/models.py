"""What the agent loop needs from a language model, and the scripted model for tests and demos.

Messages are plain dicts in the chat-completions shape ({"role", "content", "tool_calls",
"tool_call_id"}); adapters translate them for their provider. A model call runs inside a
checkpointed step: a model never sees a replay. This module makes no network calls.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tether.errors import ConfigurationError, TetherError

Emit = Callable[[str], Awaitable[None]]  # receives the model's output text as it is produced


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool the model asks to run: its name and arguments (and the provider's call id)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as a model is told of it."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ModelRequest:
    instructions: str
    messages: list[dict[str, Any]]
    tools: list[ToolSpec]


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """A model's turn. `usage` ({"input_tokens", "output_tokens"}) and `model` (the model name
    the provider answered with) are what the provider reported: empty or None when it did not."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    model: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"text": self.text, "tool_calls": [c.to_json() for c in
                                self.tool_calls], "usage": self.usage}  # fmt: skip
        if self.model is not None:  # absent rather than null: a scripted turn records as before
            data["model"] = self.model
        return data


@runtime_checkable
class Model(Protocol):
    """A chat model. `complete` streams its text through `emit` and returns the whole turn."""

    name: str

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelResponse: ...


class ModelError(TetherError):
    """The model's provider failed; transient failures are retried by the step's policy."""


class RateLimited(ModelError):
    """The provider asked to slow down; the next attempt waits at least `retry_after` seconds."""

    def __init__(self, message: str | None = None, *, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message)


Turn = str | Sequence[ToolCall]


class Scripted:
    """A model that plays a script, for tests and offline demos: turn n answers the n-th model
    call of a conversation (counted by the assistant messages so far), a `str` being a final
    answer and a list of ToolCall a request to run tools. Its text streams word by word."""

    name = "scripted"

    def __init__(self, turns: Sequence[Turn]) -> None:
        if isinstance(turns, str) or not turns:
            raise ConfigurationError("Scripted takes a non-empty list of turns")
        for turn in turns:
            if not isinstance(turn, str) and not all(isinstance(c, ToolCall) for c in turn):
                raise ConfigurationError(
                    f"a scripted turn is a str or a list of tether.models.ToolCall, not {turn!r}"
                )
        self.turns = list(turns)

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelResponse:
        index = sum(1 for m in request.messages if m.get("role") == "assistant")
        if index >= len(self.turns):
            raise ModelError(f"the script has {len(self.turns)} turns; call {index + 1} has none")
        turn = self.turns[index]
        if isinstance(turn, str):
            words = turn.split(" ")
            for n, word in enumerate(words):
                await emit(word if n == len(words) - 1 else word + " ")
            return ModelResponse(text=turn)
        calls = [ToolCall(c.name, dict(c.arguments), c.id or f"call_{index}_{n}")
                 for n, c in enumerate(turn)]  # fmt: skip
        return ModelResponse(tool_calls=calls)


def response_from_json(data: dict[str, Any]) -> ModelResponse:
    """A recorded turn; any shape recorded before (no `usage`, no `model`) reads too."""
    calls = [ToolCall(c["name"], dict(c.get("arguments") or {}), c.get("id"))
             for c in data.get("tool_calls") or []]  # fmt: skip
    model = data.get("model")
    return ModelResponse(str(data.get("text") or ""), calls, dict(data.get("usage") or {}),
                         model if isinstance(model, str) else None)  # fmt: skip


def assistant_message(response: ModelResponse) -> dict[str, Any]:
    """The assistant's turn as it joins the conversation."""
    message: dict[str, Any] = {"role": "assistant", "content": response.text}
    if response.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, sort_keys=True)}}
            for c in response.tool_calls
        ]  # fmt: skip
    return message


def tool_message(call: ToolCall, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}

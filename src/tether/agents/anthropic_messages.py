"""`AnthropicMessages`: a model for `tether.Agent` over Anthropic's Messages API, through the
official `anthropic` SDK (the `tether[anthropic]` extra).

The agent's conversation is in the chat-completions shape; this module translates it: the
instructions and any system messages become `system=`, an assistant's tool calls become
`tool_use` blocks, and the tool results that follow them become `tool_result` blocks of one
user message. The call streams: text deltas go to `emit` as they arrive, tool calls are put
together from their `input_json` deltas. The SDK's own retries are off (the model step's
retries are durable); its errors become Tether's as `tether.agents.providers` sorts them.
Imported only when used: `import tether` does not import `anthropic`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

try:
    import anthropic
    from anthropic.types import (
        AssistantMessageParam,
        ContentBlockParam,
        InputJSONDelta,
        MessageParam,
        RawContentBlockDeltaEvent,
        RawContentBlockStartEvent,
        RawMessageDeltaEvent,
        RawMessageStartEvent,
        RawMessageStreamEvent,
        TextBlockParam,
        TextDelta,
        ToolParam,
        ToolResultBlockParam,
        ToolUnionParam,
        ToolUseBlock,
        ToolUseBlockParam,
        UserMessageParam,
    )
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "tether.models.AnthropicMessages needs the anthropic SDK: "
        f"pip install 'tether[anthropic]' ({exc})"
    ) from exc

from tether.agents.models import Emit, ModelError, ModelRequest, ModelResponse, ToolCall
from tether.agents.providers import (
    ModelRefused,
    Provider,
    status_error,
    tool_arguments,
    unreachable,
)
from tether.errors import ConfigurationError


class AnthropicMessages:
    """A Claude model behind Anthropic's Messages API.

    `base_url` and `api_key` default to the SDK's own: $ANTHROPIC_BASE_URL (else Anthropic's
    API) and $ANTHROPIC_API_KEY. A `client` given is used with its retries turned off."""

    def __init__(
        self,
        model: str,
        *,
        client: anthropic.AsyncAnthropic | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 1024,
        temperature: float | None = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ConfigurationError(f"AnthropicMessages takes a model name, not {model!r}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ConfigurationError(f"max_tokens is an int >= 1, not {max_tokens!r}")
        self.model = model
        self.name = f"anthropic:{model}"
        self.base_url = base_url
        self.api_key = api_key
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._client = client.with_options(max_retries=0) if client is not None else None

    @property
    def client(self) -> anthropic.AsyncAnthropic:
        """The SDK client, made at first use (so a missing key fails the call, not the import)."""
        if self._client is None:
            try:
                client = anthropic.AsyncAnthropic(
                    base_url=self.base_url, api_key=self.api_key, max_retries=0
                )
            except anthropic.AnthropicError as exc:
                raise self._no_credentials(f" ({exc})") from exc
            if not (client.api_key or client.auth_token or client.credentials):
                raise self._no_credentials("")
            self._client = client
        return self._client

    def _no_credentials(self, why: str) -> ModelRefused:
        return ModelRefused(
            f"AnthropicMessages({self.model!r}) has no credentials{why}: "
            f"set ANTHROPIC_API_KEY or pass api_key="
        )

    async def aclose(self) -> None:
        """Close the SDK client's connections (a new client is made if the model is used again)."""
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelResponse:
        client = self.client
        provider = Provider("AnthropicMessages", self.model, str(client.base_url),
                            "ANTHROPIC_API_KEY")  # fmt: skip
        system, messages = translate(request.instructions, request.messages)
        tools: list[ToolUnionParam] = [
            ToolParam(name=t.name, description=t.description, input_schema=t.parameters)
            for t in request.tools
        ]
        turn = _Turn()
        try:
            stream = await client.messages.create(
                model=self.model,
                max_tokens=self.max_tokens,
                messages=messages,
                system=system or anthropic.omit,
                tools=tools or anthropic.omit,
                stream=True,
                # this SDK has no temperature parameter: sent as a body field when asked for
                extra_body=None if self.temperature is None else {"temperature": self.temperature},
            )
            async with stream:
                async for event in stream:
                    await turn.add(event, emit)
        except anthropic.APIStatusError as exc:
            if exc.type == "rate_limit_error" and exc.status_code < 400:  # told mid-stream
                raise status_error(provider, 429, exc.response.headers, exc.message) from exc
            raise status_error(
                provider, exc.status_code, exc.response.headers, exc.message
            ) from exc
        except anthropic.APIConnectionError as exc:  # timeouts included
            raise unreachable(provider, exc) from exc
        except anthropic.APIError as exc:
            raise ModelError(f"{provider} failed mid-answer: {exc}; the call is retried") from exc
        return turn.response()


def translate(instructions: str, history: list[dict[str, Any]]) -> tuple[str, list[MessageParam]]:
    """The `system` text and the messages for the Messages API, from a chat-completions-shaped
    conversation."""
    system = [instructions] if instructions else []
    messages: list[MessageParam] = []
    results: list[ContentBlockParam] = []  # tool results waiting for their user message
    for message in history:
        role, content = message.get("role"), message.get("content")
        if role == "tool":
            results.append(ToolResultBlockParam(
                type="tool_result", tool_use_id=str(message.get("tool_call_id") or ""),
                content=content if isinstance(content, str) else json.dumps(content),
            ))  # fmt: skip
            continue
        if results:
            messages.append(UserMessageParam(role="user", content=results))
            results = []
        if role == "system":
            system.append(str(content or ""))
        elif role == "user":
            messages.append(UserMessageParam(role="user", content=content or ""))
        elif role == "assistant":
            blocks: list[ContentBlockParam] = []
            if isinstance(content, str) and content:
                blocks.append(TextBlockParam(type="text", text=content))
            elif isinstance(content, list):
                blocks += content
            blocks += [_tool_use(c) for c in message.get("tool_calls") or []]
            if blocks:  # the API refuses an empty assistant turn
                messages.append(AssistantMessageParam(role="assistant", content=blocks))
        else:
            raise ConfigurationError(
                f"a message's role is 'system', 'user', 'assistant' or 'tool', not {role!r}"
            )
    if results:
        messages.append(UserMessageParam(role="user", content=results))
    return "\n\n".join(s for s in system if s), messages


def _tool_use(call: dict[str, Any]) -> ToolUseBlockParam:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        arguments = json.loads(arguments) if arguments.strip() else {}
    return ToolUseBlockParam(
        type="tool_use",
        id=str(call.get("id") or ""),
        name=str(function.get("name") or ""),
        input=dict(arguments or {}),
    )


@dataclass
class _PendingCall:
    id: str
    name: str
    input: dict[str, Any]  # as the block started; the streamed JSON replaces it when there is any
    json: list[str] = field(default_factory=list)


@dataclass
class _Turn:
    """A streamed answer as its events arrive."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, _PendingCall] = field(default_factory=dict)  # by content block index
    usage: dict[str, int] = field(default_factory=dict)
    model: str | None = None  # as the provider answered
    stop_reason: str | None = None

    async def add(self, event: RawMessageStreamEvent, emit: Emit) -> None:
        if isinstance(event, RawMessageStartEvent):
            self.model = event.message.model or None
            self.usage = {"input_tokens": event.message.usage.input_tokens,
                          "output_tokens": event.message.usage.output_tokens}  # fmt: skip
        elif isinstance(event, RawContentBlockStartEvent):
            block = event.content_block
            if isinstance(block, ToolUseBlock):
                self.calls[event.index] = _PendingCall(block.id, block.name, dict(block.input))
        elif isinstance(event, RawContentBlockDeltaEvent):
            delta = event.delta
            if isinstance(delta, TextDelta) and delta.text:
                self.text.append(delta.text)
                await emit(delta.text)
            elif isinstance(delta, InputJSONDelta) and event.index in self.calls:
                self.calls[event.index].json.append(delta.partial_json)
        elif isinstance(event, RawMessageDeltaEvent):
            self.stop_reason = event.delta.stop_reason or self.stop_reason
            self.usage["output_tokens"] = event.usage.output_tokens
            if event.usage.input_tokens is not None:
                self.usage["input_tokens"] = event.usage.input_tokens

    def response(self) -> ModelResponse:
        truncated = self.stop_reason == "max_tokens"
        calls = []
        for _, call in sorted(self.calls.items()):
            streamed = "".join(call.json)
            arguments = (tool_arguments(call.name, streamed, truncated=truncated)
                         if streamed.strip() else call.input)  # fmt: skip
            calls.append(ToolCall(call.name, arguments, call.id))
        return ModelResponse("".join(self.text), calls, self.usage, self.model)


__all__ = ["AnthropicMessages", "translate"]

"""`OpenAIChat`: a model for `tether.Agent` over any OpenAI-compatible chat completions API
(OpenAI, Azure-style gateways, vLLM, Ollama, LiteLLM...), through the official `openai` SDK
(the `tether[openai]` extra).

The call streams: text deltas go to `emit` as they arrive, tool calls are put together from
their deltas. The SDK's own retries are off (the model step's retries are durable); its
errors become Tether's as `tether.agents.providers` sorts them. Imported only when used:
`import tether` does not import `openai`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

try:
    import openai
    from openai.types.chat import (
        ChatCompletionAssistantMessageParam,
        ChatCompletionFunctionToolParam,
        ChatCompletionMessageFunctionToolCallParam,
        ChatCompletionMessageParam,
        ChatCompletionSystemMessageParam,
        ChatCompletionToolMessageParam,
        ChatCompletionToolUnionParam,
        ChatCompletionUserMessageParam,
    )
    from openai.types.chat.chat_completion_chunk import Choice
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        f"tether.models.OpenAIChat needs the openai SDK: pip install 'tether[openai]' ({exc})"
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


class OpenAIChat:
    """A chat model behind an OpenAI-compatible `/chat/completions` API.

    `base_url` and `api_key` default to the SDK's own: $OPENAI_BASE_URL (else OpenAI's API)
    and $OPENAI_API_KEY. `extra` is added to every request body (provider-specific options).
    A `client` given is used with its retries turned off."""

    def __init__(
        self,
        model: str,
        *,
        client: openai.AsyncOpenAI | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ConfigurationError(f"OpenAIChat takes a model name, not {model!r}")
        self.model = model
        self.name = f"openai:{model}"
        self.base_url = base_url
        self.api_key = api_key
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra = dict(extra or {})
        self._client = client.with_options(max_retries=0) if client is not None else None

    @property
    def client(self) -> openai.AsyncOpenAI:
        """The SDK client, made at first use (so a missing key fails the call, not the import)."""
        if self._client is None:
            try:
                self._client = openai.AsyncOpenAI(
                    base_url=self.base_url, api_key=self.api_key, max_retries=0
                )
            except openai.OpenAIError as exc:
                raise ModelRefused(
                    f"OpenAIChat({self.model!r}) cannot make its client: {exc}; "
                    f"set OPENAI_API_KEY or pass api_key="
                ) from exc
        return self._client

    async def aclose(self) -> None:
        """Close the SDK client's connections (a new client is made if the model is used again)."""
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelResponse:
        client = self.client
        provider = Provider("OpenAIChat", self.model, str(client.base_url), "OPENAI_API_KEY")
        messages: list[ChatCompletionMessageParam] = []
        if request.instructions:
            messages.append(
                ChatCompletionSystemMessageParam(role="system", content=request.instructions)
            )
        messages += [_message(m) for m in request.messages]
        tools: list[ChatCompletionToolUnionParam] = [
            ChatCompletionFunctionToolParam(
                type="function",
                function={"name": t.name, "description": t.description, "parameters": t.parameters},
            )
            for t in request.tools
        ]
        turn = _Turn()
        try:
            stream = await client.chat.completions.create(
                model=self.model,
                messages=messages,
                tools=tools or openai.omit,
                stream=True,
                stream_options={"include_usage": True},
                temperature=openai.omit if self.temperature is None else self.temperature,
                max_tokens=openai.omit if self.max_tokens is None else self.max_tokens,
                extra_body=self.extra or None,
            )
            async with stream:
                async for chunk in stream:
                    turn.model = chunk.model or turn.model
                    if chunk.usage is not None:
                        turn.usage = {"input_tokens": chunk.usage.prompt_tokens,
                                      "output_tokens": chunk.usage.completion_tokens}  # fmt: skip
                    for choice in chunk.choices:
                        if choice.index == 0:
                            await turn.add(choice, emit)
        except openai.APIStatusError as exc:
            raise status_error(
                provider, exc.status_code, exc.response.headers, exc.message
            ) from exc
        except openai.APIConnectionError as exc:  # timeouts included
            raise unreachable(provider, exc) from exc
        except openai.APIError as exc:  # an error event in the middle of the stream
            raise ModelError(f"{provider} failed mid-answer: {exc}; the call is retried") from exc
        return turn.response()


@dataclass
class _PendingCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _Turn:
    """A streamed answer as its deltas arrive."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, _PendingCall] = field(default_factory=dict)  # by the delta's index
    usage: dict[str, int] = field(default_factory=dict)
    model: str | None = None  # as the provider answered (a dated name, often)
    finish_reason: str | None = None

    async def add(self, choice: Choice, emit: Emit) -> None:
        delta = choice.delta
        for piece in (delta.content, delta.refusal):
            if piece:
                self.text.append(piece)
                await emit(piece)
        for part in delta.tool_calls or []:
            call = self.calls.setdefault(part.index, _PendingCall())
            call.id = call.id or (part.id or "")
            if part.function is not None:
                call.name += part.function.name or ""
                call.arguments.append(part.function.arguments or "")
        self.finish_reason = choice.finish_reason or self.finish_reason

    def response(self) -> ModelResponse:
        truncated = self.finish_reason == "length"
        calls = [
            ToolCall(c.name, tool_arguments(c.name, "".join(c.arguments), truncated=truncated),
                     c.id or f"call_{index}")
            for index, c in sorted(self.calls.items())
        ]  # fmt: skip
        return ModelResponse("".join(self.text), calls, self.usage, self.model)


def _message(message: dict[str, Any]) -> ChatCompletionMessageParam:
    """A message of the agent's conversation as the chat completions API takes it."""
    role, content = message.get("role"), message.get("content")
    if role == "user":
        return ChatCompletionUserMessageParam(role="user", content=content or "")
    if role == "system":
        return ChatCompletionSystemMessageParam(role="system", content=content or "")
    if role == "tool":
        return ChatCompletionToolMessageParam(
            role="tool", tool_call_id=str(message.get("tool_call_id") or ""), content=content or ""
        )
    if role == "assistant":
        reply = ChatCompletionAssistantMessageParam(role="assistant")
        calls = message.get("tool_calls") or []
        if content or not calls:
            reply["content"] = content or ""
        if calls:
            reply["tool_calls"] = [_call(c) for c in calls]
        return reply
    raise ConfigurationError(
        f"a message's role is 'system', 'user', 'assistant' or 'tool', not {role!r}: {message!r}"
    )


def _call(call: dict[str, Any]) -> ChatCompletionMessageFunctionToolCallParam:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments or {}, sort_keys=True)
    return ChatCompletionMessageFunctionToolCallParam(
        id=str(call.get("id") or ""),
        type="function",
        function={"name": str(function.get("name") or ""), "arguments": arguments},
    )


__all__ = ["OpenAIChat"]

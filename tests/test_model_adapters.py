"""The model adapters with the real `openai` and `anthropic` SDKs against a local fake provider
(an HTTP server on 127.0.0.1 that plays scripted SSE answers and records each request): text
streams through emit, tool calls are put together from their deltas, the history and tools are
sent in each provider's shape, usage and the model that answered are reported, and HTTP
failures become RateLimited (with the Retry-After asked for), ModelError (retried) or
ModelRefused (a PermanentError); then an agent in a workflow calls a tool and answers through
OpenAIChat, its checkpoints keeping the usage."""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import tether
from tether.agents.providers import retry_after
from tether.models import (
    AnthropicMessages,
    ModelError,
    ModelRefused,
    ModelRequest,
    OpenAIChat,
    RateLimited,
    ToolSpec,
)

pytestmark = pytest.mark.timeout(20)


# --- the fake provider -------------------------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    events: list[str] = field(default_factory=list)  # SSE events, sent one by one
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None  # the JSON body of an error answer


@dataclass
class Request:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


class FakeProvider:
    """Answers each POST with the next scripted reply and records what it was sent."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Request] = []
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                provider.requests.append(
                    Request(self.path, body, {k.lower(): v for k, v in self.headers.items()})
                )
                reply = provider.replies.popleft() if provider.replies else Reply(599)
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                if reply.status >= 400:
                    data = json.dumps(reply.body or {"error": {"message": "scripted"}}).encode()
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for event in reply.events:
                    self.wfile.write(event.encode())
                    self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProvider]:
    fake = FakeProvider()
    thread = threading.Thread(target=fake.server.serve_forever, daemon=True)
    thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def provider(server: FakeProvider) -> FakeProvider:
    server.replies.clear()
    server.requests.clear()
    return server


Closer = Callable[[Any], Any]


@pytest.fixture
async def closing() -> AsyncIterator[Closer]:
    """Models made in a test, closed after it."""
    models: list[Any] = []
    yield lambda model: models.append(model) or model
    for model in models:
        await model.aclose()


def openai_model(provider: FakeProvider, closing: Closer, **options: Any) -> OpenAIChat:
    model = OpenAIChat("gpt-test", base_url=f"{provider.url}/v1", api_key="sk-test", **options)
    closing(model)
    return model


def anthropic_model(provider: FakeProvider, closing: Closer, **options: Any) -> AnthropicMessages:
    model = AnthropicMessages("claude-test", base_url=provider.url, api_key="sk-ant", **options)
    closing(model)
    return model


class Emitted(list[str]):
    async def __call__(self, text: str) -> None:
        self.append(text)


# --- scripts in each provider's SSE shape ------------------------------------------------------


# Providers answer with the model's full (dated) name, not the alias asked for.
ANSWERED_GPT, ANSWERED_CLAUDE = "gpt-test-2025-04-14", "claude-test-20250514"


def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> str:
    data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
            "model": ANSWERED_GPT, "usage": usage,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return f"data: {json.dumps(data)}\n\n"


def openai_reply(*deltas: dict[str, Any], finish: str = "stop") -> Reply:
    usage = {"prompt_tokens": 21, "completion_tokens": 5, "total_tokens": 26}
    usage_chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                   "model": ANSWERED_GPT, "choices": [], "usage": usage}  # fmt: skip
    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk(d) for d in deltas]
    events += [chunk({}, finish), f"data: {json.dumps(usage_chunk)}\n\n", "data: [DONE]\n\n"]
    return Reply(events=events)


def tool_delta(index: int, *, id: str = "", name: str = "", arguments: str = "") -> dict[str, Any]:
    part: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if id:
        part |= {"id": id, "type": "function"}
        part["function"]["name"] = name
    return {"tool_calls": [part]}


def event(data: dict[str, Any]) -> str:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n"


def anthropic_reply(*blocks: list[dict[str, Any]], stop: str = "end_turn") -> Reply:
    """Each block: its content_block_start's block, then its deltas."""
    message: dict[str, Any] = {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                               "model": ANSWERED_CLAUDE, "stop_reason": None, "stop_sequence": None,
                               "usage": {"input_tokens": 33, "output_tokens": 1}}  # fmt: skip
    events = [event({"type": "message_start", "message": message})]
    for index, (start, *deltas) in enumerate(blocks):
        events.append(
            event({"type": "content_block_start", "index": index, "content_block": start})
        )
        events += [event({"type": "content_block_delta", "index": index, "delta": d})
                   for d in deltas]  # fmt: skip
        events.append(event({"type": "content_block_stop", "index": index}))
    events.append(event({"type": "message_delta", "delta": {"stop_reason": stop,
                         "stop_sequence": None}, "usage": {"output_tokens": 9}}))  # fmt: skip
    events.append(event({"type": "message_stop"}))
    return Reply(events=events)


def text_block(*pieces: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": ""}, *({"type": "text_delta", "text": p} for p in pieces)]


def tool_block(id: str, name: str, *pieces: str) -> list[dict[str, Any]]:
    start = {"type": "tool_use", "id": id, "name": name, "input": {}}
    return [start, *({"type": "input_json_delta", "partial_json": p} for p in pieces)]


WEATHER = ToolSpec(
    "weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)

# A conversation in the agent's (chat-completions) shape: two tool calls and their results.
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_a", "type": "function",
         "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_b", "type": "function",
         "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
    ]},
    {"role": "tool", "tool_call_id": "call_a", "name": "weather", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_b", "name": "weather", "content": "snow"},
]  # fmt: skip


# --- OpenAIChat --------------------------------------------------------------------------------


async def test_openai_text_streams_through_emit_in_pieces_with_usage(
    provider: FakeProvider, closing: Closer
) -> None:
    provider.script(openai_reply({"content": "Hel"}, {"content": "lo, "}, {"content": "world"}))
    model = openai_model(provider, closing, temperature=0.2, max_tokens=50, extra={"seed": 7})
    emitted = Emitted()
    response = await model.complete(
        ModelRequest("Be brief.", [{"role": "user", "content": "hi"}], []), emitted
    )
    assert emitted == ["Hel", "lo, ", "world"]
    assert response.text == "Hello, world"
    assert response.tool_calls == []
    assert response.usage == {"input_tokens": 21, "output_tokens": 5}
    assert response.model == ANSWERED_GPT
    [sent] = provider.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.body["model"] == "gpt-test"
    assert sent.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert sent.body["stream"] is True
    assert sent.body["stream_options"] == {"include_usage": True}
    assert (sent.body["temperature"], sent.body["max_tokens"], sent.body["seed"]) == (0.2, 50, 7)
    assert "tools" not in sent.body


async def test_openai_tool_calls_split_across_deltas_are_put_together(
    provider: FakeProvider, closing: Closer
) -> None:
    provider.script(
        openai_reply(
            tool_delta(0, id="call_1", name="weather", arguments='{"ci'),
            tool_delta(1, id="call_2", name="weather", arguments=""),
            tool_delta(0, arguments='ty": "Ber'),
            tool_delta(1, arguments='{"city": "Rome"}'),
            tool_delta(0, arguments='lin"}'),
            finish="tool_calls",
        )
    )
    emitted = Emitted()
    response = await openai_model(provider, closing).complete(
        ModelRequest("You know the weather.", HISTORY, [WEATHER]), emitted
    )
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("call_1", "weather", {"city": "Berlin"}),
        ("call_2", "weather", {"city": "Rome"}),
    ]
    assert response.text == ""
    assert emitted == []
    body = provider.requests[0].body
    assert body["tools"] == [{"type": "function", "function": {
        "name": "weather", "description": "The weather in a city.",
        "parameters": WEATHER.parameters}}]  # fmt: skip
    assert body["messages"][0] == {"role": "system", "content": "You know the weather."}
    assert body["messages"][2] == {"role": "assistant", "tool_calls": HISTORY[1]["tool_calls"]}
    assert body["messages"][3:] == [
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "snow"},
    ]


async def test_openai_tool_arguments_that_are_not_json_fail_the_call_for_a_retry(
    provider: FakeProvider, closing: Closer
) -> None:
    provider.script(openai_reply(tool_delta(0, id="c", name="weather", arguments='{"city": ')))
    with pytest.raises(ModelError, match="not valid JSON") as err:
        await openai_model(provider, closing).complete(ModelRequest("", [], [WEATHER]), Emitted())
    assert not isinstance(err.value, tether.PermanentError)


ERRORS = [  # status, headers, expected type, retry_after, a word of the message
    (429, {"retry-after": "7"}, RateLimited, 7.0, "rate limited"),
    (429, {"retry-after-ms": "1500"}, RateLimited, 1.5, "1.5 s"),
    (401, {}, ModelRefused, None, "API_KEY"),
    (403, {}, ModelRefused, None, "may use the model"),
    (404, {}, ModelRefused, None, "check the model name"),
    (400, {}, ModelRefused, None, "fix the request"),
    (500, {}, ModelError, None, "retried"),
    (503, {}, ModelError, None, "retried"),
]


@pytest.mark.parametrize(("status", "headers", "kind", "wait", "says"), ERRORS)
async def test_openai_http_errors_become_tether_errors_without_sdk_retries(
    provider: FakeProvider,
    closing: Closer,
    status: int,
    headers: dict[str, str],
    kind: type[Exception],
    wait: float | None,
    says: str,
) -> None:
    provider.script(Reply(status, headers=headers), openai_reply({"content": "too late"}))
    with pytest.raises(kind, match=says) as err:
        await openai_model(provider, closing).complete(ModelRequest("", [], []), Emitted())
    assert type(err.value) is kind
    assert isinstance(err.value, tether.PermanentError) == (kind is ModelRefused)
    assert getattr(err.value, "retry_after", None) == wait
    assert len(provider.requests) == 1  # the SDK did not retry on its own


async def test_an_unreachable_provider_is_a_retried_model_error(closing: Closer) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    model = closing(OpenAIChat("gpt-test", base_url=f"http://127.0.0.1:{port}/v1", api_key="k"))
    with pytest.raises(ModelError, match="could not be reached") as err:
        await model.complete(ModelRequest("", [{"role": "user", "content": "hi"}], []), Emitted())
    assert not isinstance(err.value, tether.PermanentError)


async def test_openai_without_an_api_key_is_refused_with_what_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_ADMIN_KEY", raising=False)
    with pytest.raises(ModelRefused, match="set OPENAI_API_KEY"):
        await OpenAIChat("gpt-test").complete(ModelRequest("", [], []), Emitted())


async def test_anthropic_without_credentials_is_refused_with_what_to_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE",
                 "ANTHROPIC_IDENTITY_TOKEN", "ANTHROPIC_IDENTITY_TOKEN_FILE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))  # no profile on disk either
    with pytest.raises(ModelRefused, match="set ANTHROPIC_API_KEY"):
        await AnthropicMessages("claude-test").complete(ModelRequest("", [], []), Emitted())


# --- AnthropicMessages -------------------------------------------------------------------------


async def test_anthropic_text_streams_with_usage_and_the_history_is_translated(
    provider: FakeProvider, closing: Closer
) -> None:
    provider.script(anthropic_reply(text_block("Paris is ", "sunny; ", "Oslo has snow.")))
    model = anthropic_model(provider, closing, max_tokens=300)
    emitted = Emitted()
    response = await model.complete(ModelRequest("You know the weather.", HISTORY, [WEATHER]),
                                    emitted)  # fmt: skip
    assert emitted == ["Paris is ", "sunny; ", "Oslo has snow."]
    assert response.text == "Paris is sunny; Oslo has snow."
    assert response.usage == {"input_tokens": 33, "output_tokens": 9}
    assert response.model == ANSWERED_CLAUDE
    [sent] = provider.requests
    assert sent.path == "/v1/messages"
    assert sent.headers["authorization"] == "Bearer sk-ant"
    body = sent.body
    assert (body["model"], body["max_tokens"], body["stream"]) == ("claude-test", 300, True)
    assert body["system"] == "You know the weather."
    assert body["tools"] == [{"name": "weather", "description": "The weather in a city.",
                              "input_schema": WEATHER.parameters}]  # fmt: skip
    assert body["messages"] == [
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "call_a", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "call_b", "name": "weather", "input": {"city": "Oslo"}},
        ]},
        {"role": "user", "content": [  # consecutive tool results: one user message
            {"type": "tool_result", "tool_use_id": "call_a", "content": "sunny"},
            {"type": "tool_result", "tool_use_id": "call_b", "content": "snow"},
        ]},
    ]  # fmt: skip


async def test_anthropic_tool_use_is_put_together_from_input_json_deltas(
    provider: FakeProvider, closing: Closer
) -> None:
    provider.script(
        anthropic_reply(
            text_block("Let me check."),
            tool_block("toolu_1", "weather", '{"ci', 'ty": ', '"Lisbon"}'),
            tool_block("toolu_2", "weather"),  # no deltas: the start block's input
            stop="tool_use",
        )
    )
    emitted = Emitted()
    response = await anthropic_model(provider, closing).complete(
        ModelRequest("", [{"role": "user", "content": "Lisbon?"}], [WEATHER]), emitted
    )
    assert emitted == ["Let me check."]
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("toolu_1", "weather", {"city": "Lisbon"}),
        ("toolu_2", "weather", {}),
    ]
    assert "system" not in provider.requests[0].body


@pytest.mark.parametrize(
    ("status", "headers", "kind", "wait", "says"),
    [*ERRORS, (529, {}, ModelError, None, "retried")],
)
async def test_anthropic_http_errors_become_tether_errors_without_sdk_retries(
    provider: FakeProvider,
    closing: Closer,
    status: int,
    headers: dict[str, str],
    kind: type[Exception],
    wait: float | None,
    says: str,
) -> None:
    says = "ANTHROPIC_API_KEY" if status == 401 else says
    body = {"type": "error", "error": {"type": "scripted_error", "message": "scripted"}}
    provider.script(Reply(status, headers=headers, body=body), anthropic_reply(text_block("x")))
    with pytest.raises(kind, match=says) as err:
        await anthropic_model(provider, closing).complete(
            ModelRequest("", [{"role": "user", "content": "hi"}], []), Emitted()
        )
    assert type(err.value) is kind
    assert isinstance(err.value, tether.PermanentError) == (kind is ModelRefused)
    assert getattr(err.value, "retry_after", None) == wait
    assert len(provider.requests) == 1


async def test_an_anthropic_error_in_the_middle_of_the_stream_is_retried(
    provider: FakeProvider, closing: Closer
) -> None:
    broken = anthropic_reply(text_block("Half an ans"))
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    broken.events[4:] = [event(error)]
    provider.script(broken)
    emitted = Emitted()
    with pytest.raises(ModelError, match="Overloaded") as err:
        await anthropic_model(provider, closing).complete(
            ModelRequest("", [{"role": "user", "content": "hi"}], []), emitted
        )
    assert not isinstance(err.value, tether.PermanentError)
    assert emitted == ["Half an ans"]  # the agent's stream retracts it when the step retries


def test_retry_after_reads_seconds_milliseconds_and_http_dates() -> None:
    assert retry_after({"retry-after": "7"}) == 7.0
    assert retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    dated = {
        "retry-after": "Wed, 21 Oct 2015 07:28:00 GMT",
        "date": "Wed, 21 Oct 2015 07:27:30 GMT",
    }
    assert retry_after(dated) == 30.0
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({}) is None


# --- end to end --------------------------------------------------------------------------------


async def test_an_agent_calls_a_tool_through_openai_chat_and_records_usage_and_model(
    provider: FakeProvider, closing: Closer
) -> None:
    app = tether.App("memory://")
    looked_up: list[str] = []

    @app.tool()
    async def weather(city: str) -> str:
        """The weather in a city."""
        looked_up.append(city)
        return f"sunny in {city}"

    model = openai_model(provider, closing)
    agent = tether.Agent(model, "You know the weather.", [weather])

    @app.workflow()
    async def forecast(question: str) -> str:
        return (await agent.run(question)).output

    provider.script(
        openai_reply(
            tool_delta(0, id="call_w", name="weather", arguments='{"city":'),
            tool_delta(0, arguments=' "Nice"}'),
            finish="tool_calls",
        ),
        openai_reply({"content": "It is "}, {"content": "sunny "}, {"content": "in Nice."}),
    )
    async with app:
        handle = await app.start(forecast, "Weather in Nice?", id="forecast")
        assert await handle.result(timeout=10) == "It is sunny in Nice."
        tokens = [entry async for _, entry in app.read_stream("forecast", "tokens")]
        recorded = [json.loads(c.result or "null") for c in await handle.checkpoints()
                    if c.name.startswith("agent.model")]  # fmt: skip
    assert looked_up == ["Nice"]
    # Each model call's checkpoint keeps what the provider reported, for the transcript.
    assert [(r["usage"], r["model"]) for r in recorded] == [
        ({"input_tokens": 21, "output_tokens": 5}, ANSWERED_GPT)
    ] * 2
    assert tokens == ["It is ", "sunny ", "in Nice."]
    second = provider.requests[1].body["messages"]
    assert second[-1] == {"role": "tool", "tool_call_id": "call_w", "content": "sunny in Nice"}
    assert second[-2]["tool_calls"][0]["function"] == {"name": "weather",
                                                       "arguments": '{"city": "Nice"}'}  # fmt: skip

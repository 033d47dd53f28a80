"""A small chat page whose answer streams token by token and resumes after a reload: the page
keeps the offsets it has shown, and on reload reconnects with `?offset=` to the next one; the
run itself never notices.

    python examples/chat/app.py          then open http://127.0.0.1:8001/

The model is a slow echo (offline) unless OPENAI_API_KEY is set. A local demo: it binds
127.0.0.1 and has no sign-in; `tether serve` is the authenticated server.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import Body, FastAPI, Request
from fastapi.responses import FileResponse, StreamingResponse

import tether
from tether.models import Model, ModelRequest, ModelResponse
from tether.server.http import Hygiene
from tether.server.sse import event_stream, start_offset

HERE = Path(__file__).resolve().parent


class SlowEcho:
    """Answers by quoting the question, one word every 80 ms, so a reload mid-answer shows
    the stream resuming."""

    name = "slow-echo"

    def __init__(self, delay: float = 0.08) -> None:
        self.delay = delay

    async def complete(self, request: ModelRequest, emit: Any) -> ModelResponse:
        question = str(request.messages[-1].get("content", ""))
        words = f"You said: {question}. Streams survive reloads, crashes and restarts.".split()
        for n, word in enumerate(words):
            await emit(word if n == len(words) - 1 else word + " ")
            await asyncio.sleep(self.delay)
        return ModelResponse(text=" ".join(words))


def pick_model() -> Model:
    if os.environ.get("OPENAI_API_KEY"):
        from tether.models import OpenAIChat

        return OpenAIChat(os.environ.get("TETHER_DEMO_MODEL", "gpt-4.1-mini"))
    return SlowEcho()


def make_web(app: tether.App, model: Model | None = None) -> FastAPI:
    agent = tether.Agent(model or pick_model(), "You are brief and friendly.")

    @app.workflow()
    async def chat(messages: list[dict[str, Any]]) -> str:
        return (await agent.run(messages)).output

    web = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @web.get("/")
    async def page() -> FileResponse:
        return FileResponse(HERE / "index.html")

    @web.get("/chat.js")
    async def script() -> FileResponse:
        return FileResponse(HERE / "chat.js", media_type="text/javascript")

    @web.post("/messages")
    async def post(text: str = Body(embed=True, min_length=1, max_length=2000)) -> dict[str, str]:
        handle = await app.start(chat, [{"role": "user", "content": text}])
        return {"run_id": handle.id}

    @web.get("/runs/{run_id}/tokens")
    async def tokens(run_id: str, request: Request, offset: int | None = None) -> StreamingResponse:
        await app.get(run_id)  # RunNotFound for an unknown run
        return event_stream(app, run_id, "tokens", start_offset(request, offset), follow=True)

    web.add_middleware(Hygiene)
    return web


async def main(port: int) -> None:
    app = tether.App(os.environ.get("TETHER_DATABASE_URL", "sqlite:///chat-demo.db"))
    config = uvicorn.Config(make_web(app), host="127.0.0.1", port=port, log_level="warning",
                            timeout_graceful_shutdown=2)  # fmt: skip
    async with app:
        print(f"chat on http://127.0.0.1:{port}/", file=sys.stderr)
        await uvicorn.Server(config).serve()


if __name__ == "__main__":
    asyncio.run(main(int(os.environ.get("PORT", "8001"))))

"""Helpers of the server tests, importable from any test file (conftest.py holds the fixtures):
ORIGIN (the ASGI client's origin), SECRET, ASK (the default approval of the workflow `ask`),
Person (a user with their token), build_app (an App with the workflow `ask`: step `prepare`, one
approval shaped by the run's argument, then step `act` if approved), start_approval (start `ask`
and wait for its pending approval), csrf_of (the CSRF token of a page), sign_in (open an inbox
session through the form), LiveServer,
events (the (event, data) pairs of a server-sent event stream); for the browser tests WAIT_MS
(how long to wait for the page) and browser_sign_in (sign in by the form in a Playwright page).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import socket
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import httpx
import uvicorn
from starlette.types import ASGIApp

import tether
from tether.users import User

if TYPE_CHECKING:
    from playwright.async_api import Page

ORIGIN = "http://testserver"
WAIT_MS = 10_000  # how long a browser test waits for the page
SECRET = b"s" * 32
ASK: dict[str, Any] = {
    "title": "Deploy 1.2.3 to prod?",
    "description": "The agent wants to deploy the release.",
    "operation": {"tool": "deploy", "arguments": {"version": "1.2.3", "env": "prod"}},
    "context": {"changelog": "fix login", "api_key": "abc123"},
    "reviewers": ["group:sre"],
}


@dataclasses.dataclass(frozen=True)
class Person:
    user: User
    token: str

    @property
    def name(self) -> str:
        return self.user.name


def build_app(url: str) -> tether.App:
    app = tether.App(url)
    # Durable waits resume promptly after a decision in tests.
    app.engine.settings = dataclasses.replace(app.engine.settings, poll_interval=0.05)

    @app.step()
    async def prepare(spec: dict[str, Any]) -> str:
        return f"prepared {spec.get('title', '')[:20]}"

    @app.step()
    async def act(version: str) -> str:
        return f"did {version}"

    @app.step()
    async def speak(words: list[str], pause: float) -> int:
        for word in words:
            await tether.stream("tokens").write(word)
            await asyncio.sleep(pause)
        return len(words)

    @app.workflow()
    async def talk(words: list[str], pause: float) -> int:
        return await speak(words, pause)

    @app.workflow()
    async def ask(spec: dict[str, Any]) -> dict[str, Any]:
        await prepare(spec)
        fields: dict[str, Any] = {**ASK, **spec}
        if fields.get("options"):
            fields["options"] = [tether.Option(**o) for o in fields["options"]]
        expires = timedelta(seconds=fields.pop("expires_seconds", 3600))
        decision = await tether.approval(expires_in=expires, **fields)
        outcome: dict[str, Any] = {
            "status": decision.status,
            "option": decision.option,
            "reviewer": decision.reviewer,
            "comment": decision.comment,
            "response": decision.response,
        }
        if decision.approved:
            outcome["act"] = await act("1.2.3")
        return outcome

    return app


async def start_approval(app: tether.App, run_id: str, **fields: Any) -> tether.Approval:
    """Start `ask` with these approval fields and return its approval once it is pending."""
    starter = fields.pop("starter", None)
    await app.start("ask", fields, id=run_id, started_by=starter)
    async with asyncio.timeout(10):
        while not (found := await app.list_approvals(run_id=run_id)):
            await asyncio.sleep(0.01)
    return found[0]


def csrf_of(page: str) -> str:
    """The CSRF token of a page's forms."""
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
    assert found, "the page has no CSRF field"
    return found.group(1)


async def sign_in(client: httpx.AsyncClient, person: Person) -> httpx.Response:
    """Sign in through the form, as a browser would (Origin header included)."""
    response = await client.post("/login", data={"token": person.token},
                                 headers={"Origin": str(client.base_url).rstrip("/")})  # fmt: skip
    assert response.status_code == 303, response.text
    return response


async def browser_sign_in(page: Page, person: Person) -> None:
    """Sign in by pasting the token into the inbox's form, in a browser; back on the inbox."""
    await page.goto("/")
    await page.fill("#token", person.token)
    await page.click("#signin button[type=submit]")
    await page.wait_for_selector("h1:text('Inbox')", timeout=WAIT_MS)


@dataclasses.dataclass(frozen=True)
class LiveServer:
    url: str
    uvicorn: uvicorn.Server


@contextlib.asynccontextmanager
async def serving(asgi: ASGIApp) -> AsyncIterator[LiveServer]:
    """`asgi` served by uvicorn on 127.0.0.1 at a free port, in this event loop."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(asgi, log_config=None, log_level="warning", ws="none",
                            lifespan="on", timeout_graceful_shutdown=2)  # fmt: skip
    served = uvicorn.Server(config)
    task = asyncio.create_task(served.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not served.started:
                if task.done():
                    task.result()  # raises why it could not start
                await asyncio.sleep(0.01)
        yield LiveServer(f"http://127.0.0.1:{port}", served)
    finally:
        served.should_exit = True
        async with asyncio.timeout(10):
            await task
        sock.close()


async def events(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """(event, data) pairs of a server-sent event stream; comments come as ("comment", text)."""
    name, data = "message", ""
    async for line in response.aiter_lines():
        if line.startswith(":"):
            yield "comment", line[1:].strip()
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line == "" and data:
            yield name, data
            name, data = "message", ""

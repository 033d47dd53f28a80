"""Fixtures for the server tests (JSON API, inbox, browser), generic enough for every file here:

- `app`: a tether.App on a SQLite file in tmp_path, its worker running, with the workflow
  `ask` (step `prepare`, one approval shaped by the run's argument, then step `act` if approved).
  `kit.start_approval(app, run_id, **fields)` starts it and returns the pending Approval; fields
  override ASK (title, description, operation, context, reviewers, required, options as dicts,
  separate_duties, expires_seconds).
- `alice` (group sre), `bob` (group sre), `admin` (group admin), `outsider` (group finance):
  Person(user, token), created in `app`'s database.
- `server`: the ASGI application of create_server(app) with a fixed session secret.
- `client`: an httpx.AsyncClient on `server` over ASGI (no sockets), base URL ORIGIN;
  `kit.sign_in(client, person)` opens an inbox session on it (the cookie stays in the client).
- `live_server`: `server` served by uvicorn on 127.0.0.1 at a free port, in the test's event
  loop (so tests may await the App directly); `.url` is its origin.
- `page`: a fresh Playwright page in headless Chromium (tests/conftest.py's `browser`) on
  `live_server`, in a context of the size `viewport` says (a file may override it); its console
  errors and uncaught exceptions (CSP violations included) land in `problems`, which must be
  empty once the page is closed. `kit.browser_sign_in(page, person)` signs in by the form.
  Screenshots go to tests/conftest.py's `screenshots` folder.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from playwright.async_api import Browser, ConsoleMessage, Page, ViewportSize
from tests.server.kit import ORIGIN, SECRET, LiveServer, Person, build_app, serving

import tether
from tether.server import create_server
from tether.users import add_user


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[tether.App]:
    """An App on a SQLite file, worker running (see the module docstring)."""
    built = build_app(f"sqlite:///{tmp_path}/server.db")
    async with built:
        yield built


async def _person(app: tether.App, name: str, *groups: str) -> Person:
    user, token = await add_user(app.engine, name, frozenset(groups))
    return Person(user, token)


@pytest.fixture
async def alice(app: tether.App) -> Person:
    return await _person(app, "alice", "sre")


@pytest.fixture
async def bob(app: tether.App) -> Person:
    return await _person(app, "bob", "sre")


@pytest.fixture
async def admin(app: tether.App) -> Person:
    return await _person(app, "root", "admin")


@pytest.fixture
async def outsider(app: tether.App) -> Person:
    return await _person(app, "eve", "finance")


@pytest.fixture
def server(app: tether.App) -> FastAPI:
    return create_server(app, secret=SECRET)


@pytest.fixture
async def client(server: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=server)
    async with httpx.AsyncClient(transport=transport, base_url=ORIGIN) as made:
        yield made


@pytest.fixture
async def live_server(server: FastAPI) -> AsyncIterator[LiveServer]:
    """`server` on 127.0.0.1 at a free port, served by uvicorn in this event loop."""
    async with serving(server) as live:
        yield live


@pytest.fixture
def problems() -> list[str]:
    """Console errors and uncaught exceptions of `page` (CSP violations included)."""
    return []


@pytest.fixture
def viewport() -> ViewportSize:
    """The size of `page`'s window: Playwright's default unless a test file overrides it."""
    return {"width": 1280, "height": 720}


@pytest.fixture
async def page(
    browser: Browser, live_server: LiveServer, viewport: ViewportSize, problems: list[str]
) -> AsyncIterator[Page]:
    """A fresh page on the live server; what goes wrong in it lands in `problems`, which is
    checked empty after the page is closed."""
    context = await browser.new_context(base_url=live_server.url, viewport=viewport)
    opened = await context.new_page()

    def note(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(message.text)

    opened.on("console", note)
    opened.on("pageerror", lambda error: problems.append(str(error)))
    try:
        yield opened
    finally:
        await context.close()
    assert problems == []  # no CSP violation, no script error

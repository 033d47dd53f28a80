"""examples/chat in a real browser: the answer streams token by token, a reload in the middle
resumes the stream at the next offset (not from the start, not from nothing), and the page ends
with exactly the whole answer."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import pytest
from fastapi import FastAPI
from playwright.async_api import Browser, expect
from tests.server.kit import WAIT_MS, LiveServer

import tether

pytestmark = pytest.mark.timeout(60)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "chat" / "app.py"


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chat_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[FastAPI]:
    app = tether.App(f"sqlite:///{tmp_path}/chat.db")
    chat = example()
    web: FastAPI = chat.make_web(app, chat.SlowEcho(delay=0.3))  # about 3 s per answer
    async with app:
        yield web


async def test_the_chat_answer_resumes_after_a_reload(
    browser: Browser, live_server: LiveServer
) -> None:
    context = await browser.new_context(base_url=live_server.url)
    page = await context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    try:
        await page.goto("/")
        await page.fill("#text", "hello there")
        await page.click("button[type=submit]")
        answer = page.locator("#answer")
        await expect(answer).to_contain_text("said:", timeout=WAIT_MS)  # mid-answer
        await page.reload()
        await expect(page.locator("#status")).to_contain_text("resumed at offset",
                                                              timeout=WAIT_MS)  # fmt: skip
        await expect(page.locator("#status")).to_have_text("done", timeout=WAIT_MS)
        whole = "You said: hello there. Streams survive reloads, crashes and restarts."
        await expect(answer).to_have_text(whole)
        assert problems == []
    finally:
        await context.close()

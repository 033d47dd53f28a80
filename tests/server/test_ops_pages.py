"""The operations pages (/ops, tether.server.console) against the App of ops_kit.py on a SQLite
file with its worker running: a queue with limits (a rate that leaves runs due), a run held by
the worker, a schedule with a run of a past slot, an outbox message its sender refused, a dead
run. Each page over httpx for a signed-in admin; 403 for a reviewer, the sign-in redirect for
nobody; the Retry form with and without its CSRF token; hostile names escaped and secrets
redacted; every page in headless Chromium, the Retry button reached with the keyboard; and open
pages updating in place when a message fails or a worker appears. (The same data over the JSON
API and the pages' live streams: test_ops_api.py.)
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from playwright.async_api import Page, expect
from tests.server.kit import ORIGIN, SECRET, WAIT_MS, LiveServer, Person, sign_in
from tests.server.ops_kit import (
    DESTINATION,
    HOSTILE,
    QUEUE,
    REFUSAL,
    SCHEDULE,
    Setup,
    ops_app,
    until,
)

import tether
from tether.server import create_server
from tether.server.console import build_console
from tether.store.port import WorkerInfo

pytestmark = pytest.mark.timeout(60)

PAGES = ("workers", "queues", "schedules", "outbox", "dead")


@pytest.fixture
def setup() -> Setup:
    return Setup()


@pytest.fixture
async def app(tmp_path: Path, setup: Setup) -> AsyncIterator[tether.App]:
    """The App of tests/server/ops_kit.py on a SQLite file."""
    async with ops_app(f"sqlite:///{tmp_path}/ops.db", setup) as built:
        yield built


@pytest.fixture
def server(app: tether.App) -> FastAPI:
    made = create_server(app, secret=SECRET)
    made.include_router(build_console(app))
    return made


async def page_text(client: httpx.AsyncClient, name: str) -> str:
    response = await client.get(f"/ops/{name}")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    return response.text


def row(html: str, attribute: str, value: str) -> str:
    """The table row whose `attribute` is `value` (escaped as the page escapes it)."""
    escaped = value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    escaped = escaped.replace('"', "&#34;")
    found = re.search(rf'<tr[^>]*{attribute}="{re.escape(escaped)}".*?</tr>', html, re.S)
    assert found, f"no row with {attribute}={value!r}"
    return found.group(0)


# -- the pages, as an admin ----------------------------------------------------------------------


async def test_the_workers_page_shows_the_worker_its_heartbeat_and_the_run_it_holds(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    await sign_in(client, admin)
    html = await page_text(client, "workers")
    (worker,) = await app.engine.store.list_workers()
    assert worker.id == app.worker_id
    found = row(html, "data-worker-id", worker.id)
    assert f'<td data-label="Host">{worker.host}</td>' in found
    assert f'<td data-label="PID">{os.getpid()}</td>' in found
    for name in ("hold", "notify", "tick", "typed"):
        assert f'<span class="chip">{name}</span>' in found
    assert re.search(r"\d+ s ago", found)
    assert '<td data-label="Runs held" class="runs-held">1</td>' in found  # hold-1
    assert "<caption>Workers: 1</caption>" in html


async def test_the_queues_page_shows_the_limits_the_runs_due_and_the_runs_running(
    client: httpx.AsyncClient, admin: Person
) -> None:
    await sign_in(client, admin)
    found = row(await page_text(client, "queues"), "data-queue", QUEUE)
    cells = re.findall(r'<td data-label="([^"]+)"[^>]*>(.*?)</td>', found, re.S)
    assert dict(cells[:5]) == {"Concurrency": "3", "Per worker": "2",
                               "Rate": "2 per 3600 s", "Due now": "2", "Running": "1"}  # fmt: skip
    assert '<span class="chip">hold</span><span class="chip">notify</span>' in found


async def test_the_schedules_page_shows_the_next_slots_and_links_the_latest_run(
    app: tether.App, setup: Setup, client: httpx.AsyncClient, admin: Person
) -> None:
    await sign_in(client, admin)
    html = await page_text(client, "schedules")
    (info,) = await app.list_schedules()
    assert info.next_slot is not None
    slots = re.findall(r"<tr><td>(\d{4}-\d\d-\d\d \d\d:\d\d:00 UTC)</td></tr>", html)
    assert len(slots) == 3
    assert slots[0] == info.next_slot.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert sorted(set(slots)) == slots  # three distinct minutes, in order
    assert setup.slot_run.startswith("schedule:")
    linked = row(html, "data-run-id", setup.slot_run)
    assert 'class="badge badge-succeeded"' in linked
    href = re.search(r'href="(/runs/[^"]+)"', linked)
    assert href
    assert (await client.get(href.group(1))).status_code == 200


async def test_the_outbox_page_shows_the_failed_message_redacted_with_a_retry_button(
    setup: Setup, client: httpx.AsyncClient, admin: Person, caplog: pytest.LogCaptureFixture
) -> None:
    # The delivery's own log line said the failure too, redacted, before any page was read.
    records = [*caplog.get_records("setup"), *caplog.records]
    logged = [r.getMessage() for r in records if r.name == "tether.outbox"]
    assert any("failed for good" in line for line in logged), logged
    assert not any("swordfish" in line or "hunter2" in line for line in logged), logged
    await sign_in(client, admin)
    html = await page_text(client, "outbox")
    found = row(html, "data-message-id", setup.message_id)
    assert "hunter2" not in html
    assert "swordfish" not in html
    assert "https://ops:[redacted]@hooks.example/in" in found
    assert '<td data-label="Attempts">1</td>' in found
    assert "tether.errors.PermanentError: &lt;img src=x" in found
    assert "second line" not in found  # the error's first line only
    assert 'href="/runs/notify-1"' in found
    button = re.search(r"<button[^>]*>Retry</button>", found)
    assert button
    assert 'aria-label="Retry outbox message ' in button.group(0)
    assert "<caption>Failed: 1</caption>" in html
    assert "<caption>In doubt: 0</caption>" in html


async def test_the_dead_runs_page_shows_the_errors_first_line_and_links_the_run(
    client: httpx.AsyncClient, admin: Person
) -> None:
    await sign_in(client, admin)
    html = await page_text(client, "dead")
    found = row(html, "data-run-id", "dead-1")
    assert 'href="/runs/dead-1"' in found
    assert "<code>tether.errors.ArgumentsRefused</code>" in found
    message = re.search(r'<span class="error-line">(.*?)</span>', found, re.S)
    assert message
    assert message.group(1).strip()
    assert "\n" not in message.group(1)
    assert "<caption>Dead runs: 1</caption>" in html
    assert (await client.get("/runs/dead-1")).status_code == 200


# -- the Retry action ----------------------------------------------------------------------------


async def test_retrying_a_failed_message_needs_the_csrf_token_then_sends_it_again(
    app: tether.App,
    setup: Setup,
    client: httpx.AsyncClient,
    admin: Person,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await sign_in(client, admin)
    html = await page_text(client, "outbox")
    csrf = re.search(r'name="csrf" value="([^"]+)"', html).group(1)  # type: ignore[union-attr]
    action = f"/ops/outbox/{httpx.URL(setup.message_id).raw_path.decode()}/retry"
    assert f'action="{action}"' in html
    setup.sender.refusing = False  # the receiver is fixed

    for refused in ({"comment": "no csrf field"}, {"csrf": "forged"}):
        forged = await client.post(action, data=refused, headers={"Origin": ORIGIN})
        assert forged.status_code == 403
        assert "Nothing was changed" in forged.text
    elsewhere = await client.post(action, data={"csrf": csrf},
                                  headers={"Origin": "https://evil.example"})  # fmt: skip
    assert elsewhere.status_code == 403
    (still,) = await app.list_outbox(status="failed")
    assert still.id == setup.message_id
    assert setup.sender.accepted == []

    with caplog.at_level(logging.INFO, logger="tether.server"):
        sent = await client.post(action, data={"csrf": csrf}, headers={"Origin": ORIGIN})
    assert (sent.status_code, sent.headers["location"]) == (303, "/ops/outbox")
    logged = [r.getMessage() for r in caplog.records if r.name == "tether.server"]
    assert logged == [f"outbox message {setup.message_id} is sent again, asked by root from "
                      f"127.0.0.1 (the operations page)"]  # fmt: skip

    async def delivered() -> bool:
        listed = await app.list_outbox(status="delivered")
        return [m.id for m in listed] == [setup.message_id]

    await until(delivered)
    assert setup.sender.accepted == [still.key]  # the same idempotency key
    again = await client.post(action, data={"csrf": csrf}, headers={"Origin": ORIGIN})
    assert again.status_code == 409
    assert "only a failed one" in again.text
    assert "<caption>Failed: 0</caption>" in await page_text(client, "outbox")


# -- who may see them ----------------------------------------------------------------------------


async def test_a_reviewer_gets_403_on_every_ops_page_and_cannot_retry(
    app: tether.App, setup: Setup, client: httpx.AsyncClient, alice: Person
) -> None:
    await sign_in(client, alice)
    for name in PAGES:
        response = await client.get(f"/ops/{name}")
        assert response.status_code == 403, name
        assert "Admins only" in response.text
        assert setup.message_id not in response.text
    html = (await client.get("/")).text
    csrf = re.search(r'name="csrf" value="([^"]+)"', html).group(1)  # type: ignore[union-attr]
    action = f"/ops/outbox/{httpx.URL(setup.message_id).raw_path.decode()}/retry"
    refused = await client.post(action, data={"csrf": csrf}, headers={"Origin": ORIGIN})
    assert refused.status_code == 403
    assert "Admins only" in refused.text
    assert [m.id for m in await app.list_outbox(status="failed")] == [setup.message_id]


async def test_an_anonymous_visitor_is_sent_to_sign_in_and_cannot_retry(
    app: tether.App, setup: Setup, client: httpx.AsyncClient
) -> None:
    for name in PAGES:
        response = await client.get(f"/ops/{name}")
        assert response.status_code == 303
        assert response.headers["location"] == f"/?next=%2Fops%2F{name}"
    assert (await client.get("/ops")).headers["location"] == "/ops/workers"
    action = f"/ops/outbox/{httpx.URL(setup.message_id).raw_path.decode()}/retry"
    refused = await client.post(action, data={"csrf": "x"}, headers={"Origin": ORIGIN})
    assert refused.status_code == 403
    assert "Signed out" in refused.text
    assert [m.id for m in await app.list_outbox(status="failed")] == [setup.message_id]


async def test_hostile_names_and_errors_are_escaped_on_every_ops_page(
    client: httpx.AsyncClient, admin: Person
) -> None:
    await sign_in(client, admin)
    escaped = "&lt;img src=x onerror=&#34;window.__pwned=1&#34;&gt;"
    shown_on = {"queues": QUEUE, "schedules": SCHEDULE, "outbox": REFUSAL.splitlines()[0],
                "dead": HOSTILE}  # fmt: skip
    for name in PAGES:
        html = await page_text(client, name)
        assert "<img" not in html, name
        assert 'onerror="' not in html, name
        assert "<script" not in html.split("</head>")[1], name
        if name in shown_on:
            assert escaped in html, name


# -- in a browser ---------------------------------------------------------------------------------


async def test_an_admin_visits_every_ops_page_in_chromium_and_retries_with_the_keyboard(
    app: tether.App,
    setup: Setup,
    page: Page,
    problems: list[str],
    live_server: LiveServer,
    admin: Person,
    screenshots: Path,
) -> None:
    await page.goto("/ops/workers")  # to sign in, then back here
    await page.fill("#token", admin.token)
    await page.keyboard.press("Enter")
    await expect(page.locator("h1")).to_have_text("Workers", timeout=WAIT_MS)
    assert page.url.endswith("/ops/workers")
    titles = {"workers": "Workers", "queues": "Queues", "schedules": "Schedules",
              "outbox": "Outbox", "dead": "Dead runs"}  # fmt: skip
    for name in PAGES:
        await page.locator("nav[aria-label=Operations]").get_by_role(
            "link", name=titles[name]).click()  # fmt: skip
        await expect(page.locator("h1")).to_have_text(titles[name], timeout=WAIT_MS)
        current = page.locator("nav[aria-label=Operations] a[aria-current=page]")
        await expect(current).to_have_text(titles[name])
        assert await page.locator("table caption").count() >= 1
        await page.screenshot(path=str(screenshots / f"ops_{name}.png"), full_page=True)
    assert await page.evaluate("typeof window.__pwned") == "undefined"

    # The outbox: Tab to the Retry button, Enter.
    await page.goto("/ops/outbox")
    retry = page.get_by_role("button", name=re.compile(r"^Retry outbox message "))
    await expect(retry).to_have_count(1)
    setup.sender.refusing = False
    for _ in range(40):
        await page.keyboard.press("Tab")
        if await retry.evaluate("button => button === document.activeElement"):
            break
    else:
        pytest.fail("Tab never reached the Retry button")
    async with page.expect_navigation(timeout=WAIT_MS):  # the POST, then its redirect
        await page.keyboard.press("Enter")
    assert page.url == f"{live_server.url}/ops/outbox"
    await expect(retry).to_have_count(0)  # no longer failed

    async def delivered() -> bool:
        listed = await app.list_outbox(status="delivered")
        return [m.id for m in listed] == [setup.message_id]

    await until(delivered)
    await page.reload()
    await expect(page.locator("#outbox-failed caption")).to_have_text("Failed: 0")
    await page.screenshot(path=str(screenshots / "ops_outbox_after_retry.png"), full_page=True)
    assert sorted(p.name for p in screenshots.glob("ops_*.png")) == sorted(
        [f"ops_{name}.png" for name in PAGES] + ["ops_outbox_after_retry.png"])  # fmt: skip
    assert problems == []


async def test_open_ops_pages_update_in_place_when_a_message_fails_or_a_worker_appears(
    app: tether.App, page: Page, problems: list[str], admin: Person
) -> None:
    await page.goto("/ops/outbox")  # to sign in, then back here
    await page.fill("#token", admin.token)
    await page.keyboard.press("Enter")
    await expect(page.locator("h1")).to_have_text("Outbox", timeout=WAIT_MS)
    await page.wait_for_selector("body[data-connected]", timeout=WAIT_MS)
    await page.evaluate("window.__still_here = 'yes'")
    failed = page.locator("#outbox-failed")
    await expect(failed.locator("caption")).to_have_text("Failed: 1")
    await app.start("send_to", DESTINATION, id="refused-late")  # refused for good at once
    await expect(failed.locator("caption")).to_have_text("Failed: 2", timeout=WAIT_MS)
    (late,) = [m for m in await app.list_outbox(status="failed") if m.run_id == "refused-late"]
    row = failed.locator(f'tr[data-message-id="{late.id}"]')
    await expect(row.get_by_role("button", name=re.compile(r"^Retry outbox message "))
                 ).to_have_count(1)  # fmt: skip
    assert await page.evaluate("window.__still_here") == "yes"  # no reload: the same document
    assert int(await page.evaluate("document.body.dataset.refreshed")) >= 1

    await page.locator("nav[aria-label=Operations]").get_by_role("link", name="Workers").click()
    await expect(page.locator("h1")).to_have_text("Workers", timeout=WAIT_MS)
    await page.wait_for_selector("body[data-connected]", timeout=WAIT_MS)
    await page.evaluate("window.__still_here = 'yes'")
    await expect(page.locator("#ops-workers caption")).to_have_text("Workers: 1")
    now = app.engine.clock.now()
    worker = WorkerInfo("w-late", "elsewhere.example", 4242, "token", started_at=now,
                        workflows=("tick",), version="v2")  # fmt: skip
    await app.engine.store.register_worker(worker, now)
    caption = page.locator("#ops-workers caption")
    await expect(caption).to_have_text("Workers: 2", timeout=WAIT_MS)
    appeared = page.locator('tr[data-worker-id="w-late"]')
    await expect(appeared.locator('td[data-label="Host"]')).to_have_text("elsewhere.example")
    await expect(appeared.locator('td[data-label="Version"]')).to_have_text("v2")
    assert await page.evaluate("window.__still_here") == "yes"
    assert await page.evaluate("typeof window.__pwned") == "undefined"
    assert problems == []

"""The runs explorer's live updates follow the view on the screen: its watch is the view's query
string, and its digest is what that page shows (its rows, the next cursor, the counts for group
admin). A filtered view's stream sends a new state when a run enters it or one of its runs
changes, and none when runs it does not show change; a view the page cannot read has no stream,
and /live refuses an id that is not a view written as the page writes it. Then in Chromium: a
filtered explorer page shows a new matching run without a reload.

Runs are written by SQL into the test's SQLite file, as tests/server/test_runs_explorer.py
does, in statuses the running worker leaves alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from playwright.async_api import Page, expect
from tests.server.kit import WAIT_MS, LiveServer, Person, browser_sign_in, sign_in, start_approval
from tests.server.test_runs_explorer import BASE, Row, insert, shown_ids, spread

import tether
from tether.server import live

pytestmark = pytest.mark.timeout(60)

QUIET = live.POLL_SECONDS * 4  # long enough for the stream to have looked a few times


@pytest.fixture
async def browserless(live_server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the live server (real sockets, so server-sent events stream)."""
    async with httpx.AsyncClient(base_url=live_server.url, timeout=10) as made:
        yield made


def restate(app: tether.App, changes: dict[str, str]) -> None:
    """Give runs new statuses (and so a new updated_at), straight in the SQLite file."""
    path = app.engine.store.url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path, isolation_level=None, timeout=10)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "UPDATE tether_runs SET status = ?, updated_at = updated_at + 7 WHERE id = ?",
            [(status, run_id) for run_id, status in changes.items()],
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def live_of(text: str) -> tuple[str, str]:
    """The page's live stream address and the digest it was rendered from."""
    found = re.search(r'<body data-live="([^"]*)" data-state="([0-9a-f]+)"', text)
    assert found, "the page has no live stream"
    return html.unescape(found.group(1)), found.group(2)


class Stream:
    """The state events of one /live stream, read in the background."""

    def __init__(self, response: httpx.Response) -> None:
        self.states: asyncio.Queue[str] = asyncio.Queue()
        self.reader = asyncio.create_task(self._read(response))

    async def _read(self, response: httpx.Response) -> None:
        name = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                assert name == "state", line
                await self.states.put(line[6:])

    async def next(self) -> str:
        return await asyncio.wait_for(self.states.get(), 5)

    async def settled(self) -> str | None:
        """The last state sent until the stream has been quiet for a while (None: none)."""
        last = None
        while True:
            try:
                last = await asyncio.wait_for(self.states.get(), QUIET)
            except TimeoutError:
                return last


@contextlib.asynccontextmanager
async def watching(client: httpx.AsyncClient, url: str) -> AsyncIterator[tuple[Stream, str]]:
    """The stream of the page at `url`, opened as its script opens it, and the page's digest
    (which the stream's first state is)."""
    shown = await client.get(url)
    assert shown.status_code == 200, shown.text
    address, rendered = live_of(shown.text)
    async with client.stream("GET", address) as response:
        assert response.status_code == 200
        stream = Stream(response)
        try:
            assert await stream.next() == rendered
            yield stream, rendered
        finally:
            stream.reader.cancel()


async def test_a_filtered_views_stream_follows_its_rows_and_not_the_runs_it_does_not_show(
    app: tether.App, browserless: httpx.AsyncClient, admin: Person
) -> None:
    rows = spread(300)  # failed runs are all of workflow wf-2 (38 of them: one page)
    insert(app, rows)
    await sign_in(browserless, admin)
    view = "/runs?status=failed&workflow=wf-2"
    shown = await browserless.get(view)
    assert live_of(shown.text)[0] == "/live?scope=runs&id=" + quote("status=failed&workflow=wf-2")
    async with watching(browserless, view) as (stream, rendered):
        # Runs outside the view change, among the newest, the counts kept: no new state.
        restate(app, {"run-00299": "succeeded", "run-00296": "cancelled"})  # a swap
        restate(app, {"run-00295": "succeeded"})  # its updated_at alone
        assert await stream.settled() is None
        # A run enters the view, older than every other run (far from the newest 200).
        insert(app, [Row("run-late", "wf-2", "failed", BASE - 10)])
        changed = await stream.next()
        assert changed != rendered
        again = await browserless.get(view)
        assert live_of(again.text)[1] == changed
        assert "run-late" in shown_ids(again.text)
        # One of its runs changes status, the counts kept (a run outside takes its old one).
        before = await stream.settled() or changed
        restate(app, {"run-00002": "cancelled", "run-00003": "failed"})
        assert await stream.next() != before


async def test_a_reviewers_filtered_view_follows_their_matching_runs_only(
    app: tether.App, browserless: httpx.AsyncClient, alice: Person
) -> None:
    await start_approval(app, "mine-1")
    other = await start_approval(app, "mine-2")
    await start_approval(app, "theirs-1", reviewers=["group:finance"])
    await waiting(app, "mine-1", "mine-2", "theirs-1")
    await sign_in(browserless, alice)
    async with watching(browserless, "/runs?q=mine-1") as (stream, rendered):
        # Their run outside the view finishes, and a run they may not see ends: nothing.
        await app.decide(other.id, "reject", reviewer=alice.user.reviewer,
                         operation_digest=other.operation_digest)  # fmt: skip
        await (await app.get("theirs-1")).cancel()
        await (await app.get("mine-2")).result(timeout=10)
        assert await stream.settled() is None
        # A run of theirs enters the view, then one of its runs changes status.
        await start_approval(app, "mine-1b")
        assert await stream.next() != rendered
        await waiting(app, "mine-1b")
        before = await stream.settled()
        await (await app.get("mine-1")).cancel()
        assert await stream.next() != before
        shown = await browserless.get("/runs?q=mine-1")
        assert shown_ids(shown.text) == ["mine-1b", "mine-1"]


async def waiting(app: tether.App, *run_ids: str) -> None:
    async with asyncio.timeout(10):
        for run_id in run_ids:
            while (await (await app.get(run_id)).status()) != "waiting":
                await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    "view",
    ["status=bogus", "cursor=not-a-cursor", "limit=0", "workflow=a&workflow=b",
     "since=2026-05-02T10:00&until=2026-05-01T10:00"],
)  # fmt: skip
async def test_a_view_with_errors_has_no_live_stream(
    client: httpx.AsyncClient, admin: Person, view: str
) -> None:
    await sign_in(client, admin)
    shown = await client.get(f"/runs?{view}")
    assert shown.status_code == 400
    assert "data-live" not in shown.text
    assert (await client.get("/live", params={"scope": "runs", "id": view})).status_code == 400


@pytest.mark.parametrize(
    "view",
    ["status=bogus", "cursor=not-a-cursor", "cursor=" + "x" * 3000, "q=" + "q" * 513,
     "workflow=x&utm_source=mail", "workflow=x&status=failed", "workflow=&status=failed",
     "limit=50", "status=failed&status=failed"],
)  # fmt: skip
async def test_live_refuses_an_id_that_is_not_a_view_as_the_page_writes_it(
    client: httpx.AsyncClient, admin: Person, alice: Person, view: str
) -> None:
    for person in (admin, alice):
        await sign_in(client, person)
        refused = await client.get("/live", params={"scope": "runs", "id": view})
        assert refused.status_code == 400, (person.name, view)


async def test_a_view_with_hostile_values_streams_from_the_state_it_was_rendered_from(
    app: tether.App, browserless: httpx.AsyncClient, admin: Person
) -> None:
    insert(app, [Row("run-a", "a&b#c=d %+é\u202e", "failed", BASE)])
    await sign_in(browserless, admin)
    view = "/runs?" + str(httpx.QueryParams({"workflow": "a&b#c=d %+é\u202e", "limit": "7"}))
    async with watching(browserless, view):
        pass  # the stream took the page's id, and began with the page's state
    shown = await browserless.get(view)
    assert shown_ids(shown.text) == ["run-a"]


# -- in a browser -----------------------------------------------------------------------------


async def test_in_a_browser_a_filtered_explorer_shows_a_new_matching_run_without_a_reload(
    app: tether.App, page: Page, admin: Person, problems: list[str], screenshots: Path,
) -> None:  # fmt: skip
    insert(app, spread(300))
    await browser_sign_in(page, admin)
    await page.goto("/runs?status=failed&workflow=wf-2")
    listed = page.locator("tr.run-row")
    await expect(listed).to_have_count(38)
    await page.wait_for_selector("body[data-connected]", timeout=WAIT_MS)
    await page.evaluate("window.__still_here = 'yes'")
    failed = page.locator("#runs-counts a", has_text="failed").locator(".count")
    await expect(failed).to_have_text("38")
    insert(app, [Row("run-late", "wf-2", "failed", BASE - 10), Row("run-other", "wf-1", "failed",
                 BASE + 10_000)])  # fmt: skip
    arrived = page.locator('tr.run-row[data-run-id="run-late"]')
    await expect(arrived).to_have_count(1, timeout=WAIT_MS)
    await expect(listed).to_have_count(39)  # the other failed run is not of this workflow
    await expect(page.locator('tr.run-row[data-run-id="run-other"]')).to_have_count(0)
    await expect(failed).to_have_text("40")
    assert await page.evaluate("window.__still_here") == "yes"  # the same document: no reload
    await page.screenshot(path=screenshots / "runs-explorer-live-filtered.png", full_page=True)
    assert problems == []  # no CSP violation, no script error

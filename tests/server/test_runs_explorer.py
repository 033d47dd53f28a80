"""The runs explorer (`GET /runs`): filters by status, workflow, queue, version, starter, time
range and id prefix, held in the query string; keyset pages followed by their Next links over
the whole set, each run once; counts by status that link to that status; a view that cannot be
read is the page with what is wrong (400, never a 500); hostile names and ids stay text; a
reviewer sees only the runs of their approvals, and no counts of everyone's runs. Then the page
in headless Chromium with 5,000 runs: filtered and paged with the keyboard alone, a run opened;
each page's server time (the Server-Timing header) is printed, never asserted.

The runs are written by SQL into the test's SQLite file (as bench/console.py does): starting
5,000 runs through App.start would take most of a minute. Their statuses are ones the running
worker leaves alone (finished, held, or running under another worker's live lease), so the
store's counts stay what was written.
"""

from __future__ import annotations

import html
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from playwright.async_api import Page, Response, expect
from tests.server.kit import Person, browser_sign_in, sign_in, start_approval

import tether

pytestmark = pytest.mark.timeout(120)

NOW = time.time()
BASE = NOW - 2 * 86400  # runs are created over the last two days (a second apart, in pairs)
CYCLE = ["succeeded", "succeeded", "failed", "cancelled", "held", "dead", "running", "succeeded"]
FINISHED = {"succeeded", "failed", "cancelled", "dead"}


@dataclass(frozen=True)
class Row:
    id: str
    workflow: str
    status: str
    created_at: float
    queue: str | None = None
    version: str | None = None
    started_by: str | None = None


def spread(n: int, prefix: str = "run") -> list[Row]:
    """n runs over statuses, 4 workflows, 3 queues (half the runs), 5 versions and 6 starters
    (five in six runs); every pair of runs shares its creation time, so pages split ties."""
    return [
        Row(f"{prefix}-{i:05d}", f"wf-{i % 4}", CYCLE[i % len(CYCLE)], BASE + i // 2,
            f"q-{i % 3}" if i % 2 else None, f"v{i % 5}", f"user-{i % 6}" if i % 6 else None)
        for i in range(n)
    ]  # fmt: skip


def insert(app: tether.App, rows: Iterable[Row]) -> None:
    """Write runs straight into the App's SQLite file, in one transaction."""
    path = app.engine.store.url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path, isolation_level=None, timeout=10)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO tether_runs (id, workflow, status, args, epoch, created_at, updated_at,"
            " finished_at, owner, lease_expires_at, queue, version, started_by)"
            " VALUES (?, ?, ?, '{}', 1, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (r.id, r.workflow, r.status, r.created_at, r.created_at,
                 r.created_at + 1 if r.status in FINISHED else None,
                 "elsewhere" if r.status == "running" else None,
                 NOW + 86400 if r.status == "running" else None,  # a lease that holds
                 r.queue, r.version, r.started_by)
                for r in rows
            ],
        )  # fmt: skip
        conn.execute("COMMIT")
    finally:
        conn.close()


def newest_first(rows: Iterable[Row]) -> list[str]:
    return [r.id for r in sorted(rows, key=lambda r: (r.created_at, r.id), reverse=True)]


def shown_ids(text: str) -> list[str]:
    rows = re.findall(r'<tr class="run-row" data-run-id="([^"]*)"', text)
    return [html.unescape(i) for i in rows]


def link(text: str, rel: str) -> str | None:
    found = re.search(rf'<a href="([^"]*)" rel="{rel}">', text)
    return None if found is None else html.unescape(found.group(1))


async def walk(client: httpx.AsyncClient, url: str) -> tuple[list[str], list[str]]:
    """Every run id of a view, following Next links from `url`; and the pages' addresses."""
    ids: list[str] = []
    urls: list[str] = []
    target: str | None = url
    while target is not None:
        urls.append(target)
        response = await client.get(target)
        assert response.status_code == 200, response.text
        ids += shown_ids(response.text)
        target = link(response.text, "next")
        assert len(urls) < 100, "the pages never end"
    return ids, urls


# -- over HTTP ------------------------------------------------------------------------------------


async def test_next_links_walk_every_run_once_newest_first_and_first_page_goes_back(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    rows = spread(237)
    insert(app, rows)
    await sign_in(client, admin)
    ids, urls = await walk(client, "/runs")
    assert ids == newest_first(rows)  # each run once, in order, ties split across pages too
    assert len(urls) == 5  # 50 a page by default: 50, 50, 50, 50, 37
    later = await client.get(urls[2])
    assert link(later.text, "first") == "/runs"
    assert link((await client.get("/runs")).text, "first") is None
    small, _ = await walk(client, "/runs?limit=7")
    assert small == ids
    assert 'aria-label="Pages of runs"' in later.text


async def test_each_filter_selects_its_runs_and_the_next_links_keep_the_filters(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    rows = spread(300)
    insert(app, rows)
    await sign_in(client, admin)
    since = datetime.fromtimestamp(BASE + 40, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    until = datetime.fromtimestamp(BASE + 100, UTC).strftime("%Y-%m-%dT%H:%M")  # as the picker
    since_at, until_at = (datetime.fromisoformat(t).replace(tzinfo=UTC).timestamp()
                          for t in (since, until))  # fmt: skip
    cases = {
        "status=failed&status=dead": lambda r: r.status in ("failed", "dead"),
        "workflow=wf-1": lambda r: r.workflow == "wf-1",
        "queue=q-2": lambda r: r.queue == "q-2",
        "version=v3": lambda r: r.version == "v3",
        "started_by=user-5": lambda r: r.started_by == "user-5",
        f"since={since}&until={until}": lambda r: since_at <= r.created_at < until_at,
        "q=run-0012": lambda r: r.id.startswith("run-0012"),
        "status=succeeded&workflow=wf-3&version=v0": lambda r: (
            r.status, r.workflow, r.version) == ("succeeded", "wf-3", "v0"),
        "workflow=&queue=&q=": lambda r: True,  # empty fields of the form: any
    }  # fmt: skip
    for query, wanted in cases.items():
        expected = newest_first(r for r in rows if wanted(r))
        assert expected, query
        ids, urls = await walk(client, f"/runs?{query}&limit=9")
        assert ids == expected, query
        given = {k: v for k, v in parse_qs(query).items() if v != [""]}
        for url in urls[1:]:  # every Next link carries the view and a cursor
            carried = parse_qs(urlsplit(url).query)
            assert {k: v for k, v in carried.items() if k in given} == given, (query, url)
            assert carried["limit"] == ["9"]
            assert len(carried["cursor"]) == 1
    shown = await client.get("/runs?status=held&workflow=wf-3&queue=q-1&started_by=user-1&q=run")
    assert re.search(r'value="held" id="status-held" checked', shown.text)  # the form shows it
    assert not re.search(r'value="failed" id="status-failed" checked', shown.text)
    for name, value in (("workflow", "wf-3"), ("queue", "q-1"), ("started_by", "user-1"),
                        ("q", "run")):  # fmt: skip
        assert re.search(rf'name="{name}"[^>]* value="{value}"', shown.text), name
    assert "Times are in UTC" in shown.text


async def test_the_counts_by_status_are_the_stores_and_link_to_that_status(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    rows = spread(180)
    insert(app, rows)
    await sign_in(client, admin)
    shown = await client.get("/runs?workflow=wf-1&status=dead")
    counted = Counter(r.status for r in rows)
    region = shown.text.split('id="runs-counts"')[1].split("</section>")[0]
    for status in [s.value for s in tether.RunStatus]:
        entry = re.search(
            rf'<a href="([^"]*)"[^>]*><span class="badge badge-{status}">{status}</span> '
            rf'<span class="count">([\d,]+)</span></a>',
            region,
        )
        assert entry is not None, status
        assert int(entry.group(2).replace(",", "")) == counted.get(status, 0), status
        # The link keeps the other filters and shows that status alone, from the first page.
        assert parse_qs(urlsplit(html.unescape(entry.group(1))).query) == {
            "status": [status], "workflow": ["wf-1"]}  # fmt: skip
    failed = await client.get("/runs?status=failed&limit=200")
    assert shown_ids(failed.text) == newest_first(r for r in rows if r.status == "failed")


async def test_a_view_that_cannot_be_read_is_the_page_with_what_is_wrong(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    insert(app, spread(20))
    await sign_in(client, admin)
    cases = {
        "status=bogus": "Status &#39;bogus&#39; is not one of",
        "since=yesterday": "since &#39;yesterday&#39; is not a date and time",
        "until=2026-13-40T99:99": "until &#39;2026-13-40T99:99&#39; is not a date and time",
        "since=2026-05-02T10:00&until=2026-05-01T10:00": "since must be earlier than until",
        "limit=0": "limit &#39;0&#39; is not a whole number from 1 to 200",
        "limit=abc": "limit &#39;abc&#39; is not a whole number",
        "limit=201": "from 1 to 200",
        "cursor=not-a-cursor": "The cursor in this address is not one this page made",
        "cursor=" + "x" * 3000: "The cursor is too long",
        "workflow=" + "w" * 201: "workflow is 201 characters long; at most 200 are",
        "workflow=a&workflow=b": "Give workflow once",
    }
    for query, message in cases.items():
        response = await client.get(f"/runs?{query}")
        assert response.status_code == 400, query
        assert 'role="alert"' in response.text, query
        assert message in response.text, query
        assert 'id="runs-filter"' in response.text  # the form is there to fix the view
        assert shown_ids(response.text) == [], query
    # Unknown parameters are not errors (links from elsewhere may carry some).
    assert (await client.get("/runs?utm_source=mail")).status_code == 200


async def test_hostile_workflow_names_ids_and_filters_stay_text(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    evil_id = '"><script>alert(1)</script>&x=\u202e'
    evil_workflow = "<img src=x onerror=alert(1)>&amp;"
    insert(app, [Row(evil_id, evil_workflow, "failed", BASE, "<b>q</b>", "v'1", "<i>me</i>")])
    await sign_in(client, admin)
    shown = await client.get("/runs")
    for raw in ("<script>alert(1)", "<img src=x", "<b>q</b>", "<i>me</i>"):
        assert raw not in shown.text
    assert "&lt;img src=x onerror=alert(1)&gt;&amp;amp;" in shown.text
    # The id's bidi override is spelled out in the text, and percent-encoded in the link.
    assert '<span class="hidden-char">&lt;U+202E&gt;</span>' in shown.text
    assert (
        'href="/runs/%22%3E%3Cscript%3Ealert%281%29%3C%2Fscript%3E%26x%3D%E2%80%AE"' in shown.text
    )
    # Filtering by the hostile name finds the run, and the form shows the value as it was.
    found = await client.get("/runs", params={"workflow": evil_workflow, "q": '"><script>'})
    assert found.status_code == 200
    assert len(shown_ids(found.text)) == 1
    assert 'value="&lt;img src=x onerror=alert(1)&gt;&amp;amp;"' in found.text
    assert 'value="&#34;&gt;&lt;script&gt;"' in found.text
    # A view naming it carries it, encoded, in its links.
    counts = await client.get("/runs", params={"workflow": "a&b#c=d"})
    assert 'href="/runs?status=failed&amp;workflow=a%26b%23c%3Dd"' in counts.text


async def test_a_reviewer_explores_only_the_runs_of_their_approvals_without_counts(
    app: tether.App, client: httpx.AsyncClient, alice: Person
) -> None:
    await start_approval(app, "run-mine")
    await start_approval(app, "run-theirs", reviewers=["group:finance"])
    insert(app, spread(120))
    await sign_in(client, alice)
    shown = await client.get("/runs")
    assert shown.status_code == 200
    assert shown_ids(shown.text) == ["run-mine"]
    assert 'class="counts"' not in shown.text  # everyone's counts are not a reviewer's to see
    status = (await (await app.get("run-mine")).info()).status  # it waits for the decision
    found = await client.get(f"/runs?workflow=ask&status={status}&status=dead")
    assert shown_ids(found.text) == ["run-mine"]
    assert shown_ids((await client.get("/runs?workflow=wf-0")).text) == []
    assert shown_ids((await client.get("/runs?q=run-the")).text) == []
    assert "No runs match these filters" in (await client.get("/runs?q=run-the")).text


# -- in a browser -----------------------------------------------------------------------------


async def test_in_a_browser_5000_runs_are_filtered_and_paged_with_the_keyboard(
    app: tether.App, page: Page, admin: Person, problems: list[str], screenshots: Path
) -> None:
    rows = spread(5000)
    insert(app, rows)
    timings: list[tuple[str, float, float]] = []

    def timed(response: Response) -> None:
        if urlsplit(response.url).path == "/runs" and response.request.resource_type == "document":
            given = response.headers.get("server-timing", "")
            found = re.fullmatch(r"runs;dur=([\d.]+), query;dur=([\d.]+)", given)
            if found is not None:  # counted below: every page of the explorer has one
                query = urlsplit(response.url).query or "(first page)"
                timings.append((query, float(found[1]), float(found[2])))

    page.on("response", timed)
    await browser_sign_in(page, admin)
    await page.goto("/runs")
    await expect(page.locator("tr.run-row")).to_have_count(50)
    await expect(page.locator("tr.run-row").first).to_have_attribute("data-run-id", "run-04999")
    await page.screenshot(path=screenshots / "runs-explorer-first.png", full_page=True)

    # The keyboard alone: Space ticks "failed", Tab reaches the workflow field, Enter submits.
    await page.get_by_label("failed", exact=True).focus()
    await page.keyboard.press("Space")
    await expect(page.get_by_label("failed", exact=True)).to_be_checked()
    for _ in range(12):
        if await page.evaluate("document.activeElement.id") == "f-workflow":
            break
        await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement.id") == "f-workflow"
    await page.keyboard.type("wf-2")
    async with page.expect_navigation():
        await page.keyboard.press("Enter")
    # The address holds the view, without the fields left empty.
    assert urlsplit(page.url).query == "status=failed&workflow=wf-2"
    expected = newest_first(r for r in rows if r.status == "failed" and r.workflow == "wf-2")
    assert len(expected) == 625
    seen: list[str] = []
    for number in range(1, 100):
        seen += await page.locator("tr.run-row").evaluate_all("rs => rs.map(r => r.dataset.runId)")
        if number == 2:
            await page.screenshot(
                path=screenshots / "runs-explorer-filtered-page-2.png", full_page=True
            )
        following = page.locator("a[rel=next]")
        if not await following.count():
            break
        await following.focus()
        async with page.expect_navigation():
            await page.keyboard.press("Enter")
        carried = parse_qs(urlsplit(page.url).query)
        assert (carried["status"], carried["workflow"]) == (["failed"], ["wf-2"])
        assert len(carried["cursor"]) == 1
    assert seen == expected
    assert number == 13  # 625 runs, 50 a page
    await page.locator("a[rel=first]").focus()
    async with page.expect_navigation():
        await page.keyboard.press("Enter")
    assert urlsplit(page.url).query == "status=failed&workflow=wf-2"

    # The count of a status is a link to it (the other filters kept).
    async with page.expect_navigation():
        await page.locator("#runs-counts a", has_text="running").click()
    assert urlsplit(page.url).query == "status=running&workflow=wf-2"
    await expect(page.locator("tr.run-row .badge-running")).to_have_count(50)

    # Open a run from the list, by the keyboard.
    first = page.locator("tr.run-row a").first
    run_id = await page.locator("tr.run-row").first.get_attribute("data-run-id")
    await first.focus()
    async with page.expect_navigation():
        await page.keyboard.press("Enter")
    assert urlsplit(page.url).path == f"/runs/{run_id}"
    await expect(page.locator("body")).to_contain_text(str(run_id))
    await page.screenshot(path=screenshots / "runs-explorer-opened-run.png", full_page=True)

    for query, whole, queries in timings:  # printed, never asserted
        print(f"runs explorer, 5,000 runs: {whole:6.2f} ms on the server, {queries:5.2f} ms of "
              f"it listing and counting; {query[:70]}")  # fmt: skip
    assert len(timings) >= 16
    assert problems == []  # no CSP violation, no script error

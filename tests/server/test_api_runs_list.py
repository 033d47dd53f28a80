"""GET /api/runs, the runs explorer's listing, against a real SQLite file: every filter as a query
parameter, pages walked by the Link header (and X-Next-Cursor) with the filters kept, 422s that
say what was wrong, a reviewer seeing only the runs of their approvals page by page, the
OpenAPI document declaring the item model and the page headers; and a run's steps carrying the
times a timeline is drawn from."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from tests.server.kit import Person, start_approval

import tether
from tether.store.port import NewRun

NOW = 1_750_000_000.0  # 2025-06-15T15:06:40Z
RUN_KEYS = {"id", "workflow", "status", "attempt", "failures", "owner", "created_at",
            "updated_at", "finished_at", "error_type", "error_message", "forked_from",
            "diverged_at"}  # fmt: skip


@pytest.fixture(autouse=True)
def keep_unserved_runs(app: tether.App) -> None:
    """The runs made here are of workflows no worker serves, created in the past: the worker
    would dead-letter them (settings.unserved_grace), changing their status mid-test."""
    app.engine.settings = dataclasses.replace(app.engine.settings, unserved_grace=None)


def bearer(person: Person) -> dict[str, str]:
    return {"Authorization": f"Bearer {person.token}"}


async def make(
    app: tether.App,
    run_id: str,
    at: float,
    *,
    workflow: str = "listed",  # no worker serves it: the run stays as made
    queue: str | None = None,
    started_by: str | None = None,
    version: str | None = None,
) -> None:
    run = NewRun(run_id, workflow, '{"args": [], "kwargs": {}}', queue=queue,
                 started_by=started_by)  # fmt: skip
    if version is None:
        await app.engine.store.create_run(run, at)
    else:  # created claimed by a worker of that version, as a first claim pins it
        await app.engine.store.create_run(run, at, owner="w-gone", lease_until=at + 60,
                                          version=version)  # fmt: skip


async def listed(client: httpx.AsyncClient, person: Person, query: str) -> list[str]:
    response = await client.get(f"/api/runs?{query}", headers=bearer(person))
    assert response.status_code == 200, response.text
    return [run["id"] for run in response.json()]


async def walk(client: httpx.AsyncClient, person: Person, url: str) -> list[httpx.Response]:
    """Every page from `url` on, following each Link rel="next"."""
    pages = []
    next_url: str | None = url
    while next_url is not None:
        response = await client.get(next_url, headers=bearer(person))
        assert response.status_code == 200, response.text
        pages.append(response)
        link = response.headers.get("link")
        next_url = None
        if link is not None:
            found = re.fullmatch(r'<([^>]+)>; rel="next"', link)
            assert found, link
            next_url = found.group(1)
            assert f"cursor={response.headers['x-next-cursor']}" in next_url
        else:
            assert "x-next-cursor" not in response.headers
        assert len(pages) < 20, "the pages do not end"
    return pages


async def test_runs_list_filters_by_each_query_parameter(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    await make(app, "m1", NOW, queue="mail", started_by="alice")
    await make(app, "m2", NOW + 60, queue="mail", started_by="bob", version="v1")
    await make(app, "b1", NOW + 120, workflow="other", queue="batch", version="v2")
    await make(app, "b2", NOW + 180, started_by="alice", version="v1")
    assert await listed(client, admin, "") == ["b2", "b1", "m2", "m1"]
    assert await listed(client, admin, "status=pending") == ["m1"]
    assert await listed(client, admin, "status=pending&status=running") == [
        "b2", "b1", "m2", "m1",
    ]  # fmt: skip
    assert await listed(client, admin, "status=running&status=failed") == ["b2", "b1", "m2"]
    assert await listed(client, admin, "workflow=other") == ["b1"]
    assert await listed(client, admin, "queue=mail") == ["m2", "m1"]
    assert await listed(client, admin, "version=v1") == ["b2", "m2"]
    assert await listed(client, admin, "started_by=alice") == ["b2", "m1"]
    # since is inclusive, until exclusive; a time without a zone is UTC.
    assert await listed(client, admin, "since=2025-06-15T15:07:40Z") == ["b2", "b1", "m2"]
    assert await listed(client, admin, "until=2025-06-15T15:08:40%2B00:00") == ["m2", "m1"]
    window = "since=2025-06-15T17:07:40%2B02:00&until=2025-06-15T15:09:40"
    assert await listed(client, admin, window) == ["b1", "m2"]
    assert await listed(client, admin, "q=m") == ["m2", "m1"]
    assert await listed(client, admin, "q=b1") == ["b1"]
    assert await listed(client, admin, "q=%25") == []  # a literal %, no wildcard
    assert await listed(client, admin, "queue=mail&started_by=bob&status=running") == ["m2"]
    assert await listed(client, admin, "limit=1") == ["b2"]
    response = await client.get("/api/runs", headers=bearer(admin))
    assert all(set(run) == RUN_KEYS for run in response.json())  # the items as before


async def test_runs_list_pages_are_walked_by_the_link_header_with_the_filters_kept(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    names = [f"r{i}" for i in range(8)]
    for i, run_id in enumerate(names):  # pairs at one time: ties on created_at
        await make(app, run_id, NOW + i // 2, queue="q" if i != 7 else None)
    await make(app, "elsewhere", NOW + 1, workflow="other", queue="q")
    pages = await walk(client, admin, "/api/runs?workflow=listed&queue=q&limit=3")
    shown = [[run["id"] for run in page.json()] for page in pages]
    assert shown == [["r6", "r5", "r4"], ["r3", "r2", "r1"], ["r0"]]
    assert all("workflow=listed" in p.headers["link"] for p in pages[:-1])
    # A page that ends exactly at the last run has no next one.
    whole = await walk(client, admin, "/api/runs?queue=q&workflow=listed&limit=7")
    assert [len(p.json()) for p in whole] == [7]
    # The cursor alone, as X-Next-Cursor gives it, continues the same listing.
    cursor = pages[0].headers["x-next-cursor"]
    assert await listed(client, admin, f"workflow=listed&queue=q&limit=3&cursor={cursor}") == [
        "r3", "r2", "r1",
    ]  # fmt: skip


async def test_runs_list_refuses_invalid_parameters_with_a_422_that_says_why(
    client: httpx.AsyncClient, admin: Person
) -> None:
    for query, says in (
        ("status=done", "status"), ("limit=0", "limit"), ("limit=1001", "limit"),
        ("since=yesterday", "since"), ("until=2025-13-01T00:00:00Z", "until"),
        ("cursor=not-a-cursor", "invalid cursor"),
        ("cursor=WzEsMiwzXQ", "invalid cursor"),  # base64url of [1,2,3]
        ("cursor=WyJ4IiwiaWQiXQ", "invalid cursor"),  # ["x","id"]: no time
        ("cursor=W051TGwsImlkIl0", "invalid cursor"),  # [NuLl,"id"]: not JSON
        ("q=" + "x" * 513, '"q"'),
    ):  # fmt: skip
        response = await client.get(f"/api/runs?{query}", headers=bearer(admin))
        assert response.status_code == 422, (query, response.text)
        assert says in response.text, (query, response.text)


async def test_a_reviewer_lists_only_the_runs_of_their_approvals_page_by_page(
    app: tether.App, client: httpx.AsyncClient, alice: Person, outsider: Person, admin: Person
) -> None:
    later = time.time() + 3600
    for i in range(5):  # others' runs, newer and older than alice's
        await make(app, f"newer-{i}", later + i)
        await make(app, f"older-{i}", NOW + i)
    for run_id in ("mine-1", "mine-2", "mine-3"):
        await start_approval(app, run_id, reviewers=["alice"])
    pages = await walk(client, alice, "/api/runs?limit=2")
    assert [[run["id"] for run in page.json()] for page in pages] == [
        ["mine-3", "mine-2"], ["mine-1"],
    ]  # fmt: skip
    assert await listed(client, alice, "q=mine-2") == ["mine-2"]
    assert await listed(client, alice, "q=newer") == []  # not hers, though they exist
    assert await listed(client, alice, "status=pending") == []  # hers are waiting
    assert await listed(client, outsider, "") == []
    assert len(await listed(client, admin, "limit=1000")) == 13


async def test_the_openapi_document_declares_the_run_items_and_the_page_headers(
    client: httpx.AsyncClient,
) -> None:
    document = (await client.get("/openapi.json")).json()
    operation = document["paths"]["/api/runs"]["get"]
    ok = operation["responses"]["200"]
    assert set(ok["headers"]) == {"Link", "X-Next-Cursor"}
    items = ok["content"]["application/json"]["schema"]["items"]
    assert items == {"$ref": "#/components/schemas/RunOut"}
    params = {p["name"]: p for p in operation["parameters"]}
    assert {"status", "workflow", "queue", "version", "started_by", "since", "until", "q",
            "limit", "cursor"} <= set(params)  # fmt: skip
    assert params["status"]["schema"]["anyOf"][0]["type"] == "array"  # repeatable


async def test_a_runs_steps_carry_their_start_and_end_times_in_utc(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    await start_approval(app, "timed", reviewers=["alice"])
    async with asyncio.timeout(10):
        while True:
            detail = (await client.get("/api/runs/timed", headers=bearer(admin))).json()
            if detail["steps"] and detail["steps"][0]["finished_at"]:
                break
            await asyncio.sleep(0.02)
    prepare = detail["steps"][0]
    assert prepare["name"] == "prepare"
    started = datetime.fromisoformat(prepare["started_at"])
    finished = datetime.fromisoformat(prepare["finished_at"])
    assert started.utcoffset() == finished.utcoffset() == timedelta(0)
    assert before <= started <= finished <= datetime.now(UTC)
    assert prepare["retry_at"] is None
    shown = (finished - started).total_seconds() * 1000  # datetimes: to the microsecond
    assert abs(prepare["duration_ms"] - shown) < 0.01


async def test_the_app_lists_pages_by_each_runs_cursor_and_refuses_what_it_cannot_read(
    app: tether.App,
) -> None:
    for i in range(5):
        await make(app, f"r{i}", NOW + i // 2, started_by="carol" if i % 2 else None)
    first = await app.list_runs(workflow="listed", limit=2)
    assert [r.id for r in first] == ["r4", "r3"]
    second = await app.list_runs(workflow="listed", limit=2, cursor=first[-1].cursor)
    assert [r.id for r in second] == ["r2", "r1"]
    assert [r.id for r in await app.list_runs(started_by="carol", id_prefix="r")] == ["r3", "r1"]
    since = datetime.fromtimestamp(NOW + 1, UTC)
    assert [r.id for r in await app.list_runs(since=since, until=since + timedelta(1))] == [
        "r4", "r3", "r2",
    ]  # fmt: skip
    with pytest.raises(tether.ConfigurationError, match="no time zone"):
        await app.list_runs(since=datetime(2025, 1, 1))
    with pytest.raises(tether.ConfigurationError, match="invalid cursor"):
        await app.list_runs(cursor="r4")

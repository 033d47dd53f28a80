"""What the operations pages show, over the JSON API and live: GET /api/workers, /api/queues,
/api/schedules and /api/outbox and POST /api/outbox/{id}/retry against the App of ops_kit.py on
a SQLite file and on PostgreSQL, their content checked against what was set up (a message in
each section of the outbox, a queue no limit is set for); 401 without a token and 403 for a
reviewer; hostile text served as data with its secrets redacted; and the pages' /live streams:
a new state when a message fails or a worker appears or goes stale, none for a heartbeat, and
`gone` once the admin is no longer one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from tests.postgres_server import with_schema
from tests.server.kit import SECRET, LiveServer, Person, events, sign_in
from tests.server.ops_kit import (
    DESTINATION,
    HOSTILE,
    QUEUE,
    REFUSAL,
    SCHEDULE,
    Setup,
    more_messages,
    ops_app,
    until,
)

import tether
from tether.actions import list_actions
from tether.clock import to_datetime
from tether.core.workflow import Named
from tether.server import create_server, live
from tether.server.live import Scope, Watch
from tether.store.port import WorkerInfo

pytestmark = pytest.mark.timeout(90)

ROUTES = [("GET", "/api/workers"), ("GET", "/api/queues"), ("GET", "/api/schedules"),
          ("GET", "/api/outbox")]  # fmt: skip
SECTIONS = ("failed", "in-doubt", "sending", "pending")
SQLITE = pytest.mark.parametrize("url", ["sqlite"], indirect=True)  # one backend is enough


@pytest.fixture
def setup() -> Setup:
    return Setup()


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        base = request.getfixturevalue("postgres_url")
        return with_schema(base, f"t_{uuid.uuid4().hex[:12]}")
    return f"sqlite:///{tmp_path}/ops.db"


@pytest.fixture
async def app(url: str, setup: Setup) -> AsyncIterator[tether.App]:
    async with ops_app(url, setup) as built:
        yield built


@pytest.fixture
def server(app: tether.App) -> FastAPI:
    return create_server(app, secret=SECRET)


def bearer(person: Person) -> dict[str, str]:
    return {"Authorization": f"Bearer {person.token}"}


async def get(client: httpx.AsyncClient, path: str, person: Person) -> Any:
    response = await client.get(path, headers=bearer(person))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json()


def moment(text: str) -> datetime:
    """An API time: ISO 8601 with the UTC offset."""
    found = datetime.fromisoformat(text)
    assert found.utcoffset() == timedelta(0), text
    assert text.endswith("+00:00"), text
    return found


def retry_path(message_id: str) -> str:
    return f"/api/outbox/{httpx.URL(message_id).raw_path.decode()}/retry"


# -- content --------------------------------------------------------------------------------------


async def test_the_workers_route_gives_each_worker_its_heartbeat_and_the_runs_it_holds(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    body = await get(client, "/api/workers", admin)
    (worker,) = await app.engine.store.list_workers()
    assert (body["lease_seconds"], body["partial"]) == (15.0, False)
    (shown,) = body["workers"]
    assert {k: v for k, v in shown.items() if k not in ("started_at", "heartbeat_at",
                                                        "silent_seconds")} == {
        "id": app.worker_id, "host": worker.host, "pid": os.getpid(), "version": worker.version,
        "workflows": ["hold", "notify", "send_to", "tick", "typed"], "stale": False,
        "runs": 1,  # hold-1
    }  # fmt: skip
    assert moment(shown["started_at"]) == to_datetime(worker.started_at)
    # Heartbeats go on meanwhile: within a lease of the one stored now.
    assert abs(moment(shown["heartbeat_at"]).timestamp() - worker.heartbeat_at) < 15
    assert 0 <= shown["silent_seconds"] < 15


async def test_the_queues_route_gives_limits_runs_due_and_running_then_queues_without_limits(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    # A run on a queue this App sets nothing for, of a workflow no worker here serves: due.
    await app.start(Named("elsewhere_flow", queue="elsewhere"), id="elsewhere-1")
    body = await get(client, "/api/queues", admin)
    assert body == {"partial": False, "queues": [
        {"name": QUEUE, "limits": {"concurrency": 3, "worker_concurrency": 2, "rate": 2,
                                   "period_seconds": 3600.0},
         "due": 2, "running": 1, "workflows": ["hold", "notify"]},  # notify-2, -3; hold-1
        {"name": "elsewhere", "limits": None, "due": 1, "running": 0, "workflows": []},
    ]}  # fmt: skip


async def test_the_schedules_route_gives_the_next_slots_and_the_latest_runs(
    app: tether.App, setup: Setup, client: httpx.AsyncClient, admin: Person
) -> None:
    (shown,) = (await get(client, "/api/schedules", admin))["schedules"]
    (info,) = await app.list_schedules()
    assert {k: shown[k] for k in ("name", "workflow", "cron", "tz", "catch_up", "defined",
                                  "registered")} == {
        "name": SCHEDULE, "workflow": "tick", "cron": "* * * * *", "tz": "UTC",
        "catch_up": "latest", "defined": True, "registered": True,
    }  # fmt: skip
    slots = [moment(s) for s in shown["next_slots"]]
    assert info.next_slot is not None
    # Read a moment apart: the next minute may have come between the two reads.
    assert slots[0] in (info.next_slot, info.next_slot - timedelta(minutes=1))
    assert [b - a for a, b in itertools.pairwise(slots)] == [timedelta(minutes=1)] * 2
    assert slots[0].second == 0
    assert moment(shown["last_slot"]) < slots[0]
    (run,) = [r for r in shown["runs"] if r["id"] == setup.slot_run]
    assert setup.slot_run.startswith(f"schedule:{SCHEDULE}:")
    assert run["status"] == "succeeded"
    assert moment(run["finished_at"]) >= moment(run["created_at"])
    assert all(r["id"].startswith(f"schedule:{SCHEDULE}:") for r in shown["runs"])


async def test_the_outbox_route_lists_each_status_redacted_as_the_page_groups_them(
    app: tether.App, setup: Setup, client: httpx.AsyncClient, admin: Person
) -> None:
    ids = await more_messages(app, setup)
    everything = await get(client, "/api/outbox", admin)
    assert [m["id"] for m in everything] == [setup.message_id, ids["in-doubt"], ids["sending"],
                                             ids["pending"]]  # oldest first  # fmt: skip
    (failed,) = await get(client, "/api/outbox?status=failed", admin)
    (stored,) = await app.list_outbox(status="failed")
    assert {k: v for k, v in failed.items() if not k.endswith("_at")} == {
        "id": setup.message_id, "run_id": "notify-1", "checkpoint": stored.checkpoint,
        "destination": "https://ops:[redacted]@hooks.example/in", "status": "failed",
        "attempts": 1, "uncertain": 0, "in_doubt": False,
        "error_type": "tether.errors.PermanentError",
        "error_message": f"{HOSTILE} refused the message\nsecond line: password=[redacted]",
    }  # fmt: skip
    assert failed["delivered_at"] is None
    assert moment(failed["updated_at"]) >= moment(failed["created_at"])

    doubtful, sending = await get(client, "/api/outbox?status=sending", admin)
    # Two sends of unknown outcome: the first claim's (taken over), the vanished claimer's.
    assert (doubtful["id"], doubtful["in_doubt"], doubtful["uncertain"]) == (ids["in-doubt"],
                                                                            True, 2)  # fmt: skip
    assert (sending["id"], sending["in_doubt"], sending["uncertain"]) == (ids["sending"],
                                                                         False, 0)  # fmt: skip
    assert (doubtful["destination"], doubtful["error_type"]) == ("hangs", None)
    (pending,) = await get(client, "/api/outbox?status=pending", admin)
    assert (pending["id"], pending["attempts"], pending["error_type"]) == (
        ids["pending"], 1, "RuntimeError")  # fmt: skip
    assert pending["error_message"] == "the receiver is down for maintenance"
    due = moment(pending["next_at"]).timestamp() - app.engine.clock.now()
    assert 30 * 60 < due <= 3600  # the retry policy's hour, less its jitter

    mine = await get(client, "/api/outbox?run_id=sending-1", admin)
    assert [m["id"] for m in mine] == [ids["sending"]]
    assert len(await get(client, "/api/outbox?limit=2", admin)) == 2
    for bad in ("status=lost", "limit=0", "limit=1001"):
        refused = await client.get(f"/api/outbox?{bad}", headers=bearer(admin))
        assert refused.status_code == 422, bad

    # The page groups the same messages: one in each section, by the same ids.
    await sign_in(client, admin)
    html = (await client.get("/ops/outbox")).text
    for key, label in zip(SECTIONS, ("Failed", "In doubt", "Sending", "Pending"), strict=True):
        section = re.search(rf'<section id="outbox-{key}".*?</section>', html, re.S)
        assert section, key
        assert f"<caption>{label}: 1</caption>" in section.group(0)
        expected = setup.message_id if key == "failed" else ids[key]
        assert re.findall(r'data-message-id="([^"]+)"', section.group(0)) == [expected]


async def test_retrying_over_the_api_sends_a_failed_message_again_and_refuses_others(
    app: tether.App,
    setup: Setup,
    client: httpx.AsyncClient,
    admin: Person,
    caplog: pytest.LogCaptureFixture,
) -> None:
    (before,) = await app.list_outbox(status="failed")
    setup.sender.refusing = False  # the receiver is fixed
    with caplog.at_level(logging.INFO, logger="tether.server"):
        sent = await client.post(retry_path(setup.message_id), headers=bearer(admin))
    assert sent.status_code == 200, sent.text
    body = sent.json()
    assert (body["id"], body["status"], body["attempts"]) == (setup.message_id, "pending", 0)
    assert body["destination"] == "https://ops:[redacted]@hooks.example/in"
    logged = [r.getMessage() for r in caplog.records if r.name == "tether.server"]
    assert logged == [f"outbox message {setup.message_id} is sent again, asked by root from "
                      f"127.0.0.1 (the JSON API)"]  # fmt: skip

    async def delivered() -> bool:
        return [m.id for m in await app.list_outbox(status="delivered")] == [setup.message_id]

    await until(delivered)
    assert setup.sender.accepted == [before.key]  # the same idempotency key
    again = await client.post(retry_path(setup.message_id), headers=bearer(admin))
    assert again.status_code == 409
    assert "is delivered; only a failed one is sent again" in again.json()["detail"]
    unknown = await client.post(retry_path("tether-msg-nope"), headers=bearer(admin))
    assert unknown.status_code == 409
    assert "no outbox message has id 'tether-msg-nope'" in unknown.json()["detail"]
    assert setup.sender.accepted == [before.key]
    # The trail of actions keeps each, the refused ones with their reasons.
    kept = await list_actions(app, subject=setup.message_id)
    assert [(a.actor, a.via, a.client, a.action, a.outcome) for a in kept] == [
        ("root", "api", "127.0.0.1", "retry", "refused"),
        ("root", "api", "127.0.0.1", "retry", "done"),
    ]
    assert "is delivered; only a failed one is sent again" in kept[0].detail
    [nope] = await list_actions(app, subject="tether-msg-nope")
    assert nope.outcome == "refused"


# -- who may ---------------------------------------------------------------------------------------


@SQLITE
async def test_the_ops_routes_need_a_token_and_group_admin(
    app: tether.App, setup: Setup, client: httpx.AsyncClient, alice: Person
) -> None:
    routes = [*ROUTES, ("POST", retry_path(setup.message_id))]
    for headers in ({}, {"Authorization": "Bearer tt_wrong"}):
        for method, path in routes:
            response = await client.request(method, path, headers=headers)
            assert response.status_code == 401, (method, path, headers)
            assert response.headers["www-authenticate"].startswith('Bearer realm="tether"')
    for method, path in routes:
        response = await client.request(method, path, headers=bearer(alice))
        assert response.status_code == 403, (method, path)
        assert response.json()["detail"].startswith("only group admin may ")
        assert setup.message_id not in response.text
    assert [m.id for m in await app.list_outbox(status="failed")] == [setup.message_id]
    assert setup.sender.accepted == []


@SQLITE
async def test_hostile_text_is_served_as_json_data_with_its_secrets_redacted(
    client: httpx.AsyncClient, admin: Person
) -> None:
    for _, path in ROUTES:
        response = await client.get(path, headers=bearer(admin))
        assert response.headers["content-type"] == "application/json", path
        assert response.headers["x-content-type-options"] == "nosniff"
        assert "hunter2" not in response.text, path
        assert "swordfish" not in response.text, path
    queues = (await get(client, "/api/queues", admin))["queues"]
    assert [q["name"] for q in queues] == [QUEUE]  # the text as it is: data, not markup
    (schedule,) = (await get(client, "/api/schedules", admin))["schedules"]
    assert schedule["name"] == SCHEDULE
    (message,) = await get(client, "/api/outbox", admin)
    assert message["error_message"].splitlines()[0] == REFUSAL.splitlines()[0]


# -- live -----------------------------------------------------------------------------------------


@pytest.fixture
async def browserless(live_server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the live server (real sockets, so server-sent events stream)."""
    async with httpx.AsyncClient(base_url=live_server.url, timeout=10) as made:
        yield made


def rendered_state(html: str) -> str:
    found = re.search(r'<body data-live="([^"]+)" data-state="([0-9a-f]+)" data-page="([^"]+)"',
                      html)  # fmt: skip
    assert found, "the page is not live"
    return found.group(2)


async def next_state(received: AsyncIterator[tuple[str, str]]) -> str:
    async with asyncio.timeout(10):
        while True:
            name, data = await anext(received)
            if name != "comment":
                assert name == "state", (name, data)
                return data


@SQLITE
async def test_the_outbox_pages_stream_sends_a_new_state_when_a_message_fails(
    app: tether.App, browserless: httpx.AsyncClient, admin: Person
) -> None:
    await sign_in(browserless, admin)
    html = (await browserless.get("/ops/outbox")).text
    assert '<body data-live="/live?scope=ops&amp;id=outbox"' in html
    assert 'data-page="/ops/outbox"' in html
    rendered = rendered_state(html)
    async with browserless.stream("GET", "/live?scope=ops&id=outbox") as stream:
        assert stream.status_code == 200
        received = events(stream)
        assert await next_state(received) == rendered
        await app.start("send_to", DESTINATION, id="refused-2")  # refused for good at once
        changed = await next_state(received)
        assert changed != rendered
    html = (await browserless.get("/ops/outbox")).text
    assert rendered_state(html) == changed
    assert "<caption>Failed: 2</caption>" in html


@SQLITE
async def test_the_workers_pages_stream_follows_workers_and_staleness_not_heartbeats(
    app: tether.App, client: httpx.AsyncClient, browserless: httpx.AsyncClient, admin: Person
) -> None:
    store, watch = app.engine.store, Watch(Scope.OPS, "workers")
    first_beat = (await get(client, "/api/workers", admin))["workers"][0]["heartbeat_at"]
    quiet = await live.state(app, admin.user, watch)

    async def beaten() -> bool:
        shown = (await get(client, "/api/workers", admin))["workers"][0]
        return bool(shown["heartbeat_at"] != first_beat)

    await until(beaten)  # what the page shows moved on; its digest did not
    assert await live.state(app, admin.user, watch) == quiet

    await sign_in(browserless, admin)
    rendered = rendered_state((await browserless.get("/ops/workers")).text)
    now = app.engine.clock.now()
    late = WorkerInfo("w-late", "elsewhere.example", 4242, "token", started_at=now,
                      workflows=("tick",), version="v2")  # fmt: skip
    async with browserless.stream("GET", "/live?scope=ops&id=workers") as stream:
        received = events(stream)
        assert await next_state(received) == rendered
        await store.register_worker(late, now)
        appeared = await next_state(received)
        assert appeared != rendered
        await store.register_worker(late, now - 16)  # its last heartbeat older than the lease
        stale = await next_state(received)
        assert stale not in (rendered, appeared)
    html = (await browserless.get("/ops/workers")).text
    assert rendered_state(html) == stale
    row = re.search(r'<tr class="worker-row" data-worker-id="w-late">.*?</tr>', html, re.S)
    assert row
    silent = re.search(r'<span class="badge badge-dead">(\d+) s ago</span>', row.group(0))
    assert silent
    assert int(silent.group(1)) >= 16
    shown = {w["id"]: w for w in (await get(client, "/api/workers", admin))["workers"]}
    assert (shown["w-late"]["stale"], shown[app.worker_id]["stale"]) == (True, False)


@SQLITE
@pytest.mark.parametrize(
    ("query", "status"),
    [("scope=ops&id=workers", 403), ("scope=ops&id=outbox", 403)],
)
async def test_an_ops_pages_stream_refuses_a_reviewer(
    client: httpx.AsyncClient, alice: Person, query: str, status: int
) -> None:
    assert (await client.get(f"/live?{query}")).status_code == 401  # not signed in
    await sign_in(client, alice)
    refused = await client.get(f"/live?{query}")
    assert refused.status_code == status
    assert refused.text == "the operations pages are for group admin"


@SQLITE
async def test_an_ops_pages_stream_ends_with_gone_once_the_admin_is_no_longer_one(
    app: tether.App, client: httpx.AsyncClient, browserless: httpx.AsyncClient, admin: Person
) -> None:
    await sign_in(client, admin)
    for query, status in (("scope=ops", 400), ("scope=ops&id=nope", 404)):
        assert (await client.get(f"/live?{query}")).status_code == status, query
    await sign_in(browserless, admin)
    async with browserless.stream("GET", "/live?scope=ops&id=queues") as stream:
        received = events(stream)
        await next_state(received)
        record = await app.engine.store.get_user("root")
        assert record is not None
        await app.engine.store.put_user(replace(record, groups=("sre",)))
        async with asyncio.timeout(10):
            name, data = await anext(received)
            while name == "comment":
                name, data = await anext(received)
        assert (name, data) == ("gone", "this page is no longer visible to you")
    assert (await client.get("/ops/queues")).status_code == 403

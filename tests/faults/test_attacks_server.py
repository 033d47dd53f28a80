"""Attacks on the server's sessions, sign-in, Host and stream offsets, and hostile text in the
inbox (issue 17 items 4, 9, 10 and the server parts of 11), each from the attacker's side.

Families: `sessions` (a captured cookie and CSRF token after sign-out, revocation, idle and
absolute expiry, open streams of an ended session or a revoked token, what the cookie holds),
`session secret` (a short TETHER_SESSION_SECRET), `throttle` (guessing tokens at the sign-in
form and the API), `host` (a DNS-rebinding Host making a cross-site form "same origin"),
`offsets` (Last-Event-ID and ?offset= that are not offsets), `inbox text` (bidi, zero-width and
control characters in everything an approval and a run show) and `channel` (decisions and
looks recorded with where they came from).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from click.testing import CliRunner
from fastapi import FastAPI
from tests.faults.attack_kit import (
    attack,
    build_target,
    db_path,
    live_markup,
    raw_request,
    snapshot,
    sse_events,
    tamper,
    trail,
)
from tests.server.kit import ORIGIN, SECRET, Person, csrf_of, serving, sign_in, start_approval

import tether
from tether.cli import cli
from tether.errors import ConfigurationError
from tether.server import create_server, sse
from tether.server.auth import SESSION_COOKIE, session_secret
from tether.users import add_user, revoke_user

pytestmark = pytest.mark.timeout(30)

SAME = {"Origin": ORIGIN}
# Each character class that must never reach a page raw: bidi override, isolate, mark, Arabic
# letter mark, zero-width space, joiner, word joiner, BOM, ESC, BEL, C1 CSI.
HIDDEN = "\u202e\u2066\u200f\u061c\u200b\u200d\u2060\ufeff\x1b\x07\x9b"
RAW = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]"
)


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[tether.App]:
    built = build_target(f"sqlite:///{tmp_path}/attacks.db")
    async with built:
        yield built


@pytest.fixture
async def alice(app: tether.App) -> Person:
    user, token = await add_user(app.engine, "alice", frozenset({"sre"}))
    return Person(user, token)


@pytest.fixture
def server(app: tether.App) -> FastAPI:
    made: FastAPI = create_server(app, secret=SECRET)
    return made


def browser(server: FastAPI, client: tuple[str, int] = ("127.0.0.1", 123)) -> httpx.AsyncClient:
    """One person's browser on `server` over ASGI, from the address `client`."""
    transport = httpx.ASGITransport(app=server, client=client)
    return httpx.AsyncClient(transport=transport, base_url=ORIGIN)


async def ask(app: tether.App, run_id: str, **fields: Any) -> tether.Approval:
    found = await start_approval(app, run_id, **fields)
    handle = await app.get(run_id)
    async with asyncio.timeout(10):
        while await handle.status() is not tether.RunStatus.WAITING:
            await asyncio.sleep(0.01)
    return found


def sessions(app: tether.App) -> list[tuple[Any, ...]]:
    import sqlite3

    with sqlite3.connect(db_path(app)) as conn:
        return conn.execute(
            "SELECT user_name, ended_at IS NOT NULL FROM tether_sessions ORDER BY created_at"
        ).fetchall()


# -- 1. sessions -----------------------------------------------------------------------------------


async def test_a_captured_cookie_and_its_csrf_token_decide_nothing_after_sign_out(
    app: tether.App, server: FastAPI, alice: Person
) -> None:
    target = await ask(app, "run-signout")
    async with browser(server) as victim:
        await sign_in(victim, alice)
        cookie = victim.cookies[SESSION_COOKIE]
        csrf = csrf_of((await victim.get(f"/approvals/{target.id}")).text)
        out = await victim.post("/logout", data={"csrf": csrf}, headers=SAME)
        assert out.status_code == 303
    before = snapshot(app)
    with attack("sessions"):
        async with browser(server) as thief:
            thief.cookies.set(SESSION_COOKIE, cookie)
            home = await thief.get("/")
            assert 'action="/login"' in home.text  # signed out: the sign-in page
            page = await thief.get(f"/approvals/{target.id}")
            assert page.status_code == 303
            form = {"option": "approve", "operation_digest": target.operation_digest, "csrf": csrf}
            post = await thief.post(f"/approvals/{target.id}/decision", data=form, headers=SAME)
            assert post.status_code == 403
            assert (await thief.get("/live")).status_code == 401
        assert snapshot(app)["approvals"] == before["approvals"]
        assert (await app.get_approval(target.id)).status == "pending"
        assert sessions(app) == [("alice", 1)]  # ended in the database, not just forgotten


async def test_revoking_a_user_ends_every_session_of_theirs_at_once(
    app: tether.App, server: FastAPI, alice: Person
) -> None:
    await ask(app, "run-revoke")
    async with browser(server) as one, browser(server) as two:
        await sign_in(one, alice)
        await sign_in(two, alice)
        await revoke_user(app.engine, "alice")
        with attack("sessions"):
            assert sessions(app) == [("alice", 1), ("alice", 1)]
            for jar in (one, two):
                assert 'action="/login"' in (await jar.get("/")).text


@pytest.mark.parametrize(
    "aged", ["seen_at = seen_at - 1801", "expires_at = created_at"], ids=["idle", "absolute"]
)
async def test_an_idle_or_old_session_opens_nothing(
    app: tether.App, server: FastAPI, alice: Person, aged: str
) -> None:
    await ask(app, "run-idle", reviewers=["group:sre"])
    async with browser(server) as jar:
        await sign_in(jar, alice)
        assert 'data-approval-id="' in (await jar.get("/")).text
        tamper(app, f"UPDATE tether_sessions SET {aged}")  # as if the time had passed
        with attack("sessions"):
            assert 'action="/login"' in (await jar.get("/")).text
            assert (await jar.get("/runs")).status_code == 303


async def test_the_cookie_holds_only_a_signed_random_session_id(
    app: tether.App, server: FastAPI, alice: Person
) -> None:
    async with browser(server) as jar:
        await sign_in(jar, alice)
        cookie = jar.cookies[SESSION_COOKIE]
    with attack("sessions"):
        session_id, _, signature = cookie.partition(".")
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", session_id)
        assert re.fullmatch(r"[0-9a-f]{64}", signature)
        assert b"alice" not in base64.urlsafe_b64decode(session_id + "=")
        # The database keeps only the id's hash.
        assert (
            tamper(
                app,
                "UPDATE tether_sessions SET user_name = user_name WHERE id_hash = ?",
                session_id,
            )
            == 0
        )
        # A valid signature on another id, or a valid id with a forged signature: refused.
        async with browser(server) as thief:
            thief.cookies.set(SESSION_COOKIE, f"{'A' * 43}.{signature}")
            assert 'action="/login"' in (await thief.get("/")).text
            thief.cookies.set(SESSION_COOKIE, f"{session_id}.{'0' * 64}")
            assert 'action="/login"' in (await thief.get("/")).text


async def _first_lines(response: httpx.Response, want: str) -> list[dict[str, str]]:
    """The SSE events of `response` until one named `want` (or the stream's end)."""
    text = ""
    async for chunk in response.aiter_text():
        text += chunk
        if f"event: {want}" in text:
            break
    return sse_events(text)


async def test_open_streams_close_when_their_session_ends_or_their_token_is_revoked(
    app: tether.App, server: FastAPI, alice: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sse, "CHECK_SECONDS", 0.05)
    await app.start("talk", ["a", "b"], 30.0, id="run-talk")  # speaks for a minute
    await ask(app, "run-streams")
    root, token = await add_user(app.engine, "root", frozenset({"admin"}))
    async with serving(server) as live, httpx.AsyncClient(base_url=live.url) as jar:
        response = await jar.post(
            "/login", data={"token": alice.token}, headers={"Origin": live.url}
        )
        assert response.status_code == 303
        csrf = csrf_of((await jar.get("/")).text)
        with attack("sessions"):
            async with (
                jar.stream("GET", "/live") as page,
                jar.stream(
                    "GET",
                    "/api/runs/run-talk/streams/tokens",
                    headers={"Authorization": f"Bearer {token}"},
                ) as api,
            ):
                assert page.status_code == api.status_code == 200
                await jar.post("/logout", data={"csrf": csrf}, headers={"Origin": live.url})
                await revoke_user(app.engine, root.name)
                async with asyncio.timeout(10):
                    assert (await _first_lines(page, "signed-out"))[-1]["event"] == "signed-out"
                    assert (await _first_lines(api, "signed-out"))[-1]["event"] == "signed-out"


async def test_a_page_left_open_does_not_keep_an_idle_session_alive(
    app: tether.App, server: FastAPI, alice: Person
) -> None:
    await app.start("talk", ["a"], 0.0, id="run-open")
    _, admin = await add_user(app.engine, "root", frozenset({"admin"}))  # may see every run
    async with serving(server) as live, httpx.AsyncClient(base_url=live.url) as jar:
        response = await jar.post("/login", data={"token": admin}, headers={"Origin": live.url})
        assert response.status_code == 303
        tamper(app, "UPDATE tether_sessions SET seen_at = seen_at - 1700")  # 28 of 30 min idle
        idle_since = seen(app)
        with attack("sessions"):
            # What a page fetches by itself (its live streams, reconnecting) is not activity.
            for path in ("/live/streams?run=run-open&key=tokens", "/live"):
                async with jar.stream("GET", path) as stream:
                    assert stream.status_code == 200
            assert seen(app) == idle_since
            tamper(app, "UPDATE tether_sessions SET seen_at = seen_at - 200")  # now 31 min
            assert 'action="/login"' in (await jar.get("/")).text


def seen(app: tether.App) -> list[float]:
    import sqlite3

    with sqlite3.connect(db_path(app)) as conn:
        return [r[0] for r in conn.execute("SELECT seen_at FROM tether_sessions")]


async def test_a_stolen_cookie_with_the_thiefs_own_token_keeps_no_stream_open(
    app: tether.App, server: FastAPI, alice: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sse, "CHECK_SECONDS", 0.05)
    await app.start("talk", ["a", "b"], 30.0, id="run-stolen")
    _, victim = await add_user(app.engine, "root", frozenset({"admin"}))
    _, own = await add_user(app.engine, "mallory", frozenset({"admin"}))
    async with serving(server) as live, httpx.AsyncClient(base_url=live.url) as jar:
        response = await jar.post("/login", data={"token": victim}, headers={"Origin": live.url})
        assert response.status_code == 303
        csrf = csrf_of((await jar.get("/")).text)
        with attack("sessions"):
            async with jar.stream(
                "GET",
                "/live/streams?run=run-stolen&key=tokens",
                headers={"Authorization": f"Bearer {own}"},  # valid, but not what opened it
            ) as page:
                assert page.status_code == 200
                await jar.post("/logout", data={"csrf": csrf}, headers={"Origin": live.url})
                async with asyncio.timeout(10):
                    assert (await _first_lines(page, "signed-out"))[-1]["event"] == "signed-out"


async def test_a_session_opened_before_its_user_was_revoked_and_re_added_stays_dead(
    app: tether.App, server: FastAPI, alice: Person
) -> None:
    async with browser(server) as jar:
        await sign_in(jar, alice)
        await revoke_user(app.engine, "alice")
        # As if the session had been written after the revocation ended the others (a sign-in
        # racing the revocation): live in the table, its user revoked.
        tamper(app, "UPDATE tether_sessions SET ended_at = NULL")
        await add_user(app.engine, "alice", frozenset({"admin"}))  # the name, given anew
        with attack("sessions"):
            assert 'action="/login"' in (await jar.get("/")).text
            assert (await jar.get("/live")).status_code == 401


@pytest.mark.parametrize("origin", ["http://[::1", "http://[zz]:80", "http://a:b:c"])
async def test_a_malformed_origin_is_refused_never_a_500(
    app: tether.App, server: FastAPI, alice: Person, origin: str
) -> None:
    async with browser(server) as jar:
        with attack("host and origin"):
            got = await jar.post("/login", data={"token": alice.token}, headers={"Origin": origin})
            assert got.status_code in (400, 403)
            assert SESSION_COOKIE not in jar.cookies


# -- 2. the session secret -------------------------------------------------------------------------


async def test_a_short_session_secret_is_refused_with_what_to_do(app: tether.App) -> None:
    with attack("session secret"):
        for short in ("x", "ab" * 31, "s" * 31):
            with pytest.raises(ConfigurationError, match=r"secrets\.token_urlsafe\(32\)"):
                session_secret(short)
        with pytest.raises(ConfigurationError, match="at least 32"):
            create_server(app, secret=b"k")
        assert session_secret("ab" * 32) == bytes.fromhex("ab" * 32)
        assert len(session_secret("s" * 43)) == 43
        result = CliRunner().invoke(
            cli, ["serve", "nowhere:app"], env={"TETHER_SESSION_SECRET": "x"}
        )
        assert result.exit_code != 0
        assert "at least 32" in result.output


# -- 3. the throttle -------------------------------------------------------------------------------


async def test_guessing_tokens_is_logged_and_answered_429_per_client_address(
    app: tether.App, server: FastAPI, alice: Person, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "tether.server")
    guess = "tt_" + "G" * 43
    with attack("throttle"):
        async with (
            browser(server, ("10.0.0.7", 1)) as guesser,
            browser(server, ("10.0.0.8", 1)) as other,
        ):
            for _ in range(10):
                got = await guesser.get("/api/runs", headers={"Authorization": f"Bearer {guess}"})
                assert got.status_code == 401
            blocked = await guesser.get("/api/runs", headers={"Authorization": f"Bearer {guess}"})
            assert blocked.status_code == 429
            assert 1 <= int(blocked.headers["retry-after"]) <= 60
            form = await guesser.post("/login", data={"token": guess}, headers=SAME)
            assert form.status_code == 429
            assert "retry-after" in form.headers
            assert SESSION_COOKIE not in guesser.cookies
            # A valid token still passes from the blocked address: a guesser behind a shared
            # address (NAT, a proxy) locks nobody else out, and a 256-bit token's answer to
            # a guess is worth nothing.
            right = await guesser.get(
                "/api/runs", headers={"Authorization": f"Bearer {alice.token}"}
            )
            assert right.status_code == 200
            form = await guesser.post("/login", data={"token": alice.token}, headers=SAME)
            assert form.status_code == 303
            assert SESSION_COOKIE in guesser.cookies
            again = await guesser.get("/api/runs", headers={"Authorization": f"Bearer {guess}"})
            assert again.status_code == 429
            # Another address is not slowed, nor are successes counted.
            for _ in range(12):
                ok = await other.get(
                    "/api/runs", headers={"Authorization": f"Bearer {alice.token}"}
                )
                assert ok.status_code == 200
        messages = [r.getMessage() for r in caplog.records if r.name == "tether.server"]
        assert sum("10.0.0.7" in m for m in messages) >= 10
        assert all(
            r.levelno == logging.WARNING for r in caplog.records if r.name == "tether.server"
        )
        assert not any(guess in m or alice.token in m for m in messages)


async def test_guessing_at_the_sign_in_form_is_throttled_too(
    app: tether.App, server: FastAPI, alice: Person, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "tether.server")
    with attack("throttle"):
        async with browser(server, ("10.0.0.9", 1)) as guesser:
            for n in range(10):
                got = await guesser.post("/login", data={"token": f"tt_guess{n}"}, headers=SAME)
                assert got.status_code == 401
            got = await guesser.post("/login", data={"token": "tt_guess"}, headers=SAME)
            assert got.status_code == 429
            assert "try again in" in got.text
        assert any(
            "sign-in" in r.getMessage() and "10.0.0.9" in r.getMessage() for r in caplog.records
        )
        assert not any("tt_guess" in r.getMessage() for r in caplog.records)


# -- 4. Host and Origin ----------------------------------------------------------------------------


async def test_a_dns_rebinding_host_cannot_make_a_foreign_form_same_origin(
    app: tether.App, server: FastAPI, alice: Person
) -> None:
    target = await ask(app, "run-rebind")
    async with browser(server) as jar:
        await sign_in(jar, alice)
        csrf = csrf_of((await jar.get(f"/approvals/{target.id}")).text)
        cookie = jar.cookies[SESSION_COOKIE]
    before = snapshot(app)
    form = f"option=approve&operation_digest={target.operation_digest}&csrf={csrf}".encode()
    with attack("host"):
        for host in (
            b"evil.example",
            b"evil.example:80",
            b"testserver.evil.example",
            b"testserver:8080",
            b"testserver@evil.example",
        ):
            origin = b"http://" + host
            got = await raw_request(
                server,
                "POST",
                f"/approvals/{target.id}/decision",
                headers=[
                    (b"host", host),
                    (b"origin", origin),
                    (b"cookie", f"{SESSION_COOKIE}={cookie}".encode()),
                    (b"content-type", b"application/x-www-form-urlencoded"),
                ],
                chunks=[form],
            )
            assert got.status == 400, (host, got.status)
            assert b"--origin" in got.body
        assert snapshot(app)["approvals"] == before["approvals"]
        assert (await app.get_approval(target.id)).status == "pending"


async def test_only_the_configured_public_origin_is_served(app: tether.App, alice: Person) -> None:
    server = create_server(app, secret=SECRET, origins=["https://tether.example.com"])
    transport = httpx.ASGITransport(app=server)
    with attack("host"):
        async with httpx.AsyncClient(transport=transport, base_url=ORIGIN) as local:
            assert (await local.get("/")).status_code == 400  # Host: testserver is not ours
        async with httpx.AsyncClient(
            transport=transport, base_url="https://tether.example.com"
        ) as public:
            assert (await public.get("/")).status_code == 200
            signed = await public.post(
                "/login",
                data={"token": alice.token},
                headers={"Origin": "https://tether.example.com"},
            )
            assert signed.status_code == 303
            foreign = await public.post(
                "/login",
                data={"token": alice.token},
                headers={"Origin": "http://tether.example.com"},
            )
            assert foreign.status_code == 403  # another scheme is another origin
        with pytest.raises(ConfigurationError, match="not an origin"):
            create_server(app, origins=["tether.example.com"])


# -- 5. stream offsets -----------------------------------------------------------------------------


BAD_LAST_EVENT_IDS = [
    b"\xc2\xb2",
    b"\xb2",
    "²".encode(),
    "٣".encode(),
    b"1e3",
    b"-1",
    b"+1",
    b"0x10",
    b"1_000",
    b" 1",
    b"",
    str(2**63 - 1).encode(),
    str(2**63).encode(),
    b"9" * 400,
]


async def test_last_event_ids_that_are_not_offsets_answer_400_never_500(
    app: tether.App, server: FastAPI, alice: Person, caplog: pytest.LogCaptureFixture
) -> None:
    await ask(app, "run-offsets")
    async with browser(server) as jar:
        await sign_in(jar, alice)
        cookie = f"{SESSION_COOKIE}={jar.cookies[SESSION_COOKIE]}".encode()
    paths = {
        "/api/runs/run-offsets/streams/tokens?follow=false": (
            b"authorization",
            f"Bearer {alice.token}".encode(),
        ),
        "/live/streams?run=run-offsets": (b"cookie", cookie),
    }
    for path, credential in paths.items():
        for value in BAD_LAST_EVENT_IDS:
            with attack("offsets"):
                got = await raw_request(
                    server, "GET", path, headers=[credential, (b"last-event-id", value)]
                )
                assert got.status == 400, (path, value, got.status)
                assert b"ASCII decimal" in got.body
    assert not [r for r in caplog.records if r.exc_info]


@pytest.mark.parametrize("offset", ["%C2%B2", str(2**63), str(10**30), "-1", "1.5", "abc", ""])
async def test_offsets_that_are_not_offsets_answer_400(
    app: tether.App, server: FastAPI, alice: Person, offset: str
) -> None:
    await ask(app, "run-offset")
    with attack("offsets"):
        got = await raw_request(
            server,
            "GET",
            f"/api/runs/run-offset/streams/tokens?offset={offset}&follow=false",
            headers=[(b"authorization", f"Bearer {alice.token}".encode())],
        )
        assert got.status == 400, got.status
        last = str(2**63 - 1)
        fine = await raw_request(
            server,
            "GET",
            f"/api/runs/run-offset/streams/tokens?offset={last}&follow=false",
            headers=[(b"authorization", f"Bearer {alice.token}".encode())],
        )
        assert fine.status == 200
        assert [e["event"] for e in sse_events(fine.body.decode())] == ["end"]


# -- 6. hostile text in the inbox ------------------------------------------------------------------


async def test_bidi_zero_width_and_control_characters_are_shown_spelled_out_on_every_page(
    app: tether.App, server: FastAPI, alice: Person
) -> None:
    run_id = "run-\u202egnp.exe\u200b"
    target = await ask(
        app,
        run_id,
        title=f"Pay invoice\u202e{HIDDEN}gpj.exe",
        description=f"desc {HIDDEN}",
        operation={"tool": f"pay{HIDDEN}", "arguments": {"to\u200b": f"acct\u202e{HIDDEN}"}},
        options=[{"id": "approve", "label": f"Yes\u2066{HIDDEN}"}, {"id": "reject", "label": "No"}],
    )
    async with browser(server) as jar:
        await sign_in(jar, alice)
        csrf = csrf_of((await jar.get(f"/approvals/{target.id}")).text)
        decided = await jar.post(
            f"/approvals/{target.id}/decision",
            headers=SAME,
            data={
                "option": "reject",
                "operation_digest": target.operation_digest,
                "csrf": csrf,
                "comment": f"no\u202e{HIDDEN}",
            },
        )
        assert decided.status_code == 303
        with attack("inbox text"):
            pages = {
                path: await jar.get(path)
                for path in (
                    "/",
                    "/runs",
                    f"/runs/{quote(run_id, safe='')}",
                    f"/approvals/{target.id}",
                )
            }
            for path, page in pages.items():
                assert page.status_code == 200, path
                assert RAW.findall(page.text) == [], path
                assert live_markup(page.text) == [], path
            approval = pages[f"/approvals/{target.id}"].text
            assert '<span class="hidden-char">&lt;U+202E&gt;</span>' in approval
            for code in (
                "200B",
                "2066",
                "200F",
                "061C",
                "200D",
                "2060",
                "FEFF",
                "001B",
                "0007",
                "009B",
            ):
                assert f"&lt;U+{code}&gt;" in approval, code
            assert "gnp.exe" in pages["/runs"].text  # the run id, spelled out, still readable
            assert '<span class="hidden-char">&lt;U+202E&gt;</span>' in pages["/runs"].text


# -- 7. the channel of decisions and looks ---------------------------------------------------------


async def test_decisions_and_looks_record_their_channel_and_client(
    app: tether.App, server: FastAPI, alice: Person
) -> None:
    api_one = await ask(app, "run-channel-api")
    inbox_one = await ask(app, "run-channel-inbox")
    async with browser(server, ("10.1.2.3", 9)) as jar:
        auth = {"Authorization": f"Bearer {alice.token}"}
        assert (await jar.get(f"/api/approvals/{api_one.id}", headers=auth)).status_code == 200
        got = await jar.post(
            f"/api/approvals/{api_one.id}/decision",
            headers=auth,
            json={"option": "approve", "operation_digest": api_one.operation_digest},
        )
        assert got.status_code == 200
        await sign_in(jar, alice)
        csrf = csrf_of((await jar.get(f"/approvals/{inbox_one.id}")).text)
        form = {"option": "approve", "operation_digest": inbox_one.operation_digest, "csrf": csrf}
        assert (
            await jar.post(f"/approvals/{inbox_one.id}/decision", data=form, headers=SAME)
        ).status_code == 303
    with attack("channel"):
        for approval, channel in ((api_one, "api"), (inbox_one, "inbox")):
            entries = [(e, d) for e, a, d in trail(app, approval.id) if a == "alice"]
            assert {e for e, _ in entries} >= {"viewed", "decided"}, entries
            for _, detail in entries:
                assert f'"channel": "{channel}"' in detail or f'"channel":"{channel}"' in detail
                assert "10.1.2.3" in detail

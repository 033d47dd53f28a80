"""The reviewers' inbox over HTTP: signing in (cookie flags, wrong tokens, foreign origins),
who sees which approval and run, markup in approvals rendered as text, decisions guarded by a
CSRF token and the Origin, refusals shown with the API's statuses, revocation ending sessions
at once, security headers on every page, and the live stream of state digests."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from tests.server.kit import (
    ORIGIN,
    SECRET,
    LiveServer,
    Person,
    csrf_of,
    events,
    sign_in,
    start_approval,
)

import tether
from tether.server import create_server, live
from tether.server.auth import SESSION_COOKIE
from tether.users import revoke_user

pytestmark = pytest.mark.timeout(30)

SAME = {"Origin": ORIGIN}
SCRIPT = "<script>window.__x=1</script>"
ATTRIBUTE = '"><img src=x onerror=alert(1)>'
TEMPLATE = "{{7*7}}"


def region(page: str, pattern: str) -> str:
    found = re.search(pattern, page, re.S)
    assert found, pattern
    return found.group(1)


async def decide(
    client: httpx.AsyncClient, ask: tether.Approval, option: str = "approve", **extra: str
) -> httpx.Response:
    """Open the approval page and submit its form as a browser would."""
    page = await client.get(f"/approvals/{ask.id}")
    assert page.status_code == 200
    form = {"csrf": csrf_of(page.text), "operation_digest": ask.operation_digest,
            "option": option, "comment": "", **extra}  # fmt: skip
    return await client.post(f"/approvals/{ask.id}/decision", data=form, headers=SAME)


# -- signing in ---------------------------------------------------------------------------------


async def test_a_wrong_token_is_refused_and_sets_no_cookie(
    client: httpx.AsyncClient, alice: Person
) -> None:
    for token in ("tt_" + "x" * 43, "", alice.token + "x"):
        response = await client.post("/login", data={"token": token}, headers=SAME)
        assert response.status_code == 401
        assert "set-cookie" not in response.headers
        assert "That token is unknown or has been revoked." in response.text
    assert SESSION_COOKIE not in client.cookies
    page = await client.get("/")
    assert 'action="/login"' in page.text
    assert "Sign out" not in page.text


async def test_a_good_token_sets_a_strict_http_only_session_cookie(
    app: tether.App, client: httpx.AsyncClient, alice: Person
) -> None:
    ask = await start_approval(app, "run-1")
    response = await sign_in(client, alice)
    assert response.headers["location"] == "/"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    flags = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/"} <= flags
    assert "secure" not in flags  # plain http here; see the next test
    page = await client.get("/")
    assert page.status_code == 200
    assert f'data-approval-id="{ask.id}"' in page.text
    assert "Deploy 1.2.3 to prod?" in page.text


async def test_behind_https_the_session_cookie_is_secure(app: tether.App, alice: Person) -> None:
    server = create_server(app, secret=SECRET, secure_cookies=True)
    transport = httpx.ASGITransport(app=server)
    async with httpx.AsyncClient(transport=transport, base_url="https://inbox.example") as client:
        response = await client.post("/login", data={"token": alice.token},
                                     headers={"Origin": "https://inbox.example"})  # fmt: skip
    assert response.status_code == 303
    flags = {p.strip().lower() for p in response.headers["set-cookie"].split(";")[1:]}
    assert {"secure", "httponly", "samesite=strict"} <= flags


@pytest.mark.parametrize(
    "headers",
    [{"Origin": "https://evil.example"}, {"Referer": "https://evil.example/x"}, {},
     {"Origin": "null"}],
    ids=["foreign-origin", "foreign-referer", "no-origin", "null-origin"],
)  # fmt: skip
async def test_signing_in_from_another_site_is_refused(
    client: httpx.AsyncClient, alice: Person, headers: dict[str, str]
) -> None:
    response = await client.post("/login", data={"token": alice.token}, headers=headers)
    assert response.status_code == 403
    assert "set-cookie" not in response.headers


async def test_signing_in_returns_to_the_page_asked_for_but_never_off_site(
    app: tether.App, client: httpx.AsyncClient, alice: Person
) -> None:
    ask = await start_approval(app, "run-next")
    first = await client.get(f"/approvals/{ask.id}")
    assert first.status_code == 303
    assert first.headers["location"] == f"/?next=%2Fapprovals%2F{ask.id}"
    form = await client.get(first.headers["location"])
    assert f'name="next" value="/approvals/{ask.id}"' in form.text
    back = await client.post("/login", data={"token": alice.token, "next": f"/approvals/{ask.id}"},
                             headers=SAME)  # fmt: skip
    assert back.headers["location"] == f"/approvals/{ask.id}"
    for target in ("//evil.example/", "https://evil.example/", "/\\evil.example", "javascript:x"):
        away = await client.post("/login", data={"token": alice.token, "next": target},
                                 headers=SAME)  # fmt: skip
        assert away.headers["location"] == "/", target


async def test_signing_out_needs_the_csrf_token_and_clears_the_cookie(
    client: httpx.AsyncClient, alice: Person
) -> None:
    await sign_in(client, alice)
    page = await client.get("/")
    refused = await client.post("/logout", data={"csrf": "0" * 64}, headers=SAME)
    assert refused.status_code == 403
    assert "Sign out" in (await client.get("/")).text  # still signed in
    done = await client.post("/logout", data={"csrf": csrf_of(page.text)}, headers=SAME)
    assert done.status_code == 303
    assert done.headers["set-cookie"].startswith(f'{SESSION_COOKIE}=""')
    assert "max-age=0" in done.headers["set-cookie"].lower()
    assert 'action="/login"' in (await client.get("/")).text


# -- who sees what --------------------------------------------------------------------------------


async def test_the_inbox_lists_an_approval_for_its_reviewers_and_hides_it_from_others(
    app: tether.App, client: httpx.AsyncClient, alice: Person, outsider: Person, admin: Person
) -> None:
    ask = await start_approval(app, "run-see")
    await sign_in(client, alice)
    mine = await client.get("/")
    assert f'href="/approvals/{ask.id}"' in mine.text
    assert 'href="/runs/run-see"' in mine.text
    assert '<span class="chip">group:sre</span>' in mine.text
    assert re.search(rf'data-expires="{re.escape(ask.expires_at.isoformat())}"', mine.text)

    await sign_in(client, outsider)
    theirs = await client.get("/")
    assert ask.id not in theirs.text
    assert "Deploy 1.2.3 to prod?" not in theirs.text
    assert "Nothing is waiting for you." in theirs.text
    for path in (f"/approvals/{ask.id}", "/runs/run-see"):
        hidden = await client.get(path)
        assert hidden.status_code == 404, path
        assert "Deploy 1.2.3" not in hidden.text
        assert "that you may see" in hidden.text
    assert "run-see" not in (await client.get("/runs")).text
    form = {"csrf": csrf_of(theirs.text), "operation_digest": ask.operation_digest,
            "option": "approve"}  # fmt: skip
    refused = await client.post(f"/approvals/{ask.id}/decision", data=form, headers=SAME)
    assert refused.status_code == 404
    assert (await app.get_approval(ask.id)).status == "pending"
    # Views by outsiders were never recorded: they saw nothing.
    assert [e.actor for e in await app.approval_history(ask.id) if e.event == "viewed"] == []

    await sign_in(client, admin)
    everything = await client.get("/")
    assert f'data-approval-id="{ask.id}"' in everything.text
    shown = await client.get(f"/approvals/{ask.id}")
    assert shown.status_code == 200
    assert "you are not one of the reviewers who may decide it" in shown.text
    assert 'id="decide"' not in shown.text


async def test_the_approval_page_shows_what_is_asked_and_records_the_view(
    app: tether.App, client: httpx.AsyncClient, alice: Person
) -> None:
    ask = await start_approval(app, "run-page")
    await sign_in(client, alice)
    page = await client.get(f"/approvals/{ask.id}")
    text = page.text
    assert region(text, r'<h1 class="title">(.*?)</h1>') == "Deploy 1.2.3 to prod?"
    assert "The agent wants to deploy the release." in text
    operation = region(text, r'<pre class="json" id="operation">(.*?)</pre>')
    assert json.loads(operation.replace("&#34;", '"')) == ASK_OPERATION
    context = region(text, r'<pre class="json" id="context">(.*?)</pre>')
    assert json.loads(context.replace("&#34;", '"')) == {"api_key": "[redacted]",
                                                         "changelog": "fix login"}  # fmt: skip
    assert "abc123" not in text
    assert f'<code id="digest">{ask.operation_digest}</code>' in text
    assert f'name="operation_digest" value="{ask.operation_digest}"' in text
    assert '<button type="submit" name="option" value="approve" class="btn btn-primary">' in text
    assert 'value="reject" class="btn btn-destructive">Reject</button>' in text
    assert 'name="response"' not in text  # no option takes a typed response
    assert '<span class="badge badge-pending">pending</span>' in text
    assert f'data-page="/approvals/{ask.id}"' in text
    assert f'data-live="/live?scope=approval&amp;id={ask.id}"' in text
    history = [(e.event, e.actor) for e in await app.approval_history(ask.id)]
    assert history == [("created", None), ("viewed", "alice")]
    assert "<strong>created</strong>" in text


ASK_OPERATION = {"tool": "deploy", "arguments": {"env": "prod", "version": "1.2.3"}}


async def test_markup_and_template_syntax_in_an_approval_are_shown_as_text(
    app: tether.App, client: httpx.AsyncClient, alice: Person
) -> None:
    nasty = f"{TEMPLATE} {SCRIPT} {ATTRIBUTE}"
    ask = await start_approval(
        app, "run-xss", title=nasty, description=nasty, context={"note": nasty, TEMPLATE: 1},
        operation={"tool": "x", "arguments": {"q": nasty}},
    )  # fmt: skip
    escaped = ("{{7*7}} &lt;script&gt;window.__x=1&lt;/script&gt; "
               "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;")  # fmt: skip
    await sign_in(client, alice)
    pages = {"inbox": await client.get("/"), "approval": await client.get(f"/approvals/{ask.id}"),
             "run": await client.get("/runs/run-xss")}  # fmt: skip
    for name, page in pages.items():
        assert page.status_code == 200, name
        assert SCRIPT not in page.text, name
        assert "<img src=x" not in page.text, name
        assert "&lt;script&gt;window.__x=1&lt;/script&gt;" in page.text, name
        assert escaped in page.text, name
    approval = pages["approval"].text
    assert region(approval, r'<h1 class="title">(.*?)</h1>') == escaped
    assert region(approval, r'<p class="prose">(.*?)</p>') == escaped
    assert region(pages["inbox"].text, r'class="item-title"[^>]*>(.*?)</a>') == escaped
    for pre in ("operation", "context"):
        shown = region(approval, rf'<pre class="json" id="{pre}">(.*?)</pre>')
        assert "{{7*7}}" in shown
        assert "49" not in shown  # never evaluated as a template
        assert "&lt;script&gt;" in shown
    # The title is also a <title>, escaped there too.
    assert region(approval, r"<title>(.*?)</title>") == f"{escaped} · Tether"


async def test_every_page_carries_the_csp_and_no_inline_script_style_or_handler(
    app: tether.App, client: httpx.AsyncClient, alice: Person
) -> None:
    ask = await start_approval(app, "run-csp")
    paths = ["/", "/?next=/runs"]
    pages = [await client.get(p) for p in paths]
    await sign_in(client, alice)
    for path in ("/", f"/approvals/{ask.id}", "/runs", "/runs/run-csp", "/runs/nope"):
        pages.append(await client.get(path))
    assert [p.status_code for p in pages] == [200, 200, 200, 200, 200, 200, 404]
    for page in pages:
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp
        assert "frame-ancestors 'none'" in csp
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["referrer-policy"] == "same-origin"
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert re.findall(r"<script\b[^>]*>", page.text) == [
            '<script src="/static/inbox.js" defer>'
        ]
        assert not re.search(r"<script\b[^>]*>[^<]+</script>", page.text)
        assert not re.search(r"\sstyle=", page.text)
        assert not re.search(r"<[^>]+\son[a-z]+=", page.text)
    for name, kind in (("inbox.css", "text/css"), ("inbox.js", "text/javascript")):
        asset = await client.get(f"/static/{name}")
        assert asset.status_code == 200
        assert asset.headers["content-type"].startswith(kind)
    assert (await client.get("/static/../inbox.py")).status_code == 404
    assert (await client.get("/static/conftest.py")).status_code == 404


async def test_inbox_routes_stay_out_of_the_openapi_document(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert all(p.startswith("/api/") for p in paths), sorted(paths)


# -- deciding -------------------------------------------------------------------------------------


async def test_a_decision_without_the_csrf_token_is_refused_and_decides_nothing(
    app: tether.App, client: httpx.AsyncClient, alice: Person
) -> None:
    ask = await start_approval(app, "run-csrf")
    await sign_in(client, alice)
    form = {"operation_digest": ask.operation_digest, "option": "approve"}
    for csrf in (None, "", "0" * 64):
        data = form if csrf is None else {**form, "csrf": csrf}
        response = await client.post(f"/approvals/{ask.id}/decision", data=data, headers=SAME)
        assert response.status_code == 403
        assert "Nothing was changed" in response.text
    assert (await app.get_approval(ask.id)).status == "pending"
    assert not (await (await app.get("run-csrf")).status()).terminal
    assert "decided" not in [e.event for e in await app.approval_history(ask.id)]


@pytest.mark.parametrize(
    "headers",
    [{"Origin": "https://evil.example"}, {"Referer": "https://evil.example/approvals/x"}, {},
     {"Origin": "http://testserver.evil.example"}],
    ids=["foreign-origin", "foreign-referer", "neither", "lookalike-origin"],
)  # fmt: skip
async def test_a_decision_from_a_foreign_origin_is_refused(
    app: tether.App, client: httpx.AsyncClient, alice: Person, headers: dict[str, str]
) -> None:
    ask = await start_approval(app, "run-origin")
    await sign_in(client, alice)
    page = await client.get(f"/approvals/{ask.id}")
    form = {"csrf": csrf_of(page.text), "operation_digest": ask.operation_digest,
            "option": "approve"}  # fmt: skip
    response = await client.post(f"/approvals/{ask.id}/decision", data=form, headers=headers)
    assert response.status_code == 403
    assert (await app.get_approval(ask.id)).status == "pending"


async def test_a_decision_with_token_and_origin_is_taken_and_the_run_completes(
    app: tether.App, client: httpx.AsyncClient, alice: Person
) -> None:
    ask = await start_approval(app, "run-ok")
    await sign_in(client, alice)
    # The reviewer is the session's user: a form field naming someone else changes nothing.
    response = await decide(client, ask, comment="ship <it>", reviewer="mallory")
    assert response.status_code == 303
    assert response.headers["location"] == f"/approvals/{ask.id}"
    result = await (await app.get("run-ok")).result(timeout=10)
    assert result == {"status": "approved", "option": "approve", "reviewer": "alice",
                      "comment": "ship <it>", "response": None, "act": "did 1.2.3"}  # fmt: skip
    page = await client.get(f"/approvals/{ask.id}")
    assert '<span class="badge badge-approved">approved</span>' in page.text
    decided = '<strong>Approved</strong> by <span class="decision-reviewer">alice</span> at '
    assert decided in page.text
    assert '<blockquote class="comment">ship &lt;it&gt;</blockquote>' in page.text
    assert 'id="decide"' not in page.text
    assert "nothing is left to decide" in page.text
    assert ask.id not in (await client.get("/")).text  # no longer pending
    events = [(e.event, e.actor) for e in await app.approval_history(ask.id)]
    assert ("decided", "alice") in events


async def test_a_referer_of_this_server_stands_in_for_a_missing_origin(
    app: tether.App, client: httpx.AsyncClient, alice: Person
) -> None:
    ask = await start_approval(app, "run-referer")
    await sign_in(client, alice)
    page = await client.get(f"/approvals/{ask.id}")
    form = {"csrf": csrf_of(page.text), "operation_digest": ask.operation_digest,
            "option": "reject"}  # fmt: skip
    response = await client.post(f"/approvals/{ask.id}/decision", data=form,
                                 headers={"Referer": f"{ORIGIN}/approvals/{ask.id}"})  # fmt: skip
    assert response.status_code == 303
    assert (await (await app.get("run-referer")).result(timeout=10))["status"] == "rejected"


@pytest.mark.parametrize(
    ("who", "option", "digest", "status", "reason"),
    [("alice", "approve", "0" * 64, 409, "stale_digest"),
     ("alice", "launch", None, 422, "unknown_option"),
     ("root", "approve", None, 403, "wrong_reviewer")],
)  # fmt: skip
async def test_a_refused_decision_shows_the_reason_with_the_apis_status(
    app: tether.App, client: httpx.AsyncClient, alice: Person, admin: Person, who: str,
    option: str, digest: str | None, status: int, reason: str,
) -> None:  # fmt: skip
    ask = await start_approval(app, "run-refused")
    await sign_in(client, alice if who == "alice" else admin)
    page = await client.get(f"/approvals/{ask.id}")
    form = {"csrf": csrf_of(page.text), "operation_digest": digest or ask.operation_digest,
            "option": option, "comment": "kept <b>"}  # fmt: skip
    response = await client.post(f"/approvals/{ask.id}/decision", data=form, headers=SAME)
    assert response.status_code == status
    assert f"Refused: <code>{reason}</code>" in response.text
    assert region(response.text, r'<h1 class="title">(.*?)</h1>') == "Deploy 1.2.3 to prod?"
    if who == "alice":  # the form is shown again, with what was typed
        assert ">kept &lt;b&gt;</textarea>" in response.text
    assert (await app.get_approval(ask.id)).status == "pending"
    assert ("refused", who) in [(e.event, e.actor) for e in await app.approval_history(ask.id)]


async def test_an_option_with_a_typed_response_takes_json_from_the_response_box(
    app: tether.App, client: httpx.AsyncClient, alice: Person
) -> None:
    edit = {"id": "edit", "label": "Edit & approve", "style": "default",
            "schema": {"type": "object", "required": ["version"],
                       "properties": {"version": {"type": "string"}}}}  # fmt: skip
    options = [{"id": "approve", "label": "Approve", "style": "primary"}, edit]
    ask = await start_approval(app, "run-typed", options=options)
    await sign_in(client, alice)
    page = await client.get(f"/approvals/{ask.id}")
    assert '<textarea id="response" name="response"' in page.text
    assert "(JSON, for Edit &amp; approve)" in page.text
    bad = await decide(client, ask, option="edit", response="{not json")
    assert bad.status_code == 422
    assert "the response is not JSON" in bad.text
    assert ">{not json</textarea>" in bad.text
    assert (await app.get_approval(ask.id)).status == "pending"
    good = await decide(client, ask, option="edit", response='{"version": "1.2.4"}')
    assert good.status_code == 303
    result = await (await app.get("run-typed")).result(timeout=10)
    assert (result["status"], result["response"]) == ("edit", {"version": "1.2.4"})


async def test_a_quorum_shows_the_approvals_so_far(
    app: tether.App, client: httpx.AsyncClient, alice: Person, bob: Person
) -> None:
    ask = await start_approval(app, "run-quorum", required=2)
    await sign_in(client, alice)
    assert "0 of 2 approvals" in (await client.get("/")).text
    assert (await decide(client, ask)).status_code == 303
    page = await client.get(f"/approvals/{ask.id}")
    assert "1 of 2 approvals: alice" in page.text
    assert '<span class="badge badge-pending">pending</span>' in page.text
    await sign_in(client, bob)
    assert "1 of 2 approvals: alice" in (await client.get("/")).text
    assert (await decide(client, ask)).status_code == 303
    result = await (await app.get("run-quorum")).result(timeout=10)
    assert result["status"] == "approved"


async def test_a_revoked_users_session_stops_working_at_once(
    app: tether.App, client: httpx.AsyncClient, alice: Person
) -> None:
    ask = await start_approval(app, "run-revoked")
    await sign_in(client, alice)
    page = await client.get(f"/approvals/{ask.id}")
    assert page.status_code == 200
    await revoke_user(app.engine, "alice")
    home = await client.get("/")
    assert 'action="/login"' in home.text
    assert ask.id not in home.text
    assert (await client.get(f"/approvals/{ask.id}")).status_code == 303
    assert (await client.get("/runs")).status_code == 303
    form = {"csrf": csrf_of(page.text), "operation_digest": ask.operation_digest,
            "option": "approve"}  # fmt: skip
    response = await client.post(f"/approvals/{ask.id}/decision", data=form, headers=SAME)
    assert response.status_code == 403
    assert (await app.get_approval(ask.id)).status == "pending"
    live_response = await client.get("/live")
    assert live_response.status_code == 401


# -- runs -----------------------------------------------------------------------------------------


async def test_the_run_pages_show_the_step_timeline_and_the_runs_approvals(
    app: tether.App, client: httpx.AsyncClient, alice: Person, outsider: Person, admin: Person
) -> None:
    ask = await start_approval(app, "run-timeline")
    other = await start_approval(app, "run-finance", reviewers=["group:finance"])
    await sign_in(client, alice)
    runs = await client.get("/runs")
    assert 'data-run-id="run-timeline"' in runs.text
    assert "run-finance" not in runs.text
    page = await client.get("/runs/run-timeline")
    steps = region(page.text, r'<ol class="timeline">(.*?)</ol>')
    assert re.findall(r'<span class="step-name">(.*?)</span>', steps) == ["prepare", "approval"]
    assert steps.count('<span class="badge badge-completed">completed</span>') == 2
    assert f'href="/approvals/{ask.id}"' in page.text
    assert 'data-stream-key="tokens"' in page.text  # the place streams will fill
    assert (await client.get("/runs/run-finance")).status_code == 404
    await decide(client, ask)
    await (await app.get("run-timeline")).result(timeout=10)
    done = await client.get("/runs/run-timeline")
    assert '<span class="badge badge-succeeded">succeeded</span>' in done.text
    names = re.findall(r'<span class="step-name">(.*?)</span>', done.text)
    assert names[0] == "prepare"
    assert "act" in names
    await sign_in(client, admin)
    everything = await client.get("/runs")
    assert 'data-run-id="run-timeline"' in everything.text
    assert 'data-run-id="run-finance"' in everything.text
    assert f'href="/approvals/{other.id}"' in (await client.get("/runs/run-finance")).text


async def test_a_failed_step_shows_the_first_line_of_its_error(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    @app.step(retry=tether.NO_RETRY)
    async def explode() -> None:
        raise ValueError("the disk is full\nsecond line <b>")

    @app.workflow()
    async def breaks() -> None:
        await explode()

    handle = await app.start(breaks, id="run-fails")
    with pytest.raises(tether.RunFailed):
        await handle.result(timeout=10)
    await sign_in(client, admin)
    page = await client.get("/runs/run-fails")
    assert '<p class="error-line">the disk is full</p>' in page.text
    assert "second line" not in page.text
    assert '<span class="badge badge-failed">failed</span>' in page.text


# -- live updates ---------------------------------------------------------------------------------


@pytest.fixture
async def browserless(live_server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the live server (real sockets, so server-sent events stream)."""
    async with httpx.AsyncClient(base_url=live_server.url, timeout=10) as made:
        yield made


async def test_the_live_stream_sends_a_new_state_when_an_approval_arrives(
    app: tether.App, browserless: httpx.AsyncClient, alice: Person
) -> None:
    await sign_in(browserless, alice)
    page = await browserless.get("/")
    rendered = region(page.text, r'data-state="([0-9a-f]+)"')
    async with browserless.stream("GET", "/live?scope=inbox") as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert stream.headers["cache-control"] == "no-store"
        received = events(stream)
        assert await anext(received) == ("state", rendered)
        ask = await start_approval(app, "run-live")
        async with asyncio.timeout(5):
            name, changed = await anext(received)
        assert name == "state"
        assert changed != rendered
    page = await browserless.get("/")
    assert region(page.text, r'data-state="([0-9a-f]+)"') == changed
    assert f'data-approval-id="{ask.id}"' in page.text


async def test_the_live_stream_beats_while_idle_and_ends_with_the_session(
    app: tether.App, browserless: httpx.AsyncClient, alice: Person,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(live, "HEARTBEAT_SECONDS", 0.2)
    await sign_in(browserless, alice)
    async with browserless.stream("GET", "/live?scope=runs") as stream:
        received = events(stream)
        assert (await anext(received))[0] == "state"
        async with asyncio.timeout(5):
            assert await anext(received) == ("comment", "heartbeat")
        await revoke_user(app.engine, "alice")
        async with asyncio.timeout(5):
            assert await anext(received) == ("signed-out", "the session ended")
            with pytest.raises(StopAsyncIteration):
                await anext(received)  # the server closed the stream


async def test_the_live_stream_of_an_approval_ignores_views_and_follows_decisions(
    app: tether.App, browserless: httpx.AsyncClient, alice: Person
) -> None:
    ask = await start_approval(app, "run-watch")
    await sign_in(browserless, alice)
    page = await browserless.get(f"/approvals/{ask.id}")  # recorded as a view
    rendered = region(page.text, r'data-state="([0-9a-f]+)"')
    async with browserless.stream("GET", f"/live?scope=approval&id={ask.id}") as stream:
        queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

        async def read() -> None:
            async for event in events(stream):
                await queue.put(event)

        reader = asyncio.create_task(read())
        try:
            assert await asyncio.wait_for(queue.get(), 5) == ("state", rendered)
            # Showing the page again records another view: no change for the page, no event
            # (else every open page would re-fetch itself forever).
            assert (await browserless.get(f"/approvals/{ask.id}")).status_code == 200
            await asyncio.sleep(live.POLL_SECONDS * 3)
            assert queue.empty()
            await app.decide(ask.id, "approve", reviewer=alice.user.reviewer,
                             operation_digest=ask.operation_digest)  # fmt: skip
            name, changed = await asyncio.wait_for(queue.get(), 5)
            assert name == "state"
            assert changed != rendered
        finally:
            reader.cancel()
    page = await browserless.get(f"/approvals/{ask.id}")
    assert region(page.text, r'data-state="([0-9a-f]+)"') == changed


@pytest.mark.parametrize(
    ("query", "status"),
    [("scope=approval&id=ap-nope", 404), ("scope=run&id=nope", 404), ("scope=bogus", 400),
     ("scope=run", 400), ("scope=inbox&id=x", 400)],
)  # fmt: skip
async def test_the_live_stream_refuses_what_the_user_may_not_watch(
    client: httpx.AsyncClient, alice: Person, query: str, status: int
) -> None:
    assert (await client.get(f"/live?{query}")).status_code == 401  # not signed in
    await sign_in(client, alice)
    assert (await client.get(f"/live?{query}")).status_code == status


async def test_the_live_stream_stops_polling_when_the_client_goes_away(
    browserless: httpx.AsyncClient, alice: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks: list[str] = []
    real_state = live.state

    async def counted(*args: Any) -> str:
        looks.append("look")
        return await real_state(*args)

    monkeypatch.setattr(live, "state", counted)
    monkeypatch.setattr(live, "POLL_SECONDS", 0.1)
    await sign_in(browserless, alice)
    async with browserless.stream("GET", "/live?scope=inbox") as stream:
        received = events(stream)  # (held: dropping it would close the stream early)
        assert (await anext(received))[0] == "state"
        await asyncio.sleep(live.POLL_SECONDS * 3)
    polled = len(looks)
    assert polled >= 3  # it polled while the client listened
    await asyncio.sleep(live.POLL_SECONDS * 2)  # the server notices within one poll
    settled = len(looks)
    await asyncio.sleep(live.POLL_SECONDS * 4)
    assert len(looks) == settled <= polled + 1

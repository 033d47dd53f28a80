"""The run page (server/run_page.py) over ASGI and in headless Chromium: a run with a retried
step, a durable sleep, a child and an approval draws a timeline whose rows are its history, and
its history lists inputs and outputs, escaped and redacted; a running run whose worker is gone
says its owner is lost; an admin cancels from the page by keyboard, through the page that asks
first (what cancelling does to the run, its id and workflow; admin only), and forks it from a
chosen step (the trail of actions names who did each, from where); a reviewer sees no
actions and forged posts change nothing; refused actions are said on the page; an agent run
shows its conversation with tokens and the tool's approval, also as JSON at
/api/runs/{id}/transcript.
Screenshots go to artifacts/screenshots/ with TETHER_SCREENSHOTS set, else to tmp_path."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import httpx
import pytest
from playwright.async_api import Locator, Page, ViewportSize, expect
from tests.server.kit import (
    ORIGIN,
    SECRET,
    WAIT_MS,
    Person,
    browser_sign_in,
    csrf_of,
    sign_in,
    start_approval,
)

import tether
from tether.agents.models import Emit, ModelRequest, ModelResponse
from tether.models import Scripted, ToolCall
from tether.server import create_server
from tether.users import add_user

pytestmark = pytest.mark.timeout(60)

SAME = {"Origin": ORIGIN}
HOSTILE = '"><img src=x onerror=alert(1)>'
SECRET_VALUE = "sk-live-4f9a8b7c6d5e4f3a2b1c"
USAGE = [(100, 10), (150, 20), (200, 5)]  # (input, output) tokens of each scripted turn


def region(page: str, pattern: str) -> str:
    found = re.search(pattern, page, re.S)
    assert found, pattern
    return found.group(1)


@pytest.fixture
def viewport() -> ViewportSize:
    """The run pages' screenshots are taken in a taller window than Playwright's default."""
    return {"width": 1280, "height": 900}


def register_rich(app: tether.App) -> None:
    """The workflow `rich`: a step with hostile and secret inputs, a step that fails once, a
    durable sleep that outlasts the inline wait, a child, and an approval."""
    app.engine.settings = dataclasses.replace(app.engine.settings, inline_wait_max=0.05)
    calls: list[int] = []

    @app.step()
    async def greet(name: str, api_key: str) -> dict[str, str]:
        return {"hello": name, "token": api_key, "long": "z" * 1000}

    @app.step(retry=tether.Retry(initial_delay=timedelta(milliseconds=50), jitter=0))
    async def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the first attempt fails")
        return "ok"

    @app.workflow()
    async def kid(n: int) -> int:
        return n + 1

    @app.workflow()
    async def rich() -> str:
        await greet(HOSTILE, SECRET_VALUE)
        await flaky()
        await tether.sleep(timedelta(milliseconds=300))
        await kid(1)
        decision = await tether.approval("Ship it?", reviewers=["group:sre"])
        return decision.status


async def pending(app: tether.App, run_id: str) -> tether.Approval:
    async with asyncio.timeout(10):
        while not (found := await app.list_approvals(run_id=run_id)):
            await asyncio.sleep(0.01)
    return found[0]


async def test_a_rich_runs_timeline_rows_match_its_history_with_inputs_and_outputs(
    app: tether.App,
    client: httpx.AsyncClient,
    admin: Person,
    alice: Person,
    page: Page,
    screenshots: Path,
) -> None:
    register_rich(app)
    handle = await app.start("rich", id="run-rich")
    asked = await pending(app, "run-rich")
    await sign_in(client, admin)
    waiting = (await client.get("/runs/run-rich")).text
    # The approval checkpoint is "completed" (the request is recorded): said to be pending.
    assert "asked: the approval is pending" in waiting
    assert "Approval pending: Ship it?" in waiting
    await app.decide(asked.id, "approve", reviewer=alice.user.reviewer,
                     operation_digest=asked.operation_digest)  # fmt: skip
    assert await handle.result(timeout=10) == "approved"
    response = await client.get("/runs/run-rich")
    assert response.status_code == 200
    text = response.text
    history = await handle.checkpoints()
    assert [c.kind for c in history] == ["step", "step", "sleep", "child", "join", "approval",
                                         "approval-wait"]  # fmt: skip

    svg = region(text, r'<section id="run-timeline"[^>]*>(.*?)</section>')
    assert len(re.findall(r'<svg\b[^>]*class="tl"', svg)) == 1
    rows = [int(s) for s in re.findall(r'<g[^>]*\bdata-seq="(\d+)"', svg)]
    listed = region(text, r'<ol class="timeline">(.*?)</ol>')
    items = re.findall(r'<li class="step step-(\w+)" data-seq="(\d+)" data-kind="([^"]+)"', listed)
    assert rows == [int(seq) for _, seq, _ in items] == [c.seq for c in history]
    assert [(status, kind) for status, _, kind in items] == [
        (str(c.status), c.kind) for c in history
    ]
    assert re.findall(r'<span class="step-name">(.*?)</span>', listed) == [c.name for c in history]
    assert "2 attempts" in listed  # the retried step
    child = "/runs/" + quote("run-rich/child:kid", safe="")
    assert f'href="{child}"' in region(text, r'<section id="run-children"[^>]*>(.*?)</section>')
    assert f'href="/approvals/{asked.id}"' in svg

    # Inputs and outputs, escaped and redacted; a long value folded with its start visible.
    assert "<img src=x" not in text
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in listed
    assert SECRET_VALUE not in text
    assert "[redacted]" in listed
    assert '<details class="fold">' in listed
    assert "&#34;ok&#34;" in listed  # the retried step's output
    assert "started " in listed
    assert "finished " in listed
    assert "Finished: succeeded" in text
    assert 'href="/static/timeline.css"' in text
    assert 'id="run-actions"' in text  # an admin sees the actions

    kid_page = (await client.get(child)).text
    assert 'id="run-parent" href="/runs/run-rich"' in kid_page

    # In Chromium: one drawn row per checkpoint, in the history's order, each on the axis (a
    # box of its own, right of the labels), the child's row a link that opens the child.
    await browser_sign_in(page, admin)
    await page.goto("/runs/run-rich")
    drawn = page.locator("#run-timeline svg.tl g[data-seq]")
    await expect(drawn).to_have_count(len(history))
    seqs = [int(await g.get_attribute("data-seq") or -1) for g in await drawn.all()]
    assert seqs == [c.seq for c in history]
    boxes = [await g.bounding_box() for g in await drawn.all()]
    assert all(b is not None and b["width"] > 0 and b["height"] > 0 for b in boxes)
    tops = [b["y"] for b in boxes if b is not None]
    assert tops == sorted(tops)  # top to bottom in the history's order
    listed_names = await page.locator("ol.timeline .step-name").all_inner_texts()
    assert listed_names == [c.name for c in history]
    await page.screenshot(path=screenshots / "run-page-timeline.png", full_page=True)
    async with page.expect_navigation():
        # On its bar, as a person clicks it (the link's box has room between label and bar).
        await page.locator(f'#run-timeline svg.tl a[href="{child}"] rect.tl-bar').first.click()
    await expect(page.locator("#run-parent")).to_have_attribute("href", "/runs/run-rich")


async def test_a_running_run_whose_worker_is_gone_says_its_owner_is_lost(tmp_path: Path) -> None:
    app = tether.App(f"sqlite:///{tmp_path / 'lost.db'}")

    @app.workflow()
    async def long() -> None:
        await tether.sleep(timedelta(hours=1))

    await app.open()  # no worker of this process: only the two below ever claim the run
    try:
        await app.start("long", id="run-lost")
        store, now = app.engine.store, app.engine.clock.now()
        # A worker claims it and dies (its lease runs out); another adopts it and dies too.
        assert [r.id for r in await store.claim_runs("w-first", ["long"], now, now + 0.001, 1)]
        adopted = await store.claim_runs("w-gone", ["long"], now + 0.002, now + 0.003, 1)
        assert [(r.owner, r.epoch) for r in adopted] == [("w-gone", 2)]
        while app.engine.clock.now() <= now + 0.003:  # until its lease has run out too
            await asyncio.sleep(0.001)
        admin, token = await add_user(app.engine, "root", frozenset({"admin"}))
        server = create_server(app, secret=SECRET)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=server),
                                     base_url=ORIGIN) as client:  # fmt: skip
            await sign_in(client, Person(admin, token))
            text = (await client.get("/runs/run-lost")).text
        state = region(text, r'<ul id="run-state"[^>]*>(.*?)</ul>')
        assert "owner w-gone is lost: the lease expired at" in state
        assert "adopted: claimed 2 times" in state
        assert (await app.list_runs())[0].status == "running"
    finally:
        await app.close()


async def waiting(app: tether.App, run_id: str) -> None:
    async with asyncio.timeout(10):
        while (await (await app.get(run_id)).status()) != "waiting":
            await asyncio.sleep(0.02)


async def tab_to(page: Page, target: Locator) -> None:
    """Press Tab until `target` has the focus."""
    for _ in range(200):
        await page.keyboard.press("Tab")
        if await target.evaluate("e => e === document.activeElement"):
            return
    pytest.fail(f"Tab never reached {target}")


async def test_an_admin_cancels_a_run_from_its_page_with_the_keyboard_after_confirming(
    app: tether.App, page: Page, admin: Person, screenshots: Path
) -> None:
    await start_approval(app, "run-cancel")
    await waiting(app, "run-cancel")
    await browser_sign_in(page, admin)
    await page.goto("/runs/run-cancel")
    ask = page.locator("#action-cancel a")
    await expect(ask).to_have_attribute(
        "aria-label", "Cancel run run-cancel: asks you to confirm first"
    )
    await tab_to(page, ask)
    await page.screenshot(path=screenshots / "run-page-before-cancel.png", full_page=True)
    async with page.expect_navigation():
        await page.keyboard.press("Enter")
    # The page that asks: this run, what cancelling does to it now; nothing is cancelled yet.
    assert urlsplit(page.url)[2:4] == ("/runs/run-cancel", "confirm=cancel")
    await expect(page.locator("h1")).to_have_text("Cancel this run?")
    await expect(page.locator("#cancel-run-id")).to_have_text("run-cancel")
    await expect(page.locator("#cancel-workflow")).to_have_text("ask")
    effects = page.locator("#cancel-effects")
    await expect(effects).to_contain_text("It is waiting: it ends cancelled now")
    await expect(effects).to_contain_text("Its pending approvals (1) end cancelled")
    await page.screenshot(path=screenshots / "run-page-cancel-confirm.png", full_page=True)
    assert str(await (await app.get("run-cancel")).status()) == "waiting"
    # "Keep the run" goes back, nothing changed; then confirm, by the keyboard again.
    await tab_to(page, page.locator("#keep-run"))
    async with page.expect_navigation():
        await page.keyboard.press("Enter")
    assert urlsplit(page.url)[2:4] == ("/runs/run-cancel", "")
    assert str(await (await app.get("run-cancel")).status()) == "waiting"
    await tab_to(page, ask)
    async with page.expect_navigation():
        await page.keyboard.press("Enter")
    confirm = page.locator("#confirm-cancel button")
    await expect(confirm).to_have_attribute("aria-label", "Yes, cancel run run-cancel")
    await tab_to(page, confirm)
    await page.keyboard.press("Enter")
    await expect(page.locator("#run-done")).to_contain_text("Cancel requested", timeout=WAIT_MS)
    badge = page.locator("#run-summary .badge").first
    await expect(badge).to_have_text("cancelled", timeout=WAIT_MS)
    assert str(await (await app.get("run-cancel")).status()) == "cancelled"
    await expect(page.locator("#action-cancel")).to_have_count(0)  # nothing left to cancel
    # The trail of actions shows who cancelled it, from where, through the page.
    trail = page.locator("#run-trail li")
    await expect(trail).to_have_count(1)
    await expect(trail.first.locator("strong")).to_have_text("cancel")
    await expect(trail.first.locator(".badge")).to_have_text("done")
    await expect(trail.first).to_contain_text("by root via page from 127.0.0.1")
    await page.screenshot(path=screenshots / "run-page-cancelled.png", full_page=True)


async def test_an_admin_forks_a_run_from_a_chosen_step_on_its_page_with_the_keyboard(
    app: tether.App, page: Page, admin: Person, screenshots: Path
) -> None:
    await start_approval(app, "run-fork")
    await waiting(app, "run-fork")
    await browser_sign_in(page, admin)
    await page.goto("/runs/run-fork")
    chosen = page.locator("#fork-step")
    await expect(chosen).to_have_value("prepare")  # the first step the run recorded
    options = await chosen.locator("option").all_inner_texts()
    assert options == ["prepare", options[1]]  # prepare, then the approval
    button = page.locator("#action-fork button")
    await expect(button).to_have_attribute("aria-label", "Fork run run-fork from the chosen step")
    await tab_to(page, button)
    async with page.expect_navigation():
        await page.keyboard.press("Enter")
    # The new run's page: said so, linked to the run it came from.
    await expect(page.locator("#run-done")).to_have_text("Forked: this is the new run.")
    new_id = unquote(urlsplit(page.url).path.removeprefix("/runs/"))
    assert new_id != "run-fork"
    info = await (await app.get(new_id)).info()
    assert info.fork is not None
    assert (info.fork.source_run_id, info.fork.from_step) == ("run-fork", "prepare")
    await expect(page.locator("main")).to_contain_text("forked from")
    await page.screenshot(path=screenshots / "run-page-forked.png", full_page=True)
    # The source run's trail says who forked it, from which step, into which run.
    await page.goto("/runs/run-fork")
    trail = page.locator("#run-trail li")
    await expect(trail).to_have_count(1)
    await expect(trail.first).to_contain_text(f"from step 'prepare': new run {new_id}")
    await expect(trail.first).to_contain_text("by root via page from 127.0.0.1")


async def test_the_cancel_confirmation_is_for_group_admin_and_its_post_needs_the_csrf_token(
    app: tether.App, client: httpx.AsyncClient, admin: Person, alice: Person, outsider: Person
) -> None:
    await start_approval(app, "job/cancel")  # an id ending as the action's path does
    await waiting(app, "job/cancel")
    here = "/runs/" + quote("job/cancel", safe="")
    await sign_in(client, admin)
    shown = await client.get(here)
    assert shown.status_code == 200
    assert 'id="run-summary"' in shown.text  # its own page: the question is asked by a query
    assert f'href="{here}?confirm=cancel"' in shown.text
    assert f'action="{here}/cancel"' not in shown.text  # the page itself cancels nothing
    asked = await client.get(f"{here}?confirm=cancel")
    assert asked.status_code == 200
    assert '<code id="cancel-run-id">job/cancel</code>' in asked.text
    assert '<dd id="cancel-workflow">ask</dd>' in asked.text
    assert "It is waiting: it ends cancelled now" in asked.text
    assert f'<form method="post" action="{here}/cancel" id="confirm-cancel"' in asked.text
    assert f'<a class="btn" href="{here}" id="keep-run"' in asked.text
    token = csrf_of(asked.text)
    # The POST is the action's, checked as before: no token, no cancel.
    refused = await client.post(f"{here}/cancel", data={"note": ""}, headers=SAME)
    assert refused.status_code == 403
    assert not (await (await app.get("job/cancel")).status()).terminal
    done = await client.post(f"{here}/cancel", data={"csrf": token}, headers=SAME)
    assert (done.status_code, done.headers["location"]) == (303, f"{here}?done=cancel")
    assert str(await (await app.get("job/cancel")).status()) == "cancelled"
    finished = await client.get(f"{here}?confirm=cancel")  # nothing left to cancel
    assert finished.status_code == 409
    assert "It has finished (cancelled): there is nothing to cancel." in finished.text
    assert 'id="confirm-cancel"' not in finished.text
    missing = await client.get("/runs/no-such-run?confirm=cancel")
    assert missing.status_code == 404

    await sign_in(client, alice)  # a reviewer of its approval: sees the run, may not cancel it
    assert (await client.get(here)).status_code == 200
    refused = await client.get(f"{here}?confirm=cancel")
    assert refused.status_code == 403
    assert "Only group admin may act on runs." in refused.text
    assert 'id="confirm-cancel"' not in refused.text
    await sign_in(client, outsider)  # may not see it: as if it did not exist
    assert (await client.get(f"{here}?confirm=cancel")).status_code == 404


async def test_the_confirmation_says_a_running_run_ends_at_its_next_await(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    await app.start("talk", ["a", "b", "c"], 30.0, id="run-talking")  # a step that sleeps
    async with asyncio.timeout(10):
        while (await (await app.get("run-talking")).status()) != "running":
            await asyncio.sleep(0.02)
    await sign_in(client, admin)
    asked = await client.get("/runs/run-talking?confirm=cancel")
    assert asked.status_code == 200
    assert re.search(r"It is running on worker \S+: it ends cancelled at its next await",
                     asked.text)  # fmt: skip
    await (await app.get("run-talking")).cancel()


async def test_a_reviewer_sees_no_actions_and_forged_posts_change_nothing(
    app: tether.App, client: httpx.AsyncClient, alice: Person, admin: Person
) -> None:
    ask = await start_approval(app, "run-guard")
    await sign_in(client, alice)
    page = await client.get("/runs/run-guard")
    assert page.status_code == 200
    assert 'id="run-actions"' not in page.text
    assert "/cancel" not in page.text
    assert "confirm=cancel" not in page.text
    token = csrf_of(page.text)  # the sign-out form's: a real token of alice's session
    refused = await client.post("/runs/run-guard/cancel", data={"csrf": token}, headers=SAME)
    assert refused.status_code == 403
    assert "Only group admin" in refused.text

    await sign_in(client, admin)
    token = csrf_of((await client.get("/runs/run-guard")).text)
    forged = [
        await client.post("/runs/run-guard/cancel", data={"note": ""}, headers=SAME),
        await client.post("/runs/run-guard/cancel", data={"csrf": "0" * 64}, headers=SAME),
        await client.post("/runs/run-guard/cancel", data={"csrf": token},
                          headers={"Origin": "https://evil.example"}),
    ]  # fmt: skip
    assert [r.status_code for r in forged] == [403, 403, 403]
    assert all("did not come from this inbox" in r.text for r in forged)
    assert not (await (await app.get("run-guard")).status()).terminal
    assert (await app.get_approval(ask.id)).status == "pending"


async def test_refused_actions_are_said_on_the_page_and_send_and_fork_work(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    await start_approval(app, "run-acts")
    await sign_in(client, admin)
    token = csrf_of((await client.get("/runs/run-acts")).text)
    resume = await client.post("/runs/run-acts/resume", data={"csrf": token}, headers=SAME)
    assert resume.status_code == 409  # a waiting run is not resumed: said, not a 500
    assert 'id="run-error"' in resume.text
    bad = {"csrf": token, "key": "go", "payload": "{not json <b>"}
    sent = await client.post("/runs/run-acts/send", data=bad, headers=SAME)
    assert sent.status_code == 409
    assert "the payload is not JSON" in sent.text
    assert "{not json &lt;b&gt;" in sent.text  # what was typed is kept, escaped
    good = {"csrf": token, "key": "go", "payload": '{"n": 1}'}
    sent = await client.post("/runs/run-acts/send", data=good, headers=SAME)
    assert (sent.status_code, sent.headers["location"]) == (303, "/runs/run-acts?done=send")
    assert "Event delivered." in (await client.get(sent.headers["location"])).text
    fork = await client.post("/runs/run-acts/fork", data={"csrf": token, "from_step": "prepare"},
                             headers=SAME)  # fmt: skip
    assert fork.status_code == 303
    new_id = fork.headers["location"].split("?")[0].removeprefix("/runs/")
    assert new_id != "run-acts"
    forked = await app.get(new_id)
    assert (await forked.info()).fork is not None
    shown = (await client.get(fork.headers["location"])).text
    assert "Forked: this is the new run." in shown
    assert "forked from" in shown
    unknown = await client.post("/runs/run-acts/fork", data={"csrf": token, "from_step": "nope"},
                                headers=SAME)  # fmt: skip
    assert unknown.status_code == 409
    assert "recorded no step" in unknown.text


class Metered:
    """The scripted model, reporting usage and a model name as a provider does."""

    name = "metered"

    def __init__(self, turns: list[Any]) -> None:
        self.script = Scripted(turns)

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelResponse:
        response = await self.script.complete(request, emit)
        tokens_in, tokens_out = USAGE[sum(m["role"] == "assistant" for m in request.messages)]
        usage = {"input_tokens": tokens_in, "output_tokens": tokens_out}
        return dataclasses.replace(response, usage=usage, model="metered-1")


async def test_an_agent_run_shows_its_conversation_with_tokens_and_the_tool_approval(
    app: tether.App, page: Page, client: httpx.AsyncClient, admin: Person, screenshots: Path
) -> None:
    turns: list[Any] = [
        [ToolCall("search_docs", {"query": "deploy"})],
        [ToolCall("deploy", {"version": HOSTILE, "api_key": SECRET_VALUE})],
        "Deployed 1.2.3.",
    ]

    @app.tool()
    async def search_docs(query: str) -> str:
        """Search the runbooks."""
        return "x" * 3000  # folded on the page

    @app.tool(needs_approval=True, reviewers=["alice"])
    async def deploy(version: str, api_key: str) -> str:
        """Deploy a version."""
        return f"deployed {version}"

    agent = tether.Agent(Metered(turns), "You deploy things.", [search_docs, deploy])

    @app.workflow()
    async def assistant(request: str) -> str:
        return (await agent.run(request)).output

    handle = await app.start("assistant", "deploy 1.2.3", id="run-agent")
    ask = await pending(app, "run-agent")
    await app.decide(ask.id, "approve", reviewer="alice", operation_digest=ask.operation_digest,
                     comment="go ahead")  # fmt: skip
    assert await handle.result(timeout=10) == "Deployed 1.2.3."

    await browser_sign_in(page, admin)
    await page.goto("/runs/run-agent")
    talk = page.locator("#run-conversation")
    await expect(talk.locator("h2")).to_have_text("Conversation")
    turns_shown = talk.locator("ol.conversation > li")
    kinds = [(await t.get_attribute("class") or "").split()[1] for t in await turns_shown.all()]
    assert kinds == ["turn-message", "turn-model_call", "turn-tool_call", "turn-model_call",
                     "turn-approval", "turn-tool_call", "turn-model_call",
                     "turn-message"]  # fmt: skip
    tokens = [await t.text_content() for t in await talk.locator(".tokens").all()]
    assert tokens == [f"tokens in {i}, out {o}" for i, o in USAGE]
    approval = talk.locator(".turn-approval")
    await expect(approval).to_contain_text("approval before deploy")
    await expect(approval.locator(".badge")).to_have_text("approved")
    await expect(approval).to_contain_text("by alice")
    await expect(approval.locator("blockquote")).to_have_text("go ahead")
    await expect(page.locator("#conversation-totals")).to_contain_text("tokens in 450, out 35")
    await expect(talk).to_contain_text("Deployed 1.2.3.")
    assert "cost" not in (await page.locator("#conversation-totals").text_content() or "")
    html = await page.content()
    assert SECRET_VALUE not in html
    assert "<img src=x" not in html
    assert await page.evaluate("document.querySelectorAll('img').length") == 0
    # The long tool result is folded: its start shows, the rest opens by keyboard.
    fold = talk.locator(".turn-tool_call details.fold").first
    await expect(fold).not_to_have_attribute("open", "")
    await fold.locator("summary").focus()
    await page.keyboard.press("Enter")
    await expect(fold).to_have_attribute("open", "")
    await page.screenshot(path=screenshots / "run-page-agent.png", full_page=True)

    # The same transcript as JSON, for a bearer token, with the API's access rule.
    token = await add_user(app.engine, "robot", frozenset({"admin"}))
    bearer = {"Authorization": f"Bearer {token[1]}"}
    doc = (await client.get("/api/runs/run-agent/transcript", headers=bearer)).json()
    assert [e["kind"] for e in doc["entries"]][:3] == ["message", "model_call", "tool_call"]
    assert doc["totals"]["tokens_in"] == 450
    assert SECRET_VALUE not in str(doc)
    outsider = await add_user(app.engine, "eve", frozenset({"finance"}))
    hidden = await client.get("/api/runs/run-agent/transcript",
                              headers={"Authorization": f"Bearer {outsider[1]}"})  # fmt: skip
    assert hidden.status_code == 404
    assert (await client.get("/api/runs/run-agent/transcript")).status_code == 401
    schema = (await client.get("/openapi.json", headers=bearer)).json()
    assert "/api/runs/{run_id}/transcript" in schema["paths"]


async def test_the_page_keeps_the_regions_live_updates_swap_and_hides_unknown_runs(
    app: tether.App, client: httpx.AsyncClient, alice: Person
) -> None:
    """The regions inbox.js swaps (by id) are on every rendering of the page, so a live update
    never has to reload it; and a run the viewer may not see is a 404 page, not a 500."""
    await start_approval(app, "run-regions")
    await sign_in(client, alice)
    text = (await client.get("/runs/run-regions")).text
    regions = re.findall(r'<section id="([\w-]+)"[^>]*data-region', text)
    assert regions == ["run-summary", "run-timeline", "run-steps", "run-approvals",
                       "run-values", "run-children"]  # fmt: skip
    missing = await client.get("/runs/" + quote("no/such run", safe=""))
    assert missing.status_code == 404

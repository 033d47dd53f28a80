"""The inbox in a real browser (headless Chromium through Playwright) against uvicorn on
127.0.0.1: a reviewer signs in by pasting the token, opens the approval and approves it, and the
run completes; the inbox updates live; markup in approvals never runs; the page's script works
under the CSP without a single violation; signing out ends the session on the server, so the
cookie a thief copied before opens nothing. Without /usr/bin/chromium these tests skip loudly, and
fail in CI (CI=true)."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.async_api import Browser, ConsoleMessage, Page, expect
from tests.server.kit import WAIT_MS, LiveServer, Person, browser_sign_in, start_approval

import tether
from tether.server.auth import SESSION_COOKIE

pytestmark = pytest.mark.timeout(60)


async def test_a_reviewer_signs_in_opens_the_approval_approves_it_and_the_run_completes(
    app: tether.App, page: Page, alice: Person, problems: list[str]
) -> None:
    ask = await start_approval(app, "run-click")
    await browser_sign_in(page, alice)
    item = page.locator(f'[data-approval-id="{ask.id}"]')
    await expect(item).to_contain_text("Deploy 1.2.3 to prod?")
    # The countdown is live (the script runs under the CSP).
    await expect(item.locator(".countdown")).to_have_text(re.compile(r"expires in (59|60)m"))
    await item.locator("a.item-title").click()
    await expect(page.locator("h1.title")).to_have_text("Deploy 1.2.3 to prod?")
    await expect(page.locator("#digest")).to_have_text(ask.operation_digest)
    await page.fill("#comment", "looks good")
    await page.click("button[name=option][value=approve]")
    await expect(page.locator(".decision")).to_contain_text("Approved by alice", timeout=WAIT_MS)
    result = await (await app.get("run-click")).result(timeout=10)
    assert (result["status"], result["reviewer"], result["comment"]) == (
        "approved", "alice", "looks good")  # fmt: skip
    assert result["act"] == "did 1.2.3"
    assert problems == []


async def test_the_open_inbox_shows_a_new_approval_without_a_reload(
    app: tether.App, page: Page, alice: Person, problems: list[str]
) -> None:
    await browser_sign_in(page, alice)
    await expect(page.locator(".empty")).to_contain_text("Nothing is waiting for you.")
    await page.wait_for_selector("body[data-connected]", timeout=WAIT_MS)
    await page.evaluate("window.__still_here = 'yes'")
    ask = await start_approval(app, "run-arrives", title="Rotate the keys?")
    item = page.locator(f'[data-approval-id="{ask.id}"]')
    await expect(item).to_contain_text("Rotate the keys?", timeout=WAIT_MS)
    assert await page.evaluate("window.__still_here") == "yes"  # the same document: no reload
    assert await page.evaluate("document.body.dataset.refreshed") == "1"
    # A decision elsewhere takes it out of the open inbox, again without a reload.
    await app.decide(ask.id, "reject", reviewer=alice.user.reviewer,
                     operation_digest=ask.operation_digest)  # fmt: skip
    await expect(item).to_have_count(0, timeout=WAIT_MS)
    assert await page.evaluate("window.__still_here") == "yes"
    assert problems == []


async def test_markup_in_an_approval_never_runs_in_the_browser(
    app: tether.App, page: Page, alice: Person, problems: list[str]
) -> None:
    title = '<img src=x onerror="window.__pwned=1">'
    description = "<script>window.__pwned=1</script>"
    ask = await start_approval(app, "run-xss", title=title, description=description,
                               context={"html": title + description})  # fmt: skip
    await browser_sign_in(page, alice)
    await expect(page.locator(f'[data-approval-id="{ask.id}"] a.item-title')).to_have_text(title)
    assert await page.evaluate("typeof window.__pwned") == "undefined"
    await page.goto(f"/approvals/{ask.id}")
    await expect(page.locator("h1.title")).to_have_text(title)
    await expect(page.locator(".prose")).to_have_text(description)
    assert await page.locator("img").count() == 0
    assert await page.locator("main script").count() == 0
    await page.wait_for_timeout(300)  # time for anything that would fire
    assert await page.evaluate("typeof window.__pwned") == "undefined"
    assert problems == []


async def test_a_run_page_shows_its_output_live_and_again_after_a_reload(
    app: tether.App, page: Page, admin: Person, problems: list[str]
) -> None:
    words = [f"w{n} " for n in range(30)]
    await browser_sign_in(page, admin)
    handle = await app.start("talk", words, 0.1, id="run-talk")
    await page.goto("/runs/run-talk")
    await page.evaluate("window.__still_here = 'yes'")
    output = page.locator("#run-stream .stream-text")
    await expect(output).to_contain_text("w0 ", timeout=WAIT_MS)
    assert not (await handle.status()).terminal  # the output arrived while the run went on
    await expect(page.locator("#run-stream")).to_have_attribute("data-ended", "1",
                                                                 timeout=WAIT_MS)  # fmt: skip
    assert await handle.result(timeout=10) == 30
    assert await output.text_content() == "".join(words)
    assert await page.evaluate("window.__still_here") == "yes"
    await page.reload()  # a new page reads the stream from its start
    await expect(output).to_have_text("".join(words), timeout=WAIT_MS)
    assert problems == []


async def test_after_signing_out_in_the_browser_the_old_cookie_is_refused(
    app: tether.App, page: Page, live_server: LiveServer, alice: Person, problems: list[str]
) -> None:
    ask = await start_approval(app, "run-signout")
    await browser_sign_in(page, alice)
    cookies = await page.context.cookies()
    stolen = next(c["value"] for c in cookies if c["name"] == SESSION_COOKIE)
    await page.click("form[action='/logout'] button[type=submit]")
    await page.wait_for_selector("#signin", timeout=WAIT_MS)
    assert not [c for c in await page.context.cookies() if c["name"] == SESSION_COOKIE]
    # The cookie copied before the sign-out, put back as a thief would: refused by the server.
    await page.context.add_cookies(
        [{"name": SESSION_COOKIE, "value": stolen, "url": live_server.url}]
    )
    await page.goto(f"/approvals/{ask.id}")
    await expect(page.locator("#signin")).to_be_visible()
    assert "/?next=" in page.url
    assert await page.locator(f'[data-approval-id="{ask.id}"]').count() == 0
    async with httpx.AsyncClient(base_url=live_server.url) as thief:
        thief.cookies.set(SESSION_COOKIE, stolen)
        assert 'action="/login"' in (await thief.get("/")).text
    assert (await app.get_approval(ask.id)).status == "pending"
    assert problems == []


async def test_a_run_pages_live_output_shows_invisible_characters_spelled_out(
    app: tether.App, page: Page, admin: Person, problems: list[str]
) -> None:
    await browser_sign_in(page, admin)
    handle = await app.start("talk", ["pay ", "\u202egpj.exe", "\u200b\x1b[2J"], 0.0, id="run-bidi")
    assert await handle.result(timeout=10) == 3
    await page.goto("/runs/run-bidi")
    output = page.locator("#run-stream .stream-text")
    await expect(output).to_have_text("pay <U+202E>gpj.exe<U+200B><U+001B>[2J", timeout=WAIT_MS)
    assert problems == []


async def test_a_reviewer_signs_in_with_openid_connect_and_lands_signed_in(
    app: tether.App, browser: Browser, problems: list[str]
) -> None:
    """The provider on another site (localhost, Tether on 127.0.0.1): the callback's page
    moves on same-site, so the SameSite=Strict session cookie goes with the next request."""
    from tests.server.issuer import CLIENT_ID, CLIENT_SECRET, issuing
    from tests.server.kit import SECRET, serving

    from tether.server import OidcConfig, create_server
    from tether.users import add_user

    await add_user(app.engine, "alice@example.com", frozenset({"sre"}))
    async with issuing() as issuer:
        issuer.url = issuer.url.replace("127.0.0.1", "localhost")
        issuer.claims = {"email": "alice@example.com", "email_verified": True}
        issuer.interactive = True  # the way back starts on the provider's page: cross-site
        oidc = OidcConfig(issuer.url, CLIENT_ID, CLIENT_SECRET, name="Example SSO")
        async with serving(create_server(app, secret=SECRET, oidc=oidc)) as live:
            context = await browser.new_context(base_url=live.url)
            page = await context.new_page()

            def note(message: ConsoleMessage) -> None:  # Tether's pages, not the provider's
                if message.type == "error" and message.location["url"].startswith(live.url):
                    problems.append(message.text)

            page.on("console", note)
            try:
                await page.goto("/runs")  # signed out: to the sign-in page, next=/runs
                await page.click("#signin-oidc")
                await page.click("#consent")
                await page.wait_for_selector("h1:text('Runs')", timeout=WAIT_MS)
                assert page.url == f"{live.url}/runs"
                await expect(page.locator(".who-name")).to_have_text("alice@example.com")
            finally:
                await context.close()
    assert problems == []

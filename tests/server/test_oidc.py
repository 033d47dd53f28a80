"""Sign-in to the inbox by OpenID Connect against a local provider (tests/server/issuer.py) on
127.0.0.1: the whole flow by hand with httpx (Tether over ASGI, the provider over uvicorn), and
every way it must fail: a wrong state, a replayed code, a wrong nonce, a token signed by
another key, another audience, an expired token, an unknown user, hostile claim text; the
groups of a groups claim; the CSRF token still required on decisions."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from joserfc.jwk import RSAKey
from tests.server.issuer import CLIENT_ID, CLIENT_SECRET, Issuer, issuing
from tests.server.kit import ORIGIN, SECRET, start_approval

import tether
from tether.errors import ConfigurationError
from tether.server import OidcConfig, create_server
from tether.server.auth import SESSION_COOKIE
from tether.users import add_user

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def issuer() -> AsyncIterator[Issuer]:
    async with issuing() as made:
        made.claims = {"email": "alice@example.com", "email_verified": True}
        yield made


def config(issuer: Issuer, **changes: Any) -> OidcConfig:
    return OidcConfig(issuer.url, CLIENT_ID, CLIENT_SECRET, name="Example SSO", **changes)


@pytest.fixture
async def alice_sso(app: tether.App) -> None:
    await add_user(app.engine, "alice@example.com", frozenset({"sre"}))


async def tether_client(app: tether.App, oidc: OidcConfig) -> httpx.AsyncClient:
    server = create_server(app, secret=SECRET, oidc=oidc)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=server), base_url=ORIGIN)


async def to_provider(client: httpx.AsyncClient, path: str = "/login/oidc") -> str:
    """Start the flow; the provider's answer: the callback URL with code and state."""
    started = await client.get(path)
    assert started.status_code == 303, started.text
    assert started.headers["location"].startswith("http://127.0.0.1:")
    async with httpx.AsyncClient() as browser:
        answered = await browser.get(started.headers["location"])
    assert answered.status_code == 302
    return answered.headers["location"]


def with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()} | changes
    return parts._replace(query="&".join(f"{k}={v}" for k, v in query.items())).geturl()


@pytest.mark.usefixtures("alice_sso")
async def test_a_user_signs_in_with_the_provider_and_gets_the_usual_session(
    app: tether.App, issuer: Issuer
) -> None:
    async with await tether_client(app, config(issuer)) as client:
        page = await client.get("/")
        assert 'href="/login/oidc?next=%2F"' in page.text
        assert "Sign in with Example SSO" in page.text
        assert 'id="token"' in page.text  # the token form stays beside it
        callback = await to_provider(client, "/login/oidc?next=/runs")
        assert callback.startswith(f"{ORIGIN}/login/oidc/callback?")
        done = await client.get(callback)
        assert done.status_code == 200, done.text
        # A same-site refresh, not a redirect: the Strict cookie goes with the next request.
        assert 'http-equiv="refresh" content="0; url=/runs"' in done.text
        cookie = done.headers["set-cookie"]
        assert SESSION_COOKIE in cookie
        assert "SameSite=strict" in cookie
        assert "HttpOnly" in cookie
        home = await client.get("/")
        assert "alice@example.com" in home.text
        assert "groups: sre" in home.text


@pytest.mark.usefixtures("alice_sso")
async def test_a_callback_with_another_state_is_refused(app: tether.App, issuer: Issuer) -> None:
    async with await tether_client(app, config(issuer)) as client:
        callback = await to_provider(client)
        refused = await client.get(with_query(callback, state="forged"))
        assert refused.status_code == 400
        assert "the state does not match" in refused.text
        assert SESSION_COOKIE not in refused.headers.get("set-cookie", "")
        assert issuer.codes
        assert not any(c["used"] for c in issuer.codes.values())


@pytest.mark.usefixtures("alice_sso")
async def test_a_replayed_callback_or_code_opens_nothing(app: tether.App, issuer: Issuer) -> None:
    async with await tether_client(app, config(issuer)) as client:
        callback = await to_provider(client)
        flow = client.cookies.get("tether_oidc")
        assert (await client.get(callback)).status_code == 200
        client.cookies.set("tether_oidc", flow or "", path="/login/oidc")  # a copied cookie
        again = await client.get(callback)
        assert again.status_code == 400
        assert "already used" in again.text
        # The old code in a new flow: the provider refuses it (used, and PKCE binds it).
        client.cookies.delete("tether_oidc")
        fresh = await to_provider(client)
        replayed = await client.get(with_query(fresh, code=parse_qs(urlsplit(callback).query)
                                               ["code"][0]))  # fmt: skip
        assert replayed.status_code == 401
        assert issuer.refused == ["code"]


@pytest.mark.parametrize(
    ("tamper", "why"),
    [
        ({"nonce": "another"}, "nonce"),
        ({"aud": "another-client"}, "aud"),
        ({"exp": 1_000_000_000, "iat": 999_999_000}, "expired"),
        ({"iss": "https://evil.example"}, "iss"),
    ],
    ids=["wrong-nonce", "wrong-audience", "expired", "wrong-issuer"],
)
@pytest.mark.usefixtures("alice_sso")
async def test_an_id_token_whose_claims_do_not_hold_is_refused(
    app: tether.App, issuer: Issuer, tamper: dict[str, Any], why: str
) -> None:
    issuer.tamper = tamper
    async with await tether_client(app, config(issuer)) as client:
        refused = await client.get(await to_provider(client))
        assert refused.status_code == 401, refused.text
        assert "identity token was refused" in refused.text
        assert why in refused.text.lower()
        assert SESSION_COOKIE not in refused.headers.get("set-cookie", "")


@pytest.mark.parametrize("kid", ["k1", "unknown"], ids=["same-key-id", "unknown-key-id"])
@pytest.mark.usefixtures("alice_sso")
async def test_an_id_token_signed_by_another_key_is_refused(
    app: tether.App, issuer: Issuer, kid: str
) -> None:
    issuer.sign_with = RSAKey.generate_key(2048, {"kid": kid})
    async with await tether_client(app, config(issuer)) as client:
        refused = await client.get(await to_provider(client))
        assert refused.status_code == 401, refused.text
        assert (await client.get("/")).text.count('id="token"') == 1  # still signed out


async def test_an_unknown_user_is_refused_with_a_page_and_a_log_line_without_secrets(
    app: tether.App, issuer: Issuer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "tether.server")
    async with await tether_client(app, config(issuer)) as client:
        callback = await to_provider(client)
        refused = await client.get(callback)
    assert refused.status_code == 403
    assert "Not a reviewer here" in refused.text
    assert "tether users add alice@example.com --group" in refused.text
    logged = caplog.text
    assert "alice@example.com" in logged
    code = parse_qs(urlsplit(callback).query)["code"][0]
    for secret in (code, CLIENT_SECRET, flow_secret(callback)):
        assert secret not in logged


def flow_secret(callback: str) -> str:
    return parse_qs(urlsplit(callback).query)["state"][0]


async def test_hostile_claim_text_is_escaped_on_the_refusal_page(
    app: tether.App, issuer: Issuer
) -> None:
    issuer.claims = {"email": '<script>alert(1)</script>"\u202eexe.gpj'}
    async with await tether_client(app, config(issuer)) as client:
        refused = await client.get(await to_provider(client))
    assert refused.status_code == 403
    assert "<script>alert" not in refused.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in refused.text
    assert "\u202e" not in refused.text
    assert "U+202E" in refused.text


@pytest.mark.usefixtures("alice_sso")
async def test_an_unverified_email_is_refused(app: tether.App, issuer: Issuer) -> None:
    issuer.claims = {"email": "alice@example.com", "email_verified": False}
    async with await tether_client(app, config(issuer)) as client:
        refused = await client.get(await to_provider(client))
    assert refused.status_code == 403
    assert "not verified" in refused.text


async def test_a_groups_claim_gives_the_session_its_groups_and_the_user_must_still_exist(
    app: tether.App, issuer: Issuer
) -> None:
    await add_user(app.engine, "carol", frozenset({"finance"}))
    issuer.claims = {"preferred_username": "carol", "roles": ["sre", "bad group!"]}
    oidc = config(issuer, username_claim="preferred_username", groups_claim="roles")
    approval = await start_approval(app, "r-groups", reviewers=["group:sre"])
    async with await tether_client(app, oidc) as client:
        assert (await client.get(await to_provider(client))).status_code == 200
        home = await client.get("/")
        assert "groups: sre" in home.text
        assert approval.id in home.text
        issuer.claims = {"preferred_username": "dave", "roles": ["admin"]}
        refused = await client.get(await to_provider(client))
        assert refused.status_code == 403  # the provider cannot create users


@pytest.mark.usefixtures("alice_sso")
async def test_decisions_after_an_oidc_sign_in_still_need_the_csrf_token(
    app: tether.App, issuer: Issuer
) -> None:
    approval = await start_approval(app, "r-csrf")
    async with await tether_client(app, config(issuer)) as client:
        assert (await client.get(await to_provider(client))).status_code == 200
        form = {"option": "approve", "operation_digest": approval.operation_digest}
        forged = await client.post(f"/approvals/{approval.id}/decision", data=form,
                                   headers={"Origin": ORIGIN})  # fmt: skip
        assert forged.status_code == 403
    assert (await app.list_approvals(run_id="r-csrf"))[0].status == "pending"


def test_a_configuration_that_would_run_weakly_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="https"):
        OidcConfig("http://idp.example.com", "id", "secret")
    with pytest.raises(ConfigurationError, match="TETHER_OIDC_CLIENT_SECRET"):
        OidcConfig("https://idp.example.com", "id", "")
    assert "hunter2" not in repr(OidcConfig("https://idp.example.com", "id", "hunter2-xyz"))


def test_serve_takes_the_client_secret_from_the_environment_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tether.cli.serve import sign_in_settings

    given = {"issuer": "https://idp.example.com", "client_id": "tether",
             "username_claim": "email", "groups_claim": None, "user_header": None,
             "groups_header": None, "proxies": ()}  # fmt: skip
    monkeypatch.delenv("TETHER_OIDC_CLIENT_SECRET", raising=False)
    with pytest.raises(ConfigurationError, match=r"\$TETHER_OIDC_CLIENT_SECRET"):
        sign_in_settings(**given)  # type: ignore[arg-type]
    monkeypatch.setenv("TETHER_OIDC_CLIENT_SECRET", "from-the-env")
    made = sign_in_settings(**given)  # type: ignore[arg-type]
    assert made.oidc is not None
    assert made.oidc.client_secret == "from-the-env"
    with pytest.raises(ConfigurationError, match="--oidc-client-id"):
        sign_in_settings(**{**given, "client_id": None})  # type: ignore[arg-type]


def test_without_authlib_serve_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from tether.server.oidc import check_installed

    monkeypatch.setitem(sys.modules, "authlib.oidc.core", None)
    with pytest.raises(ConfigurationError, match=re.escape("pip install 'tether[oidc]'")):
        check_installed()


def test_the_server_without_oidc_imports_none_of_the_oidc_extra() -> None:
    code = ("import sys, tether.server; print(','.join(m for m in ('httpx', 'authlib', 'joserfc')"
            " if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""

"""Sign-in by a login proxy's header: believed only from the configured proxies' addresses (the
TCP peer, recorded before uvicorn's proxy handling rewrites the client), for existing users
only, per request and without a session; ignored (and logged once) from anyone else; the CSRF
token still required on decisions; without the header, tokens work as before."""

from __future__ import annotations

import logging
import re

import httpx
import pytest
from fastapi import FastAPI
from tests.server.kit import ORIGIN, SECRET, Person, sign_in, start_approval
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

import tether
from tether.errors import ConfigurationError
from tether.server import DirectPeer, TrustedHeader, create_server
from tether.server.auth import SESSION_COOKIE

pytestmark = pytest.mark.timeout(30)

PROXY = "10.1.2.3"
HEADER = {"X-Forwarded-User": "alice"}


def server(app: tether.App, **changes: object) -> FastAPI:
    trusted = TrustedHeader(proxies=["10.1.0.0/16", "fd00::/8"], **changes)  # type: ignore[arg-type]
    return create_server(app, secret=SECRET, trusted_header=trusted)


def client(asgi: object, peer: str = PROXY) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=asgi, client=(peer, 40000))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url=ORIGIN)


@pytest.mark.usefixtures("alice")
async def test_the_proxy_signs_in_an_existing_user_for_each_request_without_a_session(
    app: tether.App,
) -> None:
    async with client(server(app)) as proxy:
        home = await proxy.get("/", headers=HEADER)
        assert home.status_code == 200
        assert "alice" in home.text
        assert "groups: sre" in home.text
        assert 'action="/logout"' not in home.text  # signing out is the proxy's
        assert SESSION_COOKIE not in home.headers.get("set-cookie", "")
        assert 'id="token"' in (await proxy.get("/")).text  # the next request without it


@pytest.mark.usefixtures("alice")
async def test_the_header_from_any_other_address_is_ignored_and_logged_once(
    app: tether.App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "tether.server")
    async with client(server(app), peer="192.0.2.7") as outsider:
        for _ in range(3):
            page = await outsider.get("/", headers=HEADER)
            assert page.status_code == 200
            assert 'id="token"' in page.text
    lines = [r for r in caplog.records if "no trusted proxy" in r.getMessage()]
    assert len(lines) == 1
    assert "192.0.2.7" in lines[0].getMessage()


async def test_a_header_naming_no_user_is_refused(app: tether.App) -> None:
    async with client(server(app)) as proxy:
        refused = await proxy.get("/", headers={"X-Forwarded-User": "mallory"})
        assert refused.status_code == 403
        assert "Not a reviewer here" in refused.text
        twice = await proxy.get("/", headers=[("X-Forwarded-User", "a"), ("X-Forwarded-User", "b")])
        assert twice.status_code == 403


@pytest.mark.usefixtures("alice")
async def test_a_groups_header_replaces_the_users_groups(app: tether.App) -> None:
    async with client(server(app, groups_header="X-Forwarded-Groups"), peer="fd00::1") as proxy:
        home = await proxy.get("/", headers={**HEADER, "X-Forwarded-Groups": "ops, sre ,<b>"})
        assert "groups: ops, sre" in home.text


async def test_decisions_through_the_proxy_still_need_the_csrf_token(
    app: tether.App, alice: Person
) -> None:
    approval = await start_approval(app, "r-proxy")
    path = f"/approvals/{approval.id}/decision"
    form = {"option": "approve", "operation_digest": approval.operation_digest}
    async with client(server(app)) as proxy:
        headers = {**HEADER, "Origin": ORIGIN}
        assert (await proxy.post(path, data=form, headers=headers)).status_code == 403
        assert (await app.list_approvals(run_id="r-proxy"))[0].status == "pending"
        page = await proxy.get(f"/approvals/{approval.id}", headers=HEADER)
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert csrf
        decided = await proxy.post(path, data={**form, "csrf": csrf.group(1)}, headers=headers)
        assert decided.status_code == 303
    assert (await app.list_approvals(run_id="r-proxy", status=None))[0].status == "approved"


async def test_without_the_header_tokens_sign_in_as_before(app: tether.App, bob: Person) -> None:
    async with client(server(app)) as proxy:
        await sign_in(proxy, bob)
        assert "bob" in (await proxy.get("/")).text


@pytest.mark.usefixtures("alice")
async def test_the_peer_is_the_proxy_itself_not_the_forwarded_client(app: tether.App) -> None:
    """Behind uvicorn's proxy handling the scope's client is the forwarded one; DirectPeer,
    outside it (as `tether serve` puts it), keeps the TCP peer for this check."""
    forwarded = {**HEADER, "X-Forwarded-For": "203.0.113.9"}
    resolved = ProxyHeadersMiddleware(server(app), trusted_hosts=PROXY)
    async with client(resolved) as proxy:
        assert 'id="token"' in (await proxy.get("/", headers=forwarded)).text  # fails closed
    async with client(DirectPeer(resolved)) as proxy:
        assert "groups: sre" in (await proxy.get("/", headers=forwarded)).text
    # A client that claims to be the proxy in X-Forwarded-For is still itself.
    spoofed = {**HEADER, "X-Forwarded-For": PROXY}
    async with client(DirectPeer(ProxyHeadersMiddleware(server(app), trusted_hosts="*")),
                      peer="192.0.2.7") as outsider:  # fmt: skip
        assert 'id="token"' in (await outsider.get("/", headers=spoofed)).text


def test_a_trusted_header_needs_its_proxies() -> None:
    with pytest.raises(ConfigurationError, match="proxies"):
        TrustedHeader(proxies=[])
    with pytest.raises(ConfigurationError, match="not an address"):
        TrustedHeader(proxies=["example.com"])
    with pytest.raises(ConfigurationError, match="header name"):
        TrustedHeader(proxies=["10.0.0.1"], user_header="X User")


def test_serve_wants_the_proxies_with_the_header_and_keeps_the_peer_behind_proxies() -> None:
    from tether.cli.serve import server_config, sign_in_settings

    given = {"issuer": None, "client_id": None, "username_claim": "email", "groups_claim": None,
             "user_header": "X-Forwarded-User", "groups_header": None, "proxies": ()}  # fmt: skip
    with pytest.raises(ConfigurationError, match="--trusted-proxy"):
        sign_in_settings(**given)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="--trusted-user-header"):
        sign_in_settings(**{**given, "user_header": None, "proxies": (PROXY,)})  # type: ignore[arg-type]
    made = sign_in_settings(**{**given, "proxies": (PROXY,)})  # type: ignore[arg-type]
    assert made.trusted is not None
    assert made.trusted.trusts(PROXY)
    echo = FastAPI()
    config = server_config(echo, "0.0.0.0", 8000, secure=True, direct_peer=True)
    assert not config.proxy_headers
    assert isinstance(config.app, DirectPeer)
    assert isinstance(config.app.app, ProxyHeadersMiddleware)


@pytest.mark.usefixtures("alice")
async def test_revoking_the_user_refuses_the_proxys_very_next_request(app: tether.App) -> None:
    from tether.users import revoke_user

    async with client(server(app)) as proxy:
        assert "groups: sre" in (await proxy.get("/", headers=HEADER)).text
        await revoke_user(app.engine, "alice")
        assert (await proxy.get("/", headers=HEADER)).status_code == 403

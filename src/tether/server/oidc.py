"""Sign-in to the inbox by OpenID Connect: the authorization code flow with PKCE, state and
nonce (GET /login/oidc, GET /login/oidc/callback); the id token is checked by joserfc and
authlib (signature by the issuer's JWKS, issuer, audience, expiry, nonce), its claim names an
existing Tether user, and the inbox's usual session follows. It creates no user, and never
stores or logs a code, a token, the client secret or the flow's secrets.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote, urlencode, urlsplit

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from tether.app import App
from tether.errors import ConfigurationError
from tether.server.auth import SESSION_COOKIE, Auth, SignInRefused
from tether.server.http import Site, origin
from tether.server.inbox import Inbox, local_path
from tether.text import visible
from tether.users import check_name, get_user

if TYPE_CHECKING:  # httpx is the [oidc] extra's, like authlib: imported when signing in
    import httpx

FLOW_COOKIE = "tether_oidc"
FLOW_SECONDS = 600  # a sign-in at the identity provider must come back within this
LEEWAY = 60  # seconds of clock skew allowed on exp, iat and nbf
# Asymmetric signatures only: never "none", never HS256 (keyed with a secret the client has).
SAFE_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
                   "ES512", "EdDSA")  # fmt: skip
INSTALL = "pip install 'tether[oidc]'"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")

log = logging.getLogger("tether.server")


class ProviderError(ValueError):
    """The identity provider answered something a sign-in cannot use."""


@dataclass(frozen=True)
class OidcConfig:
    """An OpenID Connect provider the inbox signs people in with. `issuer` is its URL exactly
    as its discovery document names it (https, or http on loopback for tests); the client is
    registered there with the redirect URI `<origin>/login/oidc/callback`. `username_claim`
    names the Tether user; `groups_claim`, when set, gives the session its groups (trusting
    whoever manages groups at the provider, `admin` included). `name` is shown on the
    sign-in page (default: the issuer's host)."""

    issuer: str
    client_id: str
    client_secret: str = field(repr=False)
    scopes: Sequence[str] = ("openid", "email", "profile")
    username_claim: str = "email"
    groups_claim: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        parts = urlsplit(self.issuer)
        secure = parts.scheme == "https" or (parts.scheme == "http" and parts.hostname in _LOOPBACK)
        if not secure or not parts.hostname or parts.query or parts.fragment:
            raise ConfigurationError(
                f"the OIDC issuer {self.issuer!r} must be an https URL without query or "
                f"fragment (http only on loopback, for tests)"
            )
        if not self.client_id or not self.client_secret:
            raise ConfigurationError(
                "OIDC needs the client id (--oidc-client-id) and its secret "
                "(TETHER_OIDC_CLIENT_SECRET)"
            )
        if "openid" not in self.scopes:
            raise ConfigurationError("the OIDC scopes must include 'openid'")

    @property
    def shown_name(self) -> str:
        return self.name or urlsplit(self.issuer).hostname or self.issuer


def check_installed() -> None:
    """ConfigurationError naming the extra when authlib, joserfc or httpx is missing."""
    try:
        import authlib.oidc.core  # type: ignore[import-untyped]  # noqa: F401
        import httpx  # noqa: F401
        import joserfc.jwt  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(f"sign-in by OpenID Connect needs {exc.name}: {INSTALL}") from None


class Oidc:
    """The flow, with the provider's discovery document and keys cached (keys are fetched
    again once when a token names a key id the cache does not hold: key rotation)."""

    def __init__(self, app: App, config: OidcConfig) -> None:
        check_installed()
        self.app = app
        self.config = config
        self.metadata: dict[str, Any] | None = None
        self.jwks: dict[str, Any] | None = None
        self.used: dict[str, float] = {}  # state -> when: each state signs in once

    # -- the provider ---------------------------------------------------------------------------

    async def _get(self, url: str) -> dict[str, Any]:
        import httpx

        async with httpx.AsyncClient(timeout=10, follow_redirects=False) as client:
            response = await client.get(url, headers={"Accept": "application/json"})
        response.raise_for_status()
        found = response.json()
        if not isinstance(found, dict):
            raise ProviderError(f"{url} did not answer a JSON object")
        return found

    async def discover(self) -> dict[str, Any]:
        if self.metadata is None:
            url = self.config.issuer.rstrip("/") + "/.well-known/openid-configuration"
            found = await self._get(url)
            # OIDC Discovery §4.3: the document must name the issuer it was asked for, or a
            # document served elsewhere could make tokens of another issuer pass.
            if found.get("issuer") != self.config.issuer:
                raise ValueError(f"the discovery document names the issuer "
                                 f"{visible(str(found.get('issuer')))!r}")  # fmt: skip
            for key in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
                if not isinstance(found.get(key), str):
                    raise ProviderError(f"the discovery document has no {key}")
            self.metadata = found
        return self.metadata

    async def keys(self, *, again: bool = False) -> Any:  # a JWKS, as joserfc reads it
        if self.jwks is None or again:
            self.jwks = await self._get((await self.discover())["jwks_uri"])
        return self.jwks

    # -- the two routes -------------------------------------------------------------------------

    async def start(self, request: Request, target: str) -> Response:
        """Redirect to the provider, with a new state, nonce and PKCE verifier kept in a
        signed, short-lived cookie (so that any server process sharing the secret can finish
        the flow)."""
        import httpx

        auth: Auth = request.app.state.auth
        try:
            metadata = await self.discover()
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("OIDC discovery failed: %s", visible(str(exc), newlines=False))
            raise SignInRefused(502, "Sign-in unavailable",
                                f"{self.config.shown_name} cannot be reached now; "
                                f"try again, or sign in with a token.") from None  # fmt: skip
        flow: dict[str, Any] = {
            "state": secrets.token_urlsafe(32), "nonce": secrets.token_urlsafe(32),
            "verifier": secrets.token_urlsafe(48), "next": target,
            "redirect": callback_url(request), "at": auth.now(),
        }  # fmt: skip
        challenge = base64.urlsafe_b64encode(hashlib.sha256(flow["verifier"].encode()).digest())
        query = {
            "response_type": "code", "client_id": self.config.client_id,
            "redirect_uri": flow["redirect"], "scope": " ".join(self.config.scopes),
            "state": flow["state"], "nonce": flow["nonce"],
            "code_challenge": challenge.decode().rstrip("="), "code_challenge_method": "S256",
        }  # fmt: skip
        endpoint = metadata["authorization_endpoint"]
        response = RedirectResponse(f"{endpoint}{'&' if '?' in endpoint else '?'}"
                                    f"{urlencode(query)}", 303)  # fmt: skip
        # Lax, not Strict: the provider's redirect back is a cross-site navigation, on which
        # a Strict cookie would not be sent. Only the callback's path ever receives it.
        response.set_cookie(FLOW_COOKIE, _pack(auth, flow), max_age=FLOW_SECONDS,
                            path="/login/oidc", secure=auth.secure, httponly=True,
                            samesite="lax")  # fmt: skip
        return response

    async def finish(self, request: Request) -> tuple[str, str]:
        """The session cookie and the local path to go to, for a callback that passes every
        check; SignInRefused (logged, without secrets) for any other."""
        auth: Auth = request.app.state.auth
        flow = _unpack(auth, request.cookies.get(FLOW_COOKIE, ""))
        params = request.query_params
        if flow is None or auth.now() - float(flow["at"]) > FLOW_SECONDS:
            raise self.refuse(request, 400, "this sign-in was not started here, or took longer "
                              f"than {FLOW_SECONDS // 60} minutes: start again")  # fmt: skip
        if not hmac.compare_digest(str(flow["state"]).encode(),
                                   params.get("state", "").encode("utf-8", "replace")):  # fmt: skip
            raise self.refuse(request, 400, "the state does not match this sign-in")
        if params.get("error"):
            raise self.refuse(request, 401, f"{self.config.shown_name} answered "
                              f"{params['error'][:100]!r}: "
                              f"{params.get('error_description', '')[:300]}")  # fmt: skip
        now = time.monotonic()
        self.used = {s: t for s, t in self.used.items() if now - t < FLOW_SECONDS}
        if flow["state"] in self.used:
            raise self.refuse(request, 400, "this sign-in was already used: start again")
        self.used[flow["state"]] = now
        try:
            claims = await self.claims(params.get("code", ""), flow)
        except SignInRefused:
            raise
        except Exception as exc:  # the provider's and the token's failures, all of them
            raise self.refuse(request, 401, f"the identity token was refused "
                              f"({type(exc).__name__}: {exc})"[:400]) from None  # fmt: skip
        return await self.session_for(request, auth, claims), str(flow["next"])

    async def claims(self, code: str, flow: dict[str, Any]) -> dict[str, Any]:
        """The id token's claims, once its signature, issuer, audience, times and nonce hold."""
        import httpx
        from authlib.oidc.core import CodeIDToken
        from joserfc import jwt
        from joserfc.errors import InvalidKeyIdError
        from joserfc.jwk import KeySet
        from joserfc.jws import JWSRegistry

        metadata = await self.discover()
        async with httpx.AsyncClient(timeout=10, follow_redirects=False) as client:
            # client_secret_basic (RFC 6749 §2.3.1: the id and secret form-encoded first).
            basic = (quote(self.config.client_id, safe=""),
                     quote(self.config.client_secret, safe=""))  # fmt: skip
            answer = await client.post(metadata["token_endpoint"], auth=basic, data={
                "grant_type": "authorization_code", "code": code,
                "redirect_uri": flow["redirect"], "code_verifier": flow["verifier"],
            }, headers={"Accept": "application/json"})  # fmt: skip
        if answer.status_code != 200:
            error = _json(answer).get("error", answer.status_code)
            raise ValueError(f"the token endpoint refused the code: {str(error)[:100]}")
        tokens = _json(answer)
        if not isinstance(tokens.get("id_token"), str):
            raise ProviderError("the token endpoint sent no id_token")
        offered = metadata.get("id_token_signing_alg_values_supported") or ["RS256"]
        registry = JWSRegistry(algorithms=[a for a in SAFE_ALGORITHMS if a in offered])
        try:
            token = jwt.decode(tokens["id_token"], KeySet.import_key_set(await self.keys()),
                               registry=registry)  # fmt: skip
        except InvalidKeyIdError:
            keys = KeySet.import_key_set(await self.keys(again=True))
            token = jwt.decode(tokens["id_token"], keys, registry=registry)
        options = {"iss": {"essential": True, "value": self.config.issuer},
                   "aud": {"essential": True, "values": [self.config.client_id]}}  # fmt: skip
        params = {"nonce": flow["nonce"], "client_id": self.config.client_id,
                  "access_token": tokens.get("access_token")}  # fmt: skip
        checked = CodeIDToken(token.claims, token.header, options, params)
        checked.validate(now=int(self.app.engine.clock.now()), leeway=LEEWAY)
        return dict(token.claims)

    async def session_for(self, request: Request, auth: Auth, claims: dict[str, Any]) -> str:
        """A session cookie for the existing user the claims name (and the groups they give,
        with groups_claim); SignInRefused for anyone else."""
        config = self.config
        name = claims.get(config.username_claim)
        if config.username_claim == "email" and claims.get("email_verified") is False:
            raise self.refuse(request, 403, "the provider has not verified this email address")
        try:
            check_name(name if isinstance(name, str) else "")
        except ConfigurationError:
            shown = str(name)[:200]
            raise self.refuse(request, 403, f"the claim {config.username_claim!r} "
                              f"('{shown}') is no Tether user name") from None  # fmt: skip
        assert isinstance(name, str)
        user = await get_user(self.app.engine, name)
        if user is None:
            log.warning("an OIDC sign-in was refused: %r is no active Tether user",
                        visible(name, newlines=False))  # fmt: skip
            auth.failure(request, "an inbox sign-in by OIDC was refused (unknown user)")
            raise SignInRefused(
                403,
                "Not a reviewer here",
                f"{config.shown_name} says you are {name!r}, but this Tether server has no "
                f"such user. Ask an admin to add you (tether users add {name} --group ...).",
            )
        groups = None
        if config.groups_claim is not None:
            given = claims.get(config.groups_claim, [])
            given = [given] if isinstance(given, str) else given
            if not isinstance(given, list):
                raise self.refuse(request, 403, f"the claim {config.groups_claim!r} is not "
                                  f"a list of group names")  # fmt: skip
            groups = frozenset(g for g in given if isinstance(g, str) and _valid(g))
        log.info("inbox sign-in by OIDC: %s", visible(name, newlines=False))
        return await auth.start_session(user, request, "by OpenID Connect", groups)

    def refuse(self, request: Request, status: int, why: str) -> SignInRefused:
        auth: Auth = request.app.state.auth
        auth.failure(request, f"an inbox sign-in by OIDC was refused: {visible(why)}")
        return SignInRefused(status, "Sign-in refused", f"Signing in with "
                             f"{self.config.shown_name} failed: {why}.")  # fmt: skip


def callback_url(request: Request) -> str:
    """The redirect URI: the configured public origin the request came to (else the address
    it reached), with the default port left out, as providers compare it as text."""
    site: Site = request.app.state.site
    base = origin(str(request.base_url)) or ""
    host = request.url.hostname
    for configured in sorted(site.configured):
        if urlsplit(configured).hostname == host:
            base = configured
    for default in (("http://", ":80"), ("https://", ":443")):
        if base.startswith(default[0]) and base.endswith(default[1]):
            base = base[: -len(default[1])]
    return base + "/login/oidc/callback"


def build_oidc(app: App, config: OidcConfig) -> APIRouter:
    """GET /login/oidc (to the provider) and GET /login/oidc/callback (back, then the inbox)."""
    router = APIRouter(include_in_schema=False)
    oidc = Oidc(app, config)

    @router.get("/login/oidc")
    async def start(request: Request) -> Response:
        return await oidc.start(request, local_path(request.query_params.get("next")))

    @router.get("/login/oidc/callback")
    async def callback(request: Request) -> Response:
        auth: Auth = request.app.state.auth
        auth.check_throttle(request)
        cookie, target = await oidc.finish(request)
        # A page, not a redirect: this request came from the provider's site, so a redirect
        # would be cross-site too and the browser would not send the SameSite=Strict session
        # cookie with it; a refresh from this page is same-site.
        inbox: Inbox = request.app.state.inbox
        response = inbox.page("signed_in.html", None, target=local_path(target))
        response.set_cookie(SESSION_COOKIE, cookie, max_age=int(auth.lifetime), path="/",
                            secure=auth.secure, httponly=True, samesite="strict")  # fmt: skip
        response.delete_cookie(FLOW_COOKIE, path="/login/oidc", secure=auth.secure,
                               httponly=True, samesite="lax")  # fmt: skip
        return response

    return router


def _pack(auth: Auth, flow: dict[str, Any]) -> str:
    payload = base64.urlsafe_b64encode(json.dumps(flow).encode()).decode().rstrip("=")
    return f"{payload}.{_mac(auth, payload)}"


def _unpack(auth: Auth, cookie: str) -> dict[str, Any] | None:
    payload, _, signature = cookie.rpartition(".")
    if not payload or not hmac.compare_digest(_mac(auth, payload).encode(),
                                              signature.encode("utf-8", "replace")):  # fmt: skip
        return None
    try:
        flow = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except ValueError:
        return None
    return cast(dict[str, Any], flow) if isinstance(flow, dict) else None


def _mac(auth: Auth, payload: str) -> str:
    return hmac.new(auth.secret, b"oidc-flow:" + payload.encode(), hashlib.sha256).hexdigest()


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        found = response.json()
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _valid(name: str) -> bool:
    try:
        check_name(name, "a group name")
    except ConfigurationError:
        return False
    return True

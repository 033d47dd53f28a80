"""A small OpenID Connect provider for the tests, served by uvicorn on 127.0.0.1: discovery,
/authorize (redirects back at once with a code, the person taken as signed in; or, with
`interactive`, answers a page whose link goes back), /token
(checks the client's secret, the code's single use, PKCE and the redirect URI, and answers an
RS256 id token made with joserfc) and /jwks. `Issuer.tamper` changes what the next tokens say.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import secrets
import time
from collections.abc import AsyncIterator
from html import escape, unescape
from typing import Any
from urllib.parse import parse_qsl, urlencode

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey
from tests.server.kit import serving

CLIENT_ID = "tether-inbox"
CLIENT_SECRET = "not-a-real-secret-7f3a"


@dataclasses.dataclass
class Issuer:
    url: str = ""
    key: RSAKey = dataclasses.field(
        default_factory=lambda: RSAKey.generate_key(2048, {"kid": "k1"})
    )
    claims: dict[str, Any] = dataclasses.field(default_factory=dict)  # of the next tokens
    tamper: dict[str, Any] = dataclasses.field(default_factory=dict)  # claims to override
    sign_with: RSAKey | None = None  # another key than the one /jwks publishes
    codes: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    refused: list[str] = dataclasses.field(default_factory=list)  # why /token said no
    interactive: bool = False  # /authorize answers a page with a link back, not a redirect

    def token(self, grant: dict[str, Any]) -> str:
        now = int(time.time())
        claims = {"iss": self.url, "sub": "u-1", "aud": CLIENT_ID, "iat": now, "exp": now + 300,
                  "nonce": grant["nonce"], **self.claims, **self.tamper}  # fmt: skip
        key = self.sign_with or self.key
        return jwt.encode({"alg": "RS256", "kid": key.kid}, claims, key)

    def asgi(self) -> FastAPI:
        api = FastAPI()

        @api.get("/.well-known/openid-configuration")
        async def discovery() -> dict[str, Any]:
            return {"issuer": self.url, "authorization_endpoint": f"{self.url}/authorize",
                    "token_endpoint": f"{self.url}/token", "jwks_uri": f"{self.url}/jwks",
                    "response_types_supported": ["code"],
                    "id_token_signing_alg_values_supported": ["RS256"]}  # fmt: skip

        @api.get("/jwks")
        async def jwks() -> dict[str, Any]:
            return dict(KeySet([self.key]).as_dict(private=False))

        @api.get("/authorize")
        async def authorize(request: Request) -> Response:
            q = request.query_params
            assert q["response_type"] == "code"
            assert q["client_id"] == CLIENT_ID
            assert q["code_challenge_method"] == "S256"
            assert "openid" in q["scope"].split()
            code = secrets.token_urlsafe(16)
            self.codes[code] = {"nonce": q["nonce"], "challenge": q["code_challenge"],
                                "redirect": q["redirect_uri"], "used": False}  # fmt: skip
            back = escape(f"{q['redirect_uri']}?{urlencode({'code': code, 'state': q['state']})}")
            if self.interactive:  # a page the person acts on, as a real provider's login is
                return HTMLResponse(f'<a id="consent" href="{back}">Continue</a>')
            return RedirectResponse(unescape(back), 302)

        @api.post("/token")
        async def token(request: Request) -> Response:
            form = dict(parse_qsl((await request.body()).decode()))
            basic = base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
            grant = self.codes.get(form.get("code", ""))
            verifier = form.get("code_verifier", "").encode()
            challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier).digest()).rstrip(b"=")
            why = (
                "client" if request.headers.get("authorization") != f"Basic {basic}"
                else "code" if grant is None or grant["used"]
                else "pkce" if challenge.decode() != grant["challenge"]
                else "redirect" if form.get("redirect_uri") != grant["redirect"]
                else ""
            )  # fmt: skip
            if why:
                self.refused.append(why)
                return JSONResponse({"error": "invalid_grant"}, 400)
            grant["used"] = True
            return JSONResponse({"access_token": secrets.token_urlsafe(16), "token_type": "Bearer",
                                 "id_token": self.token(grant)})  # fmt: skip

        return api


@contextlib.asynccontextmanager
async def issuing() -> AsyncIterator[Issuer]:
    issuer = Issuer()
    async with serving(issuer.asgi()) as live:
        issuer.url = live.url
        yield issuer

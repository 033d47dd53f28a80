"""What the attack suite (test_attacks.py) needs besides its fixtures: the target App, the
attacker's tools (a raw ASGI request that may lie about its body or send bytes no HTTP client
would, an HTML reader that finds live markup, SSE parsing, a uvicorn server in the test's loop),
the defender's view of the database (a snapshot to prove that nothing changed) and the ledger
of attacks tried and attacks that succeeded (tests.faults.figures).

An attack is a `with attack(family):` block: it counts as tried on entry, and as succeeded when
anything inside raises (an assertion that the defence held, or the server breaking).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
from starlette.types import ASGIApp, Message
from tests.faults import figures
from tests.server.kit import build_app

import tether
from tether.approvals import LogNotifier

TRIED = "attacks: tried"
SUCCEEDED = "attacks: succeeded (must be 0)"
WEAKNESSES = "attacks: known weaknesses outside the server, shown by xfail tests"


@contextlib.contextmanager
def attack(family: str) -> Iterator[None]:
    """One attack of `family`: tried on entry; succeeded if the block raises."""
    figures.record(TRIED, 1)
    figures.record(f"attacks tried: {family}", 1)
    try:
        yield
    except BaseException:
        figures.record(SUCCEEDED, 1)
        raise
    figures.record(SUCCEEDED, 0)


@contextlib.contextmanager
def weakness(name: str) -> Iterator[None]:
    """An attack on something outside the server (the CLI, the approval digest, chunk-level
    redaction) expected to succeed today: counted apart, and its test is a strict xfail."""
    try:
        yield
    except AssertionError:
        figures.record(f"{WEAKNESSES}: {name}", 1)
        raise
    figures.record(f"{WEAKNESSES}: {name}", 0)


# -- the secrets an attacker hunts for -------------------------------------------------------------

PASSWORD = "Sesame-hunter2-0451"
OPENAI_KEY = "sk-proj-" + "Q7x" * 12
ANTHROPIC_KEY = "sk-ant-api03-" + "k9Z" * 12
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhdHRhY2tlciIsImFkbWluIjp0cnVlfQ"
    ".dGhpcyBpcyBhIHNpZ25hdHVyZSBzZWdtZW50"
)
PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7attackkeybody"
PEM = f"-----BEGIN PRIVATE KEY-----\n{PEM_BODY}\nAAECAwQFBgcICQ==\n-----END PRIVATE KEY-----\n"
SECRETS: dict[str, Any] = {
    "password": PASSWORD,  # a secret field
    "api_key": OPENAI_KEY,  # a secret field holding a key shape
    "note": f"rotate with {ANTHROPIC_KEY} tonight",  # a key inside prose
    "header": JWT,  # a JWT under an innocent name
    "material": PEM,  # a PEM private key under an innocent name
    "nested": {"db": {"dbPassword": PASSWORD, "items": [OPENAI_KEY, {"refresh_token": JWT}]}},
}
# What must never be seen: each secret, or a telling piece of it.
MARKERS = (PASSWORD, OPENAI_KEY[8:30], ANTHROPIC_KEY[14:40], JWT.split(".")[1], PEM_BODY)


def leaks(text: str) -> list[str]:
    """The secret markers found in `text` (an empty list when none leaked)."""
    return [m for m in MARKERS if m in text]


# -- hostile strings -------------------------------------------------------------------------------

XSS = (
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "'><svg onload=alert(1)>",
    "</textarea><script>alert(2)</script>",
    "</pre><iframe src=javascript:alert(3)></iframe>",
    "{{7*7}}{% raw %}",
)
XSS_ALL = " ".join(XSS)
# Ids an attacker types into URLs: quotes, percent signs, slashes, dot segments, unicode,
# right-to-left overrides, null bytes, and the over-long.
NASTY_IDS = (
    "x'\"y",
    "100%",
    "%2F%2E%2E",
    "a/b",
    "..",
    "../../etc/passwd",
    "é✓🙂",
    "\u202egnp.exe",
    "nul\x00byte",
    "<script>",
    "x" * 600,
)


# -- the target ------------------------------------------------------------------------------------


def build_target(url: str) -> tether.App:
    """The server tests' App (workflow `ask`: an approval shaped by its argument, `talk`: a
    stream) plus what an attacker plants: `leaky` (a step result, stream chunks and an
    approval full of secrets), `hostile` (a step named and failing with markup, streaming it),
    and the approvals logged by a LogNotifier, so log records exist to be searched."""
    app = build_app(url)
    app.engine.notifiers = [LogNotifier()]
    # A run waiting for an approval suspends at once (not after 2 s in memory), so tests see
    # a settled database sooner.
    app.engine.settings = dataclasses.replace(app.engine.settings, inline_wait_max=0.05)

    @app.step()
    async def fetch_credentials() -> dict[str, Any]:
        return dict(SECRETS)

    @app.step()
    async def echo(chunks: list[Any]) -> int:
        for chunk in chunks:
            await tether.stream("tokens").write(chunk)
        return len(chunks)

    @app.workflow()
    async def leaky(reviewers: list[str]) -> str:
        creds = await fetch_credentials()
        await echo([f"token {OPENAI_KEY}", JWT, PEM, {"password": PASSWORD}, creds["note"]])
        decision = await tether.approval(
            "Rotate the production credentials?",
            description="The agent wants to rotate the keys below.",
            operation={"tool": "rotate", "arguments": creds},
            context=creds,
            reviewers=reviewers,
        )
        return f"rotation {decision.status}"  # nothing secret in the run's result

    @app.step(name=f"step {XSS_ALL}", retry=tether.NO_RETRY)
    async def hostile_step(chunks: list[str]) -> None:
        for chunk in chunks:
            await tether.stream("tokens").write(chunk)
        raise ValueError(XSS_ALL)

    @app.workflow()
    async def hostile(chunks: list[str]) -> None:
        await hostile_step(chunks)

    return app


# -- the defender's view of the database -------------------------------------------------------


def db_path(app: tether.App) -> Path:
    return Path(app.url.removeprefix("sqlite:///"))


def snapshot(app: tether.App) -> dict[str, list[tuple[Any, ...]]]:
    """Everything an attack could change: approvals and their trails, events, runs, users."""
    queries = {
        "approvals": "SELECT id, status, audit_count, audit_head, body FROM tether_approvals",
        "audit": "SELECT approval_id, seq, event, actor, detail FROM tether_approval_audit",
        "events": "SELECT run_id, key, payload FROM tether_events",
        "runs": "SELECT id, status FROM tether_runs",
        "users": "SELECT name, groups, token_hash, revoked_at FROM tether_users",
    }
    with contextlib.closing(sqlite3.connect(db_path(app))) as conn:
        return {name: sorted(conn.execute(sql).fetchall()) for name, sql in queries.items()}


def trail(app: tether.App, approval_id: str) -> list[tuple[str, str | None, str]]:
    """(event, actor, detail) of an approval's audit rows, straight from SQL."""
    with contextlib.closing(sqlite3.connect(db_path(app))) as conn:
        rows = conn.execute(
            "SELECT event, actor, detail FROM tether_approval_audit WHERE approval_id = ? "
            "ORDER BY seq",
            (approval_id,),
        ).fetchall()
    return [(str(e), a, str(d)) for e, a, d in rows]


def tamper(app: tether.App, sql: str, *params: Any) -> int:
    """Run `sql` on the database behind Tether's back; the number of rows it changed."""
    with contextlib.closing(sqlite3.connect(db_path(app))) as conn:
        changed = conn.execute(sql, params).rowcount
        conn.commit()
    return changed


# -- the attacker's tools ----------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    status: int
    headers: dict[str, str]
    body: bytes


async def raw_request(
    asgi: ASGIApp,
    method: str,
    path: str,
    *,
    headers: Sequence[tuple[bytes, bytes]] = (),
    chunks: Sequence[bytes] = (),
) -> Raw:
    """A request straight into the ASGI app, as a server would pass it, with whatever header
    bytes and body chunks the attacker likes (a false Content-Length, a newline in a header)."""
    path, _, query = path.partition("?")
    pending = list(chunks) or [b""]
    done = asyncio.Event()
    started: dict[str, Any] = {}
    body = bytearray()

    async def receive() -> Message:
        if pending:
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending)}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            started.update(message)
        elif message["type"] == "http.response.body":
            body.extend(message.get("body", b""))
            if not message.get("more_body"):
                done.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query.encode(),
        "root_path": "", "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 40000), "server": ("testserver", 80),
    }  # fmt: skip
    async with asyncio.timeout(10):
        await asgi(scope, receive, send)
    found = {k.decode("latin-1"): v.decode("latin-1") for k, v in started["headers"]}
    return Raw(int(started["status"]), found, bytes(body))


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


SCRIPT_TAG = '<script src="/static/inbox.js" defer>'


# The run page's own timeline (tether.server.timeline): its <svg> root and the nested ones
# that clip labels, known by their class. An attacker's <svg> with these classes would still
# be caught by its handler or style attributes below, which the timeline never writes.
_TIMELINE_CLASSES = frozenset({"tl", "tl-label-box"})


def _timeline(tag: str, attrs: list[tuple[str, str | None]]) -> bool:
    return tag == "svg" and dict(attrs).get("class") in _TIMELINE_CLASSES


def live_markup(html: str) -> list[str]:
    """What an attacker's string turned into live markup on a page (empty when nothing did):
    scripts beyond the inbox's own, elements that run code, event-handler or style attributes,
    javascript: URLs. The page is parsed as a browser would, so escaped text inside attributes
    or elements is not mistaken for markup."""
    problems = []
    if html.lower().count("<script") != 1 or SCRIPT_TAG not in html:
        problems.append(f"{html.lower().count('<script')} <script in the page")
    parser = _Markup()
    parser.feed(html)
    for tag, attrs in parser.tags:
        if tag in ("img", "svg", "iframe", "object", "embed", "math") and not _timeline(tag, attrs):
            problems.append(f"<{tag}> element")
        if tag == "script" and dict(attrs).get("src") != "/static/inbox.js":
            problems.append("a foreign <script>")
        for name, value in attrs:
            if name.startswith("on") or name in ("style", "srcdoc"):
                problems.append(f"<{tag} {name}=...>")
            if name in ("href", "src", "action", "formaction") and (value or "").strip().lower(
            ).startswith("javascript:"):  # fmt: skip
                problems.append(f"<{tag} {name}=javascript:...>")
    return problems


def sse_events(text: str) -> list[dict[str, str]]:
    """The events of an SSE body (fields id, event, data; comments skipped)."""
    found = []
    for block in text.replace("\r\n", "\n").strip().split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line and not line.startswith(":") and ":" in line:
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
        if fields:
            found.append(fields)
    return found


def log_text(records: list[logging.LogRecord]) -> str:
    """Every log record as a handler would write it: message, arguments and traceback."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return "\n".join(formatter.format(r) + " " + repr(r.__dict__) for r in records)


async def get_json(client: httpx.AsyncClient, path: str, token: str) -> Any:
    response = await client.get(path, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, (path, response.status_code, response.text)
    return response.json()

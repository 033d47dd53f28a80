"""Attacks on deliveries (the outbox's HttpSender and approval webhooks) and on the SQLite file,
from the attacker's side, each a test (issue 17, items 8 and 11):

- a receiver (or whoever took over its name) answers a POST with a redirect, hoping the sender
  follows it as a GET without the body, carrying the signature headers elsewhere, and counts
  the message delivered;
- a captured signed delivery is replayed under another idempotency key, so that a receiver
  deduping by key applies it twice;
- another user of the machine reads a new SQLite database, or its -wal and -shm;
- the logs and recorded errors of failing deliveries are read for the signing secret, the
  URL's credentials and the payload's secrets.

Every attack runs against a real HTTP server on 127.0.0.1 (http.server in a thread).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from tests.faults.attack_kit import MARKERS, PASSWORD, SECRETS, attack, leaks, log_text

import tether
from tether.store.memory import MemoryStore
from tether.store.port import NewRun
from tether.store.port.outbox import OutboxStatus
from tether.store.sqlite import SqliteStore
from tether.webhooks import WebhookSignatureError, verify

pytestmark = pytest.mark.timeout(30)

SIGNING = "whsec_" + base64.b64encode(b"the-signing-secret-of-the-hook!!").decode()
SIGNING_RAW = "the-signing-secret-of-the-hook!!"
URL_TOKEN = "url-token-Zq81vXh3"
FAST = tether.Retry(max_attempts=3, initial_delay=timedelta(milliseconds=5),
                    max_delay=timedelta(milliseconds=10))  # fmt: skip
REDIRECTS = (301, 302, 303, 307, 308)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Stage:
    """A hostile receiver: `plan[path]` is the statuses it answers there, in order (then 200);
    a 3xx sends the client to /target. It records every request."""

    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    plan: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def at(self, path: str) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.path.split("?")[0] == path]


@pytest.fixture
def stage() -> Iterator[Stage]:
    found = Stage()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(size) if size else b""
            path = self.path.split("?")[0]
            with found.lock:
                found.seen.append(Seen(self.command, path, dict(self.headers), body))
                planned = found.plan.get(path, [])
                status = planned.pop(0) if planned else 200
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", f"{found.url}/target?sig=stolen")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_GET = do_PUT = _answer

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    found.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    yield found
    server.shutdown()
    server.server_close()
    thread.join(5)


async def settled(app: tether.App, timeout: float = 15.0) -> tether.OutboxMessage:
    async with asyncio.timeout(timeout):
        while True:
            found = await app.list_outbox()
            if found and found[0].status in (OutboxStatus.DELIVERED, OutboxStatus.FAILED):
                return found[0]
            await asyncio.sleep(0.01)


def outbox_app(sender: tether.HttpSender, destination: str, payload: Any) -> tether.App:
    app = tether.App(store=MemoryStore(), senders={"hook": sender})

    @app.workflow(name="send")
    async def send() -> None:
        await tether.outbox(destination, payload)

    return app


# -- redirects are never followed ------------------------------------------------------------------


@pytest.mark.parametrize("status", REDIRECTS)
async def test_a_redirect_answer_to_an_outbox_post_is_a_failed_attempt_never_followed(
    stage: Stage, status: int
) -> None:
    with attack("redirected deliveries"):
        stage.plan["/hook"] = [status] * 10
        sender = tether.HttpSender(f"{stage.url}/hook", secret=SIGNING, retry=FAST)
        app = outbox_app(sender, "hook", {"wire": 1_000_000})
        async with app:
            await (await app.start("send", id="wire")).result(timeout=10)
            message = await settled(app)
        assert message.status is OutboxStatus.FAILED  # never counted delivered
        assert message.attempts == FAST.max_attempts  # retried per the policy
        error = json.loads(message.error or "{}")["message"]
        assert f"answered {status}" in error
        assert "redirects are not followed" in error
        assert "Location" in error
        assert "sig=stolen" not in error  # the Location's query is not repeated
        assert len(stage.at("/hook")) == FAST.max_attempts
        assert all(s.method == "POST" for s in stage.at("/hook"))
        assert stage.at("/target") == []  # no GET without the body, no signature carried off


@pytest.mark.parametrize("status", REDIRECTS)
async def test_a_redirect_answer_to_an_approval_webhook_is_never_followed(
    stage: Stage, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    with attack("redirected deliveries"):
        stage.plan["/decided"] = [status] * 10
        app = tether.App(store=MemoryStore())
        hook = tether.Webhook(f"{stage.url}/decided", SIGNING, retry=FAST, timeout=5.0)

        @app.workflow(name="wire")
        async def wire() -> str:
            decision = await tether.approval("Wire $1M?", reviewers=["alice"], on_decision=hook)
            return decision.status

        async with app:
            handle = await app.start(wire, id="wire")
            async with asyncio.timeout(10):
                while not (asks := await app.list_approvals(run_id="wire")):
                    await asyncio.sleep(0.01)
            await app.decide(asks[0].id, "approve", reviewer="alice",
                             operation_digest=asks[0].operation_digest)  # fmt: skip
            with caplog.at_level(logging.WARNING, logger="tether.approvals"):
                assert await handle.result(timeout=10) == "approved"  # the decision stands
        assert len(stage.at("/decided")) == FAST.max_attempts  # retried, then given up
        assert all(s.method == "POST" for s in stage.at("/decided"))
        assert stage.at("/target") == []
        assert "redirects are not followed" in caplog.text


# -- the idempotency key is signed -----------------------------------------------------------------


def independent_check(secret: str, seen: Seen) -> str:
    """A receiver's Standard Webhooks check written from the spec, apart from tether's code:
    the webhook-id it may dedupe on, or an AssertionError."""
    headers = {k.lower(): v for k, v in seen.headers.items()}
    webhook_id, timestamp = headers["webhook-id"], headers["webhook-timestamp"]
    assert abs(time.time() - int(timestamp)) < 300
    raw = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{webhook_id}.{timestamp}.".encode() + seen.body
    expected = base64.b64encode(hmac.new(raw, signed, hashlib.sha256).digest()).decode()
    given = [
        e.split(",", 1)[1] for e in headers["webhook-signature"].split() if e.startswith("v1,")
    ]
    assert any(hmac.compare_digest(expected, g) for g in given), "signature mismatch"
    return webhook_id


async def test_a_captured_delivery_replayed_under_another_key_is_refused(stage: Stage) -> None:
    with attack("replayed deliveries"):
        sender = tether.HttpSender(f"{stage.url}/hook", secret=SIGNING)
        app = outbox_app(sender, "hook", {"wire": 1_000_000, "to": "acme"})
        async with app:
            await (await app.start("send", id="wire")).result(timeout=10)
            message = await settled(app)
        assert message.status is OutboxStatus.DELIVERED
        (captured,) = stage.at("/hook")
        # The receiver verifies the real delivery with its own code, and gets the key.
        assert independent_check(SIGNING, captured) == message.key
        assert verify(SIGNING, captured.body, captured.headers, now=time.time()) == message.key
        # The attacker replays it under fresh keys, in every header that names one.
        for name in ("webhook-id", "Webhook-Id", "Idempotency-Key"):
            forged = {k: v for k, v in captured.headers.items() if k.lower() != name.lower()}
            forged[name] = "tether-" + "f" * 40
            if name.lower() == "idempotency-key":
                # The signed id still wins: a verifying receiver dedupes on what verify returns.
                assert verify(SIGNING, captured.body, forged, now=time.time()) == message.key
                continue
            with pytest.raises(WebhookSignatureError, match="signature mismatch"):
                verify(SIGNING, captured.body, forged, now=time.time())
            with pytest.raises(AssertionError, match="signature mismatch"):
                independent_check(SIGNING, Seen("POST", "/hook", forged, captured.body))


# -- the database file -----------------------------------------------------------------------------


async def test_another_local_user_cannot_read_a_new_database_or_its_wal_and_shm(
    tmp_path: Path,
) -> None:
    with attack("readable database files"):
        path = tmp_path / "tether.db"
        old = os.umask(0o022)  # the usual umask, which makes new files world-readable
        try:
            store = SqliteStore(f"sqlite:///{path}")
            await store.open()
            await store.create_run(NewRun("r1", "wf", "{}"), 1.0)
            files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
            readable = {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in files
                        if f.stat().st_mode & 0o077}  # fmt: skip
            await store.close()
        finally:
            os.umask(old)
        assert readable == {}


# -- nothing secret in logs or recorded errors -----------------------------------------------------


async def test_failing_deliveries_log_and_record_no_secret(
    stage: Stage, caplog: pytest.LogCaptureFixture
) -> None:
    with attack("secrets in delivery logs"):
        # A refusal, a server error and a redirect: every path that logs or records an error.
        stage.plan["/hook"] = [503, 302, 422]
        stage.plan["/decided"] = [503, 500, 502]
        credentialed = stage.url.replace("http://", f"http://ops:{PASSWORD}@")
        sender = tether.HttpSender(
            f"{credentialed}/hook?token={URL_TOKEN}",
            secret=SIGNING_RAW,
            retry=tether.Retry(max_attempts=5, initial_delay=timedelta(milliseconds=5)),
        )
        app = outbox_app(sender, "hook", SECRETS)
        hook = tether.Webhook(f"{credentialed}/decided?token={URL_TOKEN}", SIGNING, retry=FAST)

        @app.workflow(name="wire")
        async def wire() -> str:
            decision = await tether.approval("Wire?", reviewers=["alice"], on_decision=hook)
            return decision.status

        with caplog.at_level(logging.DEBUG):
            async with app:
                await (await app.start("send", id="send")).result(timeout=10)
                handle = await app.start(wire, id="wire")
                async with asyncio.timeout(10):
                    while not (asks := await app.list_approvals(run_id="wire")):
                        await asyncio.sleep(0.01)
                await app.decide(asks[0].id, "approve", reviewer="alice",
                                 operation_digest=asks[0].operation_digest)  # fmt: skip
                assert await handle.result(timeout=10) == "approved"
                message = await settled(app)
        assert message.status is OutboxStatus.FAILED  # the 422 ended it
        assert len(stage.at("/hook")) == 3
        assert len(stage.at("/decided")) == 3
        text = log_text(caplog.records) + "\n" + (message.error or "")
        text += repr(sender) + repr(hook)
        assert "answered HTTP 503" in text  # the failures are logged, just not the secrets
        assert leaks(text) == []
        found = [s for s in (PASSWORD, URL_TOKEN, SIGNING, SIGNING_RAW, *MARKERS) if s in text]
        assert found == []

"""The email and Slack notifiers against real receivers on 127.0.0.1: an aiosmtpd SMTP sink (plain,
and STARTTLS with a self-signed certificate and a login) gets the mails of a real run's approval
(a tether.App on a SQLite file), a uvicorn webhook receiver gets the Slack JSON; a hostile title
adds no header and runs no markup; no secret reaches a mail, a post, a log or a repr; a failing
receiver is retried by the notify step, a refusing one is logged and never fails the run; and in
headless Chromium a reviewer follows the mail's link, or the chat's button to the server's public
URL, to the inbox, signs in and decides."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import email
import email.policy
import ipaddress
import json
import logging
import queue
import re
import socket
import ssl
from collections.abc import AsyncIterator, Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import uvicorn
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import tether
from tether.approvals.mail import EmailNotifier
from tether.approvals.slack import SlackNotifier, mrkdwn
from tether.errors import ConfigurationError, PermanentError

if TYPE_CHECKING:
    from playwright.async_api import Browser

pytestmark = pytest.mark.timeout(60)

PUBLIC = "https://tether.example.com/console"
SECRET_KEY = "sk-proj-abcdefghijklmnopqrstuvwx"
HOOK_PATH = "/services/T000/B000/hook-secret-XYZ"
ASK: dict[str, Any] = {
    "title": "Deploy 1.2.3 to prod?",
    "description": f"The agent wants to deploy. Its key is {SECRET_KEY}.",
    "operation": {"tool": "deploy", "arguments": {"version": "1.2.3", "token": "op-secret-1"}},
    "context": {"api_key": "ctx-secret-2", "changelog": "fix login"},
    "reviewers": ["group:sre", "carol"],
}
ALICE = tether.Reviewer("alice", {"sre"})


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stamp(ask: tether.Approval) -> int:
    """The approval's creation time in ms: in the notification key with its id and event."""
    return round(ask.created_at.timestamp() * 1000)


def make_app(path: Path, *notifiers: tether.Notifier) -> tether.App:
    """An App on a SQLite file whose workflow `ask` asks one approval shaped by its argument."""
    app = tether.App(f"sqlite:///{path}", notifiers=list(notifiers))
    app.engine.settings = dataclasses.replace(app.engine.settings, poll_interval=0.05)

    @app.workflow()
    async def ask(spec: dict[str, Any]) -> dict[str, Any]:
        decision = await tether.approval(**{**ASK, **spec})
        return {"status": decision.status, "reviewer": decision.reviewer}

    return app


async def asked(app: tether.App, run_id: str, **spec: Any) -> tether.Approval:
    await app.start("ask", spec, id=run_id)
    async with asyncio.timeout(10):
        while not (found := await app.list_approvals(run_id=run_id)):
            await asyncio.sleep(0.01)
    return found[0]


async def decide(app: tether.App, ask: tether.Approval, run_id: str) -> dict[str, Any]:
    await app.decide(ask.id, "approve", reviewer=ALICE, operation_digest=ask.operation_digest)
    result: dict[str, Any] = await (await app.get(run_id)).result(timeout=10)
    return result


# -- an SMTP sink -----------------------------------------------------------------------------


@dataclasses.dataclass
class Mail:
    sender: str
    recipients: list[str]
    raw: bytes

    @property
    def message(self) -> EmailMessage:
        parsed = email.message_from_bytes(self.raw, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        return parsed

    def part(self, kind: str) -> str:
        body = self.message.get_body(preferencelist=(kind,))
        assert body is not None
        assert isinstance(body, EmailMessage)
        return str(body.get_content())


class Sink:
    """aiosmtpd's handler: each mail lands in a queue (the server runs in its own thread)."""

    def __init__(self) -> None:
        self.mails: queue.Queue[Mail] = queue.Queue()
        self.logins: list[tuple[str, bool]] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.original_content or b""
        self.mails.put(Mail(str(envelope.mail_from), list(envelope.rcpt_tos), content))
        return "250 OK"

    def authenticate(self, server: SMTP, session: Session, envelope: Envelope, mechanism: str,
                     data: object) -> AuthResult:  # fmt: skip
        assert isinstance(data, LoginPassword)
        good = (data.login, data.password) == (b"mailer", b"p@ss word")
        self.logins.append((data.login.decode(), session.ssl is not None))
        return AuthResult(success=good)

    async def next(self) -> Mail:
        return await asyncio.to_thread(self.mails.get, timeout=10)


@contextlib.contextmanager
def smtp_sink(*, login: bool = False, **options: Any) -> Iterator[tuple[Sink, int]]:
    """An aiosmtpd server on 127.0.0.1; with `login`, AUTH checked by the sink."""
    sink = Sink()
    port = free_port()
    if login:
        options["authenticator"] = sink.authenticate
    controller = Controller(sink, hostname="127.0.0.1", port=port, **options)
    controller.start()
    try:
        yield sink, port
    finally:
        controller.stop()


def self_signed(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a fresh certificate for 127.0.0.1 and a client one trusting it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_file, key_file)
    client = ssl.create_default_context(cafile=str(cert_file))
    return server, client


def mailer(port: int, **options: Any) -> EmailNotifier:
    return EmailNotifier(
        options.pop("url", f"smtp://127.0.0.1:{port}"),
        sender="Tether <tether@example.com>",
        to=options.pop("to", ["audit@example.com"]),
        addresses=options.pop("addresses", {"group:sre": ["sre@example.com"],
                                            "carol": ["carol@example.com"]}),
        public_url=PUBLIC,
        **options,
    )  # fmt: skip


# -- email ------------------------------------------------------------------------------------


async def test_reviewers_get_a_mail_linking_to_the_exact_approval_and_then_its_decision(
    tmp_path: Path,
) -> None:
    with smtp_sink() as (sink, port):
        app = make_app(tmp_path / "mail.db", mailer(port))
        async with app:
            ask = await asked(app, "run-mail")
            mail = await sink.next()
            assert mail.sender == "tether@example.com"
            assert mail.recipients == ["audit@example.com", "sre@example.com", "carol@example.com"]
            msg = mail.message
            assert msg["Subject"] == "Approval requested: Deploy 1.2.3 to prod?"
            assert msg["Message-ID"] == f"<tether.{ask.id}.{stamp(ask)}.requested@example.com>"
            assert msg["Auto-Submitted"] == "auto-generated"
            link = f"{PUBLIC}/approvals/{ask.id}"
            text, page = mail.part("plain"), mail.part("html")
            assert f"Decide in the inbox: {link}" in text
            assert f'<a href="{link}">' in page
            for shown in (text, page):
                assert "Approve (approve), Reject (reject)" in shown
                assert "group:sre, carol" in shown
                assert ask.expires_at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC") in shown
            for secret in (SECRET_KEY, "op-secret-1", "ctx-secret-2", "fix login"):
                assert secret.encode() not in mail.raw  # nor the operation, nor the context

            assert await decide(app, ask, "run-mail") == {"status": "approved",
                                                          "reviewer": "alice"}  # fmt: skip
            done = await sink.next()
            assert done.message["Subject"] == (
                "Decided: Deploy 1.2.3 to prod? (approved: approve by alice)")  # fmt: skip
            assert (
                done.message["Message-ID"] == f"<tether.{ask.id}.{stamp(ask)}.decided@example.com>"
            )
            assert done.message["In-Reply-To"].strip() == msg["Message-ID"]  # folded: FWS
            assert link in done.part("plain")
        assert sink.mails.empty()  # one mail per event


async def test_a_hostile_title_adds_no_header_no_recipient_and_no_markup(tmp_path: Path) -> None:
    hostile = "Ship it\r\nBcc: eve@evil.example\r\n\r\n<script>alert(1)</script> & <b>bold</b>"
    with smtp_sink() as (sink, port):
        app = make_app(tmp_path / "hostile.db", mailer(port))
        async with app:
            await asked(app, "run-hostile", title=hostile, description="<img src=x onerror=1>")
            mail = await sink.next()
    assert mail.recipients == ["audit@example.com", "sre@example.com", "carol@example.com"]
    msg = mail.message
    assert msg["Bcc"] is None
    assert "eve@evil.example" not in msg["To"]
    headers = mail.raw.split(b"\r\n\r\n", 1)[0]
    assert not re.search(rb"^Bcc:", headers, re.M | re.I)
    assert msg["Subject"].startswith("Approval requested: Ship it\\r\\nBcc: eve@evil.example")
    page = mail.part("html")
    assert "<script>" not in page
    assert "<img" not in page
    assert "<b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in page


async def test_starttls_logs_in_over_tls_with_a_self_signed_certificate(tmp_path: Path) -> None:
    server_tls, client_tls = self_signed(tmp_path)
    with smtp_sink(login=True, tls_context=server_tls, require_starttls=True,
                   auth_require_tls=True) as (sink, port):  # fmt: skip
        url = f"smtp://mailer:p%40ss%20word@127.0.0.1:{port}?starttls=true"
        notifier = mailer(port, url=url, tls=client_tls)
        assert "p@ss" not in repr(notifier)
        assert "word" not in repr(notifier)
        app = make_app(tmp_path / "tls.db", notifier)
        async with app:
            ask = await asked(app, "run-tls")
            mail = await sink.next()
        assert sink.logins == [("mailer", True)]  # the password went over TLS only
        assert f"{PUBLIC}/approvals/{ask.id}" in mail.part("plain")

        # The system's CAs do not trust the certificate: refused for good, never sent in clear.
        untrusting = mailer(port, url=url)
        with pytest.raises(PermanentError, match="certificate does not verify") as caught:
            await untrusting.approval_requested(ask)
        assert "p@ss" not in str(caught.value)
        assert sink.mails.empty()


def test_bad_configurations_are_refused_at_construction_saying_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TETHER_PUBLIC_URL", raising=False)
    with pytest.raises(ConfigurationError, match=r"TETHER_PUBLIC_URL"):
        EmailNotifier("smtp://127.0.0.1", sender="t@example.com", to=["a@example.com"])
    with pytest.raises(ConfigurationError, match=r"TETHER_PUBLIC_URL"):
        SlackNotifier("https://hooks.slack.com/services/x")
    monkeypatch.setenv("TETHER_PUBLIC_URL", "https://inbox.example.com/")
    assert SlackNotifier("https://hooks.slack.com/x").public_url == "https://inbox.example.com"
    with pytest.raises(ConfigurationError, match="password in clear"):
        EmailNotifier("smtp://u:secret-pw@mail.example.com", sender="t@example.com", to=["a@b.c"])
    with pytest.raises(ConfigurationError, match="needs recipients"):
        EmailNotifier("smtps://mail.example.com", sender="t@example.com")
    with pytest.raises(ConfigurationError, match="not an email address"):
        EmailNotifier("smtps://mail.example.com", sender="t@example.com",
                      to=["a@b.c\r\nBcc: eve@evil.example"])  # fmt: skip
    with pytest.raises(ConfigurationError, match="only \\?starttls"):
        EmailNotifier("smtp://mail.example.com?tls=yes", sender="t@example.com", to=["a@b.c"])
    with pytest.raises(ConfigurationError, match="public_url is an http"):
        SlackNotifier("https://hooks.example.com/x", public_url="javascript:alert(1)")
    notifier = EmailNotifier("smtps://u:secret-pw@mail.example.com", sender="t@example.com",
                             to=["a@b.c"])  # fmt: skip
    assert repr(notifier) == "EmailNotifier('smtps://u:***@mail.example.com:465')"


# -- Slack-compatible webhooks ------------------------------------------------------------------


@dataclasses.dataclass
class Receiver:
    url: str
    posts: list[tuple[dict[str, str], dict[str, Any]]]
    answers: list[int]  # statuses to answer, in order; 200 once they run out
    arrived: asyncio.Event


@contextlib.asynccontextmanager
async def served(sock: socket.socket, asgi: Any) -> AsyncIterator[None]:
    """`asgi` served by uvicorn on a bound socket, in this event loop."""
    config = uvicorn.Config(asgi, log_config=None, log_level="warning", ws="none",
                            lifespan="off", timeout_graceful_shutdown=2)  # fmt: skip
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        yield
    finally:
        server.should_exit = True
        async with asyncio.timeout(10):
            await task
        sock.close()


def bound() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.asynccontextmanager
async def receiver(*answers: int) -> AsyncIterator[Receiver]:
    sock = bound()
    got = Receiver(f"http://127.0.0.1:{sock.getsockname()[1]}{HOOK_PATH}", [], list(answers),
                   asyncio.Event())  # fmt: skip

    async def hook(request: Request) -> Response:
        got.posts.append((dict(request.headers), json.loads(await request.body())))
        got.arrived.set()
        return Response("ok", status_code=got.answers.pop(0) if got.answers else 200)

    async with served(sock, Starlette(routes=[Route(HOOK_PATH, hook, methods=["POST"])])):
        yield got


async def posts(hook: Receiver, count: int) -> list[tuple[dict[str, str], dict[str, Any]]]:
    async with asyncio.timeout(15):
        while len(hook.posts) < count:
            hook.arrived.clear()
            await hook.arrived.wait()
    return hook.posts


async def test_the_chat_gets_the_approval_escaped_with_a_button_to_it(tmp_path: Path) -> None:
    title = "Wake <!channel> & <https://evil.example|click me>"
    async with receiver() as hook:
        notifier = SlackNotifier(hook.url, public_url=PUBLIC)
        assert HOOK_PATH not in repr(notifier)
        app = make_app(tmp_path / "slack.db", notifier)
        async with app:
            ask = await asked(app, "run-slack", title=title)
            headers, body = (await posts(hook, 1))[0]
            link = f"{PUBLIC}/approvals/{ask.id}"
            escaped = "Wake &lt;!channel&gt; &amp; &lt;https://evil.example|click me&gt;"
            assert escaped == mrkdwn(title)
            assert body["text"] == (f"Approval requested: {escaped} (expires "
                                    f"{ask.expires_at.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC). "
                                    f"Decide: {link}")  # fmt: skip
            section, actions = body["blocks"]
            assert f"*Approval requested:* {escaped}" in section["text"]["text"]
            assert "<!channel>" not in json.dumps(body)
            assert actions["elements"][0]["url"] == link
            assert headers["idempotency-key"] == f"tether-notify-{ask.id}.{stamp(ask)}.requested"
            for secret in (SECRET_KEY, "op-secret-1", "ctx-secret-2"):
                assert secret not in json.dumps(body)
            await decide(app, ask, "run-slack")
            _, decided = (await posts(hook, 2))[1]
            assert "approved: approve by alice" in decided["text"]
            assert link in decided["text"]


async def test_a_failing_chat_is_retried_by_the_notify_step_with_the_same_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with receiver(500, 503) as hook:
        app = make_app(tmp_path / "retry.db", SlackNotifier(hook.url, public_url=PUBLIC))
        async with app:
            ask = await asked(app, "run-retry")
            sent = await posts(hook, 3)
            assert [h["idempotency-key"] for h, _ in sent] == [
                f"tether-notify-{ask.id}.{stamp(ask)}.requested"] * 3  # fmt: skip
            assert await decide(app, ask, "run-retry") == {"status": "approved",
                                                           "reviewer": "alice"}  # fmt: skip
    requests = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert len(requests) == 4
    assert all("127.0.0.1" in line for line in requests)
    assert HOOK_PATH not in caplog.text
    assert "hook-secret" not in caplog.text


async def test_a_refusing_chat_is_logged_once_and_never_fails_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with receiver(404, 404) as hook:
        app = make_app(tmp_path / "refused.db", SlackNotifier(hook.url, public_url=PUBLIC))
        async with app:
            ask = await asked(app, "run-refused")
            await posts(hook, 1)
            assert await decide(app, ask, "run-refused") == {"status": "approved",
                                                             "reviewer": "alice"}  # fmt: skip
    assert len(hook.posts) == 2  # one each for requested and decided: a 404 is not retried
    failed = [r.getMessage() for r in caplog.records if "notifiers failed" in r.getMessage()]
    assert len(failed) == 2
    assert all("404" in line for line in failed)
    assert HOOK_PATH not in caplog.text
    assert "hook-secret" not in caplog.text


class FailsOnce:
    """A notifier whose first call fails: the notify step is retried for it."""

    def __init__(self) -> None:
        self.calls = 0

    async def approval_requested(self, approval: tether.Approval) -> None:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("the pager is down")

    async def approval_decided(self, approval: tether.Approval, decision: tether.Decision) -> None:
        return None


async def test_a_retry_for_another_notifier_does_not_post_again(tmp_path: Path) -> None:
    async with receiver() as hook:
        flaky = FailsOnce()
        app = make_app(tmp_path / "twice.db", SlackNotifier(hook.url, public_url=PUBLIC), flaky)
        async with app:
            ask = await asked(app, "run-twice")
            await decide(app, ask, "run-twice")
    assert flaky.calls == 2  # the step ran twice
    assert [body["text"].split(":")[0] for _, body in hook.posts] == [
        "Approval requested", "Decided"]  # fmt: skip


# -- from the mail or the chat to a decision, in a browser ------------------------------------


async def test_a_reviewer_follows_the_mailed_link_signs_in_and_decides(
    tmp_path: Path, browser: Browser
) -> None:
    from playwright.async_api import expect

    from tether.server import create_server
    from tether.users import add_user

    sock = bound()
    inbox = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with smtp_sink() as (sink, port):
        notifier = EmailNotifier(f"smtp://127.0.0.1:{port}", sender="tether@example.com",
                                 addresses={"group:sre": ["sre@example.com"]},
                                 public_url=inbox)  # fmt: skip
        app = make_app(tmp_path / "e2e.db", notifier)
        async with app:
            _, token = await add_user(app.engine, "alice", frozenset({"sre"}))
            async with served(sock, create_server(app, secret=b"s" * 32)):
                ask = await asked(app, "run-e2e", reviewers=["group:sre"])
                mail = await sink.next()
                found = re.search(r"Decide in the inbox: (\S+)", mail.part("plain"))
                assert found
                assert found.group(1) == f"{inbox}/approvals/{ask.id}"
                page = await browser.new_page()
                try:
                    await page.goto(found.group(1))  # not signed in: the sign-in page
                    await page.fill("#token", token)
                    await page.click("#signin button[type=submit]")
                    await expect(page.locator("h1.title")).to_have_text(ASK["title"])
                    assert page.url == found.group(1)
                    await page.click("button[name=option][value=approve]")
                    await expect(page.locator(".decision")).to_contain_text(
                        "Approved by alice", timeout=10_000)  # fmt: skip
                finally:
                    await page.close()
                result = await (await app.get("run-e2e")).result(timeout=10)
                assert result == {"status": "approved", "reviewer": "alice"}
                decided = await sink.next()
                assert decided.message["Subject"].endswith("(approved: approve by alice)")


async def test_a_reviewer_opens_the_chats_button_to_the_public_url_signs_in_and_decides(
    tmp_path: Path, browser: Browser, screenshots: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's public URL set as `tether serve --public-url` sets it: $TETHER_PUBLIC_URL
    before the App and its notifiers load (the SlackNotifier is given none of its own), and the
    origin requests must name. The button Slack would draw takes the reviewer there."""
    from playwright.async_api import expect

    from tether.cli.serve import checked_public_url
    from tether.server import create_server
    from tether.users import add_user

    sock = bound()
    public_url = checked_public_url(f"http://127.0.0.1:{sock.getsockname()[1]}/")
    monkeypatch.setenv("TETHER_PUBLIC_URL", public_url)
    async with receiver() as hook:
        notifier = SlackNotifier(hook.url)
        app = make_app(tmp_path / "chat-e2e.db", notifier)
        async with app:
            _, token = await add_user(app.engine, "alice", frozenset({"sre"}))
            server = create_server(app, secret=b"s" * 32, origins=[public_url])
            async with served(sock, server):
                ask = await asked(app, "run-chat-e2e", reviewers=["group:sre"])
                _, body = (await posts(hook, 1))[0]
                # As Slack renders the post: its section, then the button the reviewer clicks.
                section, actions = body["blocks"]
                assert f"*Approval requested:* {ASK['title']}" in section["text"]["text"]
                (button,) = actions["elements"]
                assert (button["type"], button["text"]["text"]) == ("button", "Open in the inbox")
                link = button["url"]
                assert link == f"{public_url}/approvals/{ask.id}"
                assert body["text"].endswith(f"Decide: {link}")  # the bare link, for the rest

                page = await browser.new_page()
                problems: list[str] = []
                page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda error: problems.append(str(error)))
                try:
                    await page.goto(link)  # not signed in: the sign-in page
                    await expect(page.locator("#signin")).to_be_visible()
                    await page.fill("#token", token)
                    await page.click("#signin button[type=submit]")
                    await expect(page.locator("h1.title")).to_have_text(ASK["title"])
                    assert page.url == link
                    await page.fill("#comment", "ship it")
                    await page.click("button[name=option][value=approve]")
                    await expect(page.locator(".decision")).to_contain_text(
                        "Approved by alice", timeout=10_000)  # fmt: skip
                    await page.screenshot(path=screenshots / "notifier-slack-decided.png",
                                          full_page=True)  # fmt: skip
                finally:
                    await page.close()
                assert problems == []

                shown = await app.get_approval(ask.id)
                assert shown.status == "approved"
                assert shown.decision is not None
                assert (shown.decision.reviewer, shown.decision.option, shown.decision.comment
                        ) == ("alice", "approve", "ship it")  # fmt: skip
                result = await (await app.get("run-chat-e2e")).result(timeout=10)
                assert result == {"status": "approved", "reviewer": "alice"}
                _, decided = (await posts(hook, 2))[1]
                assert "approved: approve by alice" in decided["text"]
                assert link in decided["text"]
    assert (screenshots / "notifier-slack-decided.png").stat().st_size > 0

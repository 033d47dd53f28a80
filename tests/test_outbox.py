"""The outbox end to end: messages recorded with a checkpoint (in workflow code, or inside a
transaction step), delivered by the worker to a real HTTP receiver on 127.0.0.1 by key,
retried per policy, failed visibly, reconciled when a send's outcome is unknown; on every
backend (memory, SQLite, PostgreSQL) and in forced-replay mode."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from tests.crash.receiver import Receiver
from tests.postgres_server import with_schema

import tether
from tether.errors import ConfigurationError, NotInWorkflow, StepOutcomeUnknown
from tether.outbox import HttpError
from tether.store import store_from_url
from tether.store.memory import MemoryStore
from tether.store.port import Lease, NewRun, Store, WorkerInfo
from tether.store.port.outbox import (
    NewOutboxMessage,
    OutboxSettlement,
    OutboxStatus,
    TransactionOutcome,
)

pytestmark = pytest.mark.timeout(60)

SECRET = "s3cret-s3cret-s3cret"
FAST = tether.Retry(max_attempts=5, initial_delay=timedelta(milliseconds=10),
                    max_delay=timedelta(milliseconds=40))  # fmt: skip
SETTLED = (OutboxStatus.DELIVERED, OutboxStatus.FAILED)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver(secret=SECRET) as r:
        yield r


async def settled(app: tether.App, count: int, timeout: float = 15.0) -> list[tether.OutboxMessage]:
    """The App's messages once `count` of them exist and every one is delivered or failed."""
    async with asyncio.timeout(timeout):
        while True:
            found = await app.list_outbox()
            if len(found) >= count and all(m.status in SETTLED for m in found):
                return found
            await asyncio.sleep(0.01)


def signed_app(make_app: Callable[..., tether.App], **senders: tether.Sender) -> tether.App:
    app = make_app(senders={"http": tether.HttpSender(secret=SECRET), **senders})
    app.outbox_retry = FAST
    return app


# -- delivery ----------------------------------------------------------------------------------


async def test_a_message_is_delivered_once_by_key_when_the_receiver_fails_then_succeeds(
    make_app: Callable[..., tether.App], receiver: Receiver
) -> None:
    app = signed_app(make_app)

    @app.workflow()
    async def order(n: int) -> str:
        sent = await tether.outbox(f"{receiver.url}/orders", {"order": n})
        return sent.key

    receiver.plan = [503, 500]  # the receiver fails twice, then accepts
    async with app:
        key = await (await app.start(order, 7, id="order-7")).result()
        (message,) = await settled(app, 1)

    assert message.status is OutboxStatus.DELIVERED
    assert message.attempts == 3
    assert message.uncertain == 0
    assert message.error is None
    assert message.key == key
    assert message.run_id == "order-7"
    assert message.payload == {"order": 7}
    # Three sends, one key, one body, every one signed; the receiver applied it once.
    assert receiver.keys("/orders") == [key, key, key]
    assert {json.dumps(r.body) for r in receiver.requests} == {'{"order": 7}'}
    assert all(r.signed and r.message_id == message.id for r in receiver.requests)
    assert receiver.applied == {key: {"order": 7}}


async def test_a_transaction_records_its_messages_with_its_commit_and_a_rolled_back_body_none(
    make_app: Callable[..., tether.App], receiver: Receiver
) -> None:
    app = signed_app(make_app)
    attempts: list[int] = []

    @app.transaction(retry=FAST)
    def debit(conn: Any, amount: int) -> int:
        conn.execute("CREATE TABLE IF NOT EXISTS debits (amount INTEGER)")
        conn.execute("INSERT INTO debits VALUES (10)")
        tether.outbox(f"{receiver.url}/debits", {"amount": amount})
        tether.outbox(f"{receiver.url}/audit", {"amount": amount}, key=f"audit-{amount}")
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("the first attempt fails after recording its messages")
        return amount

    @app.workflow()
    async def pay(amount: int) -> int:
        return await debit(amount)

    async with app:
        assert await (await app.start(pay, 10, id="pay")).result() == 10
        messages = await settled(app, 2)

    # The first attempt's messages were rolled back with it: two messages, not four.
    assert len(messages) == 2
    assert sorted(m.key for m in messages) == sorted(
        ["audit-10", *(m.id for m in messages if m.key != "audit-10")]
    )
    assert {m.checkpoint for m in messages} == {"debit"}
    assert all(m.status is OutboxStatus.DELIVERED for m in messages)
    assert "audit-10" in receiver.applied
    assert sorted(receiver.keys()) == sorted(m.key for m in messages)  # one send each


async def test_a_refused_message_fails_visibly_and_retry_outbox_sends_it_again_by_key(
    make_app: Callable[..., tether.App], receiver: Receiver
) -> None:
    app = signed_app(make_app)

    @app.workflow()
    async def notify() -> None:
        await tether.outbox(f"{receiver.url}/hook", {"hello": "world"})

    receiver.plan = [422]  # a permanent refusal: not retried
    async with app:
        await (await app.start(notify, id="notify")).result()
        (failed,) = await settled(app, 1)
        assert failed.status is OutboxStatus.FAILED
        assert failed.attempts == 1
        assert "422" in json.loads(failed.error or "{}")["message"]
        assert receiver.applied == {}

        again = await app.retry_outbox(failed.id)  # the receiver is fixed
        assert again.status is OutboxStatus.PENDING
        (delivered,) = await settled(app, 1)
        with pytest.raises(ConfigurationError, match="only a failed one"):
            await app.retry_outbox(failed.id)
        with pytest.raises(ConfigurationError, match="no outbox message"):
            await app.retry_outbox("nope")

    assert delivered.status is OutboxStatus.DELIVERED
    assert receiver.keys() == [failed.key, failed.key]
    assert receiver.applied == {failed.key: {"hello": "world"}}


async def test_a_message_whose_retries_run_out_fails_with_its_last_error(
    make_app: Callable[..., tether.App], receiver: Receiver
) -> None:
    flaky = tether.HttpSender(f"{receiver.url}/flaky", retry=tether.Retry(
        max_attempts=2, initial_delay=timedelta(milliseconds=5)))  # fmt: skip
    app = signed_app(make_app, flaky=flaky)

    @app.workflow()
    async def notify() -> None:
        await tether.outbox("flaky", [1, 2, 3])

    receiver.plan = [503, 503, 503]
    async with app:
        await (await app.start(notify, id="n")).result()
        (failed,) = await settled(app, 1)
    assert failed.status is OutboxStatus.FAILED
    assert failed.attempts == 2
    assert "503" in json.loads(failed.error or "{}")["message"]
    assert receiver.keys("/flaky") == [failed.key, failed.key]
    assert receiver.applied == {}
    assert [m.id for m in await app.list_outbox(status="failed")] == [failed.id]
    assert await app.list_outbox(status="delivered") == []


async def test_a_redirect_is_a_failed_attempt_retried_and_only_a_2xx_delivers(
    make_app: Callable[..., tether.App], receiver: Receiver
) -> None:
    app = signed_app(make_app)

    @app.workflow()
    async def notify() -> None:
        await tether.outbox(f"{receiver.url}/moved", {"n": 1})

    receiver.plan = [302, 308]  # two redirects (never followed), then the receiver accepts
    async with app:
        await (await app.start(notify, id="n")).result()
        (message,) = await settled(app, 1)
        assert message.status is OutboxStatus.DELIVERED
        assert message.attempts == 3
    assert receiver.keys("/moved") == [message.key] * 3  # every send a POST to the URL given
    assert [r.path for r in receiver.requests] == ["/moved"] * 3
    assert all(r.signed for r in receiver.requests)


async def test_a_redirect_error_says_what_happened_and_what_to_do(receiver: Receiver) -> None:
    from tether.outbox.client import Client

    receiver.plan = [301]
    with pytest.raises(HttpError, match="redirects are not followed") as caught:
        await Client("test").post(f"{receiver.url}/old", b"{}", {}, timeout=5.0,
                                  retryable_4xx=())  # fmt: skip
    assert caught.value.status == 301
    assert "point the destination at the final URL" in str(caught.value)


def test_the_receiver_applies_no_request_whose_sender_died_before_its_whole_body() -> None:
    """The crash tests kill senders mid-send: headers without their body must not be taken for
    a delivery (it was once recorded and applied as a None body under the message's key)."""
    with Receiver() as r:
        where = urlsplit(r.url)
        for cut_after in (b"", b'{"order": '):  # its headers alone, then part of its body
            with socket.create_connection((where.hostname, where.port)) as s:
                s.sendall(b"POST /cut HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k1\r\n"
                          b"Content-Length: 40\r\n\r\n" + cut_after)  # fmt: skip
        with socket.create_connection((where.hostname, where.port)) as s:
            s.sendall(b"POST /whole HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k2\r\n"
                      b"Content-Length: 2\r\n\r\n{}")  # fmt: skip
            s.recv(1024)  # answered: the request was handled
        deadline = time.monotonic() + 5
        while len(r.broken) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert r.broken == ["/cut", "/cut"]
        assert [(d.path, d.key, d.body) for d in r.requests] == [("/whole", "k2", {})]
        assert r.applied == {"k2": {}}


@pytest.fixture
def keepalive() -> Iterator[tuple[str, list[int]]]:
    """An HTTP/1.1 receiver that keeps connections open; it records each POST's client port."""
    import http.server
    import threading

    ports: list[int] = []

    class KeepAlive(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            ports.append(self.client_address[1])
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), KeepAlive)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", ports
    server.shutdown()
    server.server_close()
    thread.join(5)


async def test_a_sender_reuses_one_pooled_connection_for_sends_one_after_another(
    keepalive: tuple[str, list[int]],
) -> None:
    from tether.outbox.client import Client

    url, ports = keepalive
    client = Client("test")
    for _ in range(3):
        assert await client.post(f"{url}/in", b"{}", {}, timeout=5.0, retryable_4xx=()) == 200
    await client.aclose()
    assert len(ports) == 3
    assert len(set(ports)) == 1  # one connection carried the three
    assert await client.post(f"{url}/in", b"{}", {}, timeout=5.0, retryable_4xx=()) == 200
    await client.aclose()
    assert ports[3] != ports[0]  # closed, then a new connection


async def test_the_worker_closes_its_http_senders_connections_when_it_stops(
    make_app: Callable[..., tether.App], keepalive: tuple[str, list[int]]
) -> None:
    url, _ = keepalive
    sender = tether.HttpSender(f"{url}/in")
    app = make_app(senders={"in": sender})

    @app.workflow()
    async def one() -> None:
        await tether.outbox("in", {"n": 1})

    async with app:
        await (await app.start(one, id="one")).result()
        (message,) = await settled(app, 1)
        assert sender._client._http is not None  # the pool is open while the worker runs
    assert sender._client._http is None  # the worker's end closed it
    assert message.status is OutboxStatus.DELIVERED


@pytest.mark.parametrize(
    ("url", "seen"),
    [
        (
            "https://ops:pw@hooks.example.com:8443/in?token=t#frag",
            "https://hooks.example.com:8443/in?…",
        ),
        ("http://[::1]:9000/x", "http://[::1]:9000/x"),
        ("https://hooks.example.com", "https://hooks.example.com"),
        ("https://user@hooks.example.com/a?b=c", "https://hooks.example.com/a?…"),
        ("http://h:notaport/x", "<an unparsable URL>"),
        ("no scheme \x1b[31m", "no scheme \\x1b[31m"),
    ],
)
def test_urls_in_logs_and_errors_lose_their_credentials_and_query(url: str, seen: str) -> None:
    from tether.outbox.client import shown

    assert shown(url) == seen
    if url.startswith("http"):
        assert repr(tether.HttpSender(url)) == f"HttpSender({seen!r})"


async def test_a_key_that_cannot_travel_in_a_header_fails_at_once_saying_why(
    make_app: Callable[..., tether.App], receiver: Receiver
) -> None:
    app = signed_app(make_app)

    @app.workflow()
    async def notify() -> None:
        await tether.outbox(f"{receiver.url}/k", {"n": 1}, key="order 7\r\nX-Evil: 1")

    async with app:
        await (await app.start(notify, id="k")).result()
        (failed,) = await settled(app, 1)
    assert failed.status is OutboxStatus.FAILED
    assert failed.attempts == 1
    assert "cannot travel in an HTTP header" in json.loads(failed.error or "{}")["message"]
    assert receiver.requests == []


async def test_replay_records_no_second_message(
    make_app: Callable[..., tether.App], receiver: Receiver
) -> None:
    sent: list[str] = []

    class Collect(tether.Sender):
        async def send(self, message: tether.OutboxMessage) -> None:
            sent.append(message.key)

    app = signed_app(make_app, collect=Collect())

    @app.step()
    async def fetch() -> int:
        return 41

    @app.workflow()
    async def flow() -> list[str]:
        first = await tether.outbox("collect", {"n": 1})
        n = await fetch()
        second = await tether.outbox("collect", {"n": n + 1})
        return [first.id, second.id]

    async with app:
        ids = await (await app.start(flow, id="flow")).result()
        messages = await settled(app, 2)
        history = await (await app.get("flow")).checkpoints()
    assert sorted(m.id for m in messages) == sorted(ids)
    assert len(set(ids)) == 2
    assert sorted(sent) == sorted(m.key for m in messages)
    assert [(c.name, c.kind) for c in history] == [
        ("outbox", "outbox"),
        ("fetch", "step"),
        ("outbox#2", "outbox"),
    ]


# -- misuse --------------------------------------------------------------------------------------


async def test_an_unknown_destination_is_refused_at_the_call(
    make_app: Callable[..., tether.App],
) -> None:
    app = make_app()

    @app.workflow()
    async def flow() -> str:
        try:
            await tether.outbox("nowhere", {})
        except ConfigurationError as exc:
            return str(exc)
        return "recorded"

    async with app:
        text = await (await app.start(flow, id="f")).result()
    assert "unknown outbox destination 'nowhere'" in text
    assert "http(s)://" in text
    assert await app.list_outbox() == []


async def test_outbox_outside_a_workflow_or_in_a_plain_step_is_refused(
    make_app: Callable[..., tether.App],
) -> None:
    app = make_app()
    with pytest.raises(NotInWorkflow):
        tether.outbox("https://example.invalid/x", {})

    @app.step(retry=tether.NO_RETRY)
    async def plain() -> None:
        tether.outbox("https://example.invalid/x", {})

    @app.workflow()
    async def flow() -> None:
        await plain()

    async with app:
        with pytest.raises(tether.RunFailed, match="plain step has no commit"):
            await (await app.start(flow, id="f")).result()
    with pytest.raises(ConfigurationError, match="async def send"):
        tether.App("memory://", senders={"bad": object()})  # type: ignore[dict-item]


# -- unknown outcomes, claims ----------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/outbox.db"
    else:
        url = request.getfixturevalue("postgres_url")
        yield with_schema(url, f"t_{uuid.uuid4().hex[:12]}")


async def record(store: Store, run_id: str, count: int = 1) -> list[str]:
    """A run holding `count` messages committed with its first checkpoint; their ids."""
    now = 1000.0
    await store.create_run(NewRun(run_id, "wf", "[[], {}]"), now, owner="w", lease_until=now + 60)
    messages = tuple(NewOutboxMessage(f"{run_id}-m{i}", "https://example.invalid/x",
                                      f"key-{run_id}-{i}", f'{{"i": {i}}}')
                     for i in range(count))  # fmt: skip
    done = tether.Checkpoint(0, "step", "transaction", tether.CheckpointStatus.COMPLETED,
                             attempts=1)  # fmt: skip

    def body(conn: Any) -> TransactionOutcome:
        return TransactionOutcome('"ok"', messages)

    assert await store.run_transaction(Lease(run_id, "w", 1), body, done, now) == '"ok"'
    return [m.id for m in messages]


@pytest.mark.parametrize("verdict", [True, None, False])
async def test_a_message_whose_send_outcome_is_unknown_is_reconciled_or_resent_with_its_key(
    store_url: str, verdict: bool | None
) -> None:
    sent: list[tether.OutboxMessage] = []
    asked: list[tether.OutboxMessage] = []

    class Ledger(tether.Sender):
        async def send(self, message: tether.OutboxMessage) -> None:
            sent.append(message)

        async def reconcile(self, message: tether.OutboxMessage) -> bool | None:
            asked.append(message)
            return verdict

    store = MemoryStore() if store_url == "memory://" else store_from_url(store_url)
    app = tether.App(store=store, senders={"https://example.invalid/x": Ledger()})
    await app.open()
    (mid,) = await record(store, "r1")
    # A worker that then died claimed it: its send may or may not have happened.
    (claimed,) = await store.claim_outbox("dead-worker", 1001.0, 1061.0, 10)
    assert claimed.status is OutboxStatus.SENDING
    assert not claimed.in_doubt
    async with app:  # its worker row is gone: the claim is taken over at once
        (message,) = await settled(app, 1)
    await app.close()

    assert message.status is OutboxStatus.DELIVERED
    assert message.uncertain == 1
    assert message.attempts == 2
    assert not message.in_doubt
    assert [m.in_doubt for m in asked] == [True]
    if verdict is True:
        assert sent == []  # the receiver had it: not sent again
    else:
        assert [m.key for m in sent] == ["key-r1-0"]
        assert sent[0].id == mid


async def test_in_doubt_sends_that_keep_dying_end_failed_not_resent_forever(
    store_url: str,
) -> None:
    store = MemoryStore() if store_url == "memory://" else store_from_url(store_url)
    app = tether.App(store=store)
    app.outbox_retry = tether.Retry(max_attempts=2)
    await app.open()
    await record(store, "r1")
    for n in range(2):  # two sends whose workers died
        (claimed,) = await store.claim_outbox(f"dead-{n}", 1001.0 + n, 1001.5 + n, 10)
        assert claimed.uncertain == n
    async with app:
        (message,) = await settled(app, 1)
    await app.close()
    assert message.status is OutboxStatus.FAILED
    assert message.uncertain == 2
    error = json.loads(message.error or "{}")
    assert error["type"].endswith(StepOutcomeUnknown.__name__)
    assert "unknown" in error["message"]


async def test_two_claimers_never_take_the_same_message_and_a_stale_claim_cannot_settle(
    store_url: str,
) -> None:
    first = MemoryStore() if store_url == "memory://" else store_from_url(store_url)
    second = first if store_url == "memory://" else store_from_url(store_url)
    await first.open()
    await second.open()
    try:
        ids = await record(first, "r1", count=20)
        for w in ("a", "b"):
            await first.register_worker(WorkerInfo(w, "h", 1, "t"), 1000.0)
        a, b = await asyncio.gather(first.claim_outbox("a", 1001.0, 1002.0, 12),
                                    second.claim_outbox("b", 1001.0, 1002.0, 12))  # fmt: skip
        assert len(a) + len(b) == 20
        assert not {m.id for m in a} & {m.id for m in b}
        assert {m.id for m in a} | {m.id for m in b} == set(ids)
        assert await first.next_outbox_at() == 1002.0  # when the claims expire

        # The claims expire and b takes one message over: its first claimer's late outcome
        # is refused; the second claim's is recorded.
        (taken,) = await second.claim_outbox("b", 1003.0, 1100.0, 1)
        stale = {m.id: m for m in a + b}[taken.id]
        assert taken.claim == stale.claim + 1
        assert taken.in_doubt
        assert taken.uncertain == 1
        done = OutboxSettlement(OutboxStatus.DELIVERED)
        assert not await first.settle_outbox(taken.id, stale.claim, done, 1004.0)
        assert await second.settle_outbox(taken.id, taken.claim, done, 1004.0)
        (stored,) = [m for m in await first.list_outbox(run_id="r1") if m.id == taken.id]
        assert stored.status is OutboxStatus.DELIVERED
        assert stored.delivered_at == 1004.0
        # An expired claim that nobody took over still records its outcome.
        other = next(m for m in a + b if m.id != taken.id)
        retry = OutboxSettlement(OutboxStatus.PENDING, next_at=2000.0, error='{"x": 1}')
        assert await first.settle_outbox(other.id, other.claim, retry, 1005.0)
        (again,) = [m for m in await first.list_outbox() if m.id == other.id]
        assert again.status is OutboxStatus.PENDING
        assert again.next_at == 2000.0
    finally:
        await first.close()
        if second is not first:
            await second.close()

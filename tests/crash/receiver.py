"""A real HTTP receiver of outbox messages for the tests: a threading http.server on 127.0.0.1
that records every POST, applies each idempotency key once (the effect a well-behaved receiver
has), and answers as the test plans: statuses to give, in order, and requests to hold without
answering (while the test kills the sender). Signatures are checked when given a secret.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from tether.webhooks import verify


@dataclass(frozen=True)
class Delivery:
    """One POST the receiver got."""

    path: str
    key: str
    message_id: str
    body: Any
    signed: bool  # a valid Standard Webhooks signature (only checked with a secret)


class Receiver:
    """Start with `with Receiver() as r:`; `r.url` is its base URL."""

    def __init__(self, secret: str | None = None) -> None:
        self.secret = secret
        self.requests: list[Delivery] = []
        self.broken: list[str] = []  # paths of requests cut off before their whole body came
        self.applied: dict[str, Any] = {}  # idempotency key -> the body applied, once
        self.plan: list[int] = []  # statuses for the next requests (then 200)
        self.hold_paths: set[str] = set()  # the first request to each of these is never answered
        self.held = threading.Event()  # set once a request is being held
        self._release = threading.Event()
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length", 0))
        raw = handler.rfile.read(length)
        if len(raw) < length:
            # The sender died in the middle of its request (headers and body go in separate
            # writes): no HTTP server hands an incomplete body to its application.
            with self._lock:
                self.broken.append(handler.path)
            return
        signed = False
        if self.secret is not None:
            with contextlib.suppress(Exception):
                verify(self.secret, raw, handler.headers, now=time.time())
                signed = True
        key = handler.headers.get("Idempotency-Key", "")
        delivery = Delivery(handler.path, key, handler.headers.get("Tether-Message-Id", ""),
                            json.loads(raw or b"null"), signed)  # fmt: skip
        with self._lock:
            self.requests.append(delivery)
            status = self.plan.pop(0) if self.plan else 200
            if 200 <= status < 300:
                self.applied.setdefault(key, delivery.body)  # a repeated key changes nothing
            hold = handler.path in self.hold_paths
            self.hold_paths.discard(handler.path)
        if hold:
            self.held.set()
            self._release.wait(30)  # the sender is killed meanwhile; never answered
            return
        body = b'{"ok": true}'
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        if status == 429:
            handler.send_header("Retry-After", "0")
        handler.end_headers()
        with contextlib.suppress(OSError):
            handler.wfile.write(body)

    def keys(self, path: str | None = None) -> list[str]:
        with self._lock:
            return [r.key for r in self.requests if path is None or r.path == path]

    def wait_for(self, count: int, timeout: float = 10.0) -> None:
        """Until `count` requests have come (AssertionError after `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.requests)} of {count} requests came")
            time.sleep(0.005)

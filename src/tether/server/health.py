"""The probes of a deployment: GET /healthz (the process is up) and GET /readyz (the database
answers, and the App opened it, which checked its schema), on `tether serve` and on `tether
worker --health-port`.

They answer before the token, the Host check and the OpenAPI document: a load balancer or the
kubelet asks by address. They must not read anything but that one cheap query, nor say more
to an anonymous caller than why the process is not ready (a database URL may hold a password).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator, Iterator

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from tether.app import App
from tether.errors import ConfigurationError
from tether.redact import redact_text
from tether.server.http import SECURITY_HEADERS

log = logging.getLogger("tether.server")

HEALTHZ = "/healthz"
READYZ = "/readyz"
READY_TIMEOUT = 2.0  # seconds the database may take to answer a readiness probe


async def readiness(app: App) -> str | None:
    """None when `app` is ready, else why not. The App's open() refused a schema the code does
    not match; this asks the database one cheap question, to see that it still answers."""
    try:
        await asyncio.wait_for(app.engine.store.last_event_id(), READY_TIMEOUT)
    except TimeoutError:
        return f"the database did not answer within {READY_TIMEOUT:g} s"
    except Exception as exc:  # any failure of the database means not ready, and says why
        log.warning("readiness probe: the database did not answer: %s", redact_text(str(exc)))
        return f"the database did not answer ({type(exc).__name__}); the process's log says why"
    return None


class Probes:
    """ASGI: answer GET (or HEAD) /healthz and /readyz of `app`, and hand every other request
    to `inner` (404 when there is none, as on a worker's health port)."""

    def __init__(self, inner: ASGIApp | None, app: App) -> None:
        self.inner, self.app = inner, app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path") if scope["type"] == "http" else None
        if path in (HEALTHZ, READYZ):
            if scope["method"] not in ("GET", "HEAD"):
                await _send(send, 405, {"detail": f"{path} answers GET"}, scope, allow=True)
                return
            reason = None if path == HEALTHZ else await readiness(self.app)
            body = {"status": "ok"} if reason is None else {"status": "unready", "reason": reason}
            await _send(send, 200 if reason is None else 503, body, scope)
        elif self.inner is not None:
            await self.inner(scope, receive, send)
        elif scope["type"] == "http":
            await _send(send, 404, {"detail": f"this port serves {HEALTHZ} and {READYZ}"}, scope)
        # lifespan and websockets on a bare health port: nothing to set up, nothing to accept


async def _send(
    send: Send, status: int, body: dict[str, str], scope: Scope, *, allow: bool = False
) -> None:
    data = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        (b"cache-control", b"no-store"),
        *SECURITY_HEADERS,
    ]
    if allow:
        headers.append((b"allow", b"GET, HEAD"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else data})


class _Embedded(uvicorn.Server):
    """A uvicorn server inside a process that handles its own signals (`tether worker`)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def probe_server(app: App, host: str, port: int) -> contextlib.AbstractAsyncContextManager[None]:
    """Serve the probes of `app` on host:port until the block ends (`tether worker
    --health-port`); ConfigurationError when the port cannot be bound."""
    return embedded_server(Probes(None, app), host, port, "the health probes", "--health")


@contextlib.asynccontextmanager
async def embedded_server(
    asgi: ASGIApp, host: str, port: int, what: str, option: str
) -> AsyncIterator[None]:
    """Serve `asgi` on host:port inside this process until the block ends; ConfigurationError
    naming `what` and the CLI options `{option}-port`/`{option}-host` when the port cannot be
    bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:  # bound here, so that a port in use is an OSError saying so, not uvicorn's exit
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigurationError(
            f"cannot serve {what} on {host}:{port} ({exc}); pick a free port with "
            f"{option}-port, or the address of one of this host's interfaces with {option}-host"
        ) from None
    config = uvicorn.Config(asgi, log_config=None, access_log=False,
                            lifespan="off", server_header=False, log_level="warning")  # fmt: skip
    server = _Embedded(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.01)
    if serving.done():
        sock.close()
        serving.result()  # its error, if any
        raise OSError(f"{what} on {host}:{port} stopped as they started")
    try:
        yield
    finally:
        server.should_exit = True
        await serving
        sock.close()


__all__ = ["HEALTHZ", "READYZ", "Probes", "embedded_server", "probe_server", "readiness"]

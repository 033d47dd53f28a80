"""A run's stream as Server-Sent Events: one event per entry, its offset as the SSE id, so a
browser's EventSource resumes after a reconnect (Last-Event-ID) and a client may start at any
`?offset=`. Ends with an `end` event when the run has ended and everything was sent.

Shared by the API (bearer tokens) and the inbox (sessions); authorization is the caller's, who
also passes `alive`, asked every CHECK_SECONDS: the stream closes once the token or session that
opened it no longer holds (revoked, signed out). Offsets are ASCII decimal integers below 2**63.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import HTTPException, Request
from fastapi.responses import StreamingResponse

from tether.app import App
from tether.redact import redact
from tether.streams import StreamReset

HEARTBEAT = 15.0  # seconds between keep-alive comments (proxies drop silent connections)
CHECK_SECONDS = 5.0  # how often an open stream asks whether its token or session still holds
MAX_SECONDS = 300.0  # a connection is closed after this; EventSource reconnects and resumes
END = 2**63  # offsets are below this (a PostgreSQL bigint)
_DECIMAL = re.compile(r"[0-9]{1,19}")  # ASCII only: str.isdigit() also accepts "²" and "٣"

Alive = Callable[[], Awaitable[bool]]


def _offset(text: str, what: str, limit: int) -> int:
    if not _DECIMAL.fullmatch(text) or int(text) >= limit:
        raise HTTPException(
            400, f"{what} must be an offset: ASCII decimal digits, from 0 to {limit - 1}"
        )
    return int(text)


def start_offset(request: Request, offset: str | int | None) -> int:
    """Where to start: after the Last-Event-ID of a reconnect, else `?offset=` (as the query
    gave it, or already an int), else 0. Either must be ASCII decimal digits in range;
    anything else is a 400."""
    last = request.headers.get("last-event-id")
    if last is not None:
        return _offset(last, "Last-Event-ID (the id of the last event seen)", END - 1) + 1
    if offset is None:
        return 0
    return _offset(str(offset) if isinstance(offset, int) else offset, "?offset=", END)


async def _always() -> bool:
    return True


def event_stream(
    app: App, run_id: str, key: str, offset: int, follow: bool, alive: Alive = _always
) -> StreamingResponse:
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(_events(app, run_id, key, offset, follow, alive),
                             media_type="text/event-stream", headers=headers)  # fmt: skip


async def _events(
    app: App, run_id: str, key: str, offset: int, follow: bool, alive: Alive
) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    closes = loop.time() + MAX_SECONDS
    beat = checked = loop.time()
    queue: asyncio.Queue[tuple[int, object] | None] = asyncio.Queue(maxsize=256)

    async def pump() -> None:
        try:
            async with contextlib.aclosing(app.read_stream(run_id, key, offset,
                                                           follow=follow)) as entries:  # fmt: skip
                async for entry in entries:
                    await queue.put(entry)
        finally:
            await queue.put(None)

    reader = asyncio.create_task(pump())
    try:
        while loop.time() < closes:
            if loop.time() >= checked + CHECK_SECONDS:
                checked = loop.time()
                if not await alive():
                    yield "event: signed-out\ndata: the token or session of this stream ended\n\n"
                    return
            try:
                async with asyncio.timeout(CHECK_SECONDS):
                    item = await queue.get()
            except TimeoutError:
                if loop.time() >= beat + HEARTBEAT:
                    beat = loop.time()
                    yield ": keep-alive\n\n"
                continue
            beat = loop.time()
            if item is None:
                reader.result()  # raises what the reader met
                status = (await (await app.get(run_id)).status()).value
                yield f"event: end\ndata: {json.dumps({'status': status})}\n\n"
                return
            yield _format(*item)
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader


def _format(offset: int, entry: object) -> str:
    if isinstance(entry, StreamReset):
        data = {"offsets": list(entry.offsets), "step": entry.step}
        return f"id: {offset}\nevent: reset\ndata: {json.dumps(data)}\n\n"
    # The chunk as JSON on one line (SSE data lines cannot hold raw newlines), secrets redacted.
    return f"id: {offset}\nevent: chunk\ndata: {json.dumps(redact(entry), default=str)}\n\n"

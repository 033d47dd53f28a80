"""A run's stream as Server-Sent Events: one event per entry, its offset as the SSE id, so a
browser's EventSource resumes after a reconnect (Last-Event-ID) and a client may start at any
`?offset=`. Ends with an `end` event when the run has ended and everything was sent.

Shared by the API (bearer tokens) and the inbox (sessions); authorization is the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from fastapi import HTTPException, Request
from fastapi.responses import StreamingResponse

from tether.app import App
from tether.redact import redact
from tether.streams import StreamReset

HEARTBEAT = 15.0  # seconds between keep-alive comments (proxies drop silent connections)
MAX_SECONDS = 300.0  # a connection is closed after this; EventSource reconnects and resumes


def start_offset(request: Request, offset: int | None) -> int:
    """Where to start: after the Last-Event-ID of a reconnect, else `?offset=`, else 0."""
    last = request.headers.get("last-event-id")
    if last is not None:
        if not last.isdigit():
            raise HTTPException(400, "Last-Event-ID must be the offset of the last event seen")
        return int(last) + 1
    return offset or 0


def event_stream(app: App, run_id: str, key: str, offset: int, follow: bool) -> StreamingResponse:
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(_events(app, run_id, key, offset, follow),
                             media_type="text/event-stream", headers=headers)  # fmt: skip


async def _events(app: App, run_id: str, key: str, offset: int, follow: bool) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    closes = loop.time() + MAX_SECONDS
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
            try:
                async with asyncio.timeout(HEARTBEAT):
                    item = await queue.get()
            except TimeoutError:
                yield ": keep-alive\n\n"
                continue
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

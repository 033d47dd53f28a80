"""Streams: append-only, offset-addressed logs of chunks that a run writes, for UIs that
resume (docs/streams.md).

`await tether.stream(key).write(chunk)` in workflow code appends the chunk once: the write
takes a checkpoint slot, so replay skips it, and carries that checkpoint's name as its dedupe
ref, so a re-append after a crash is ignored by the store. In a step, chunks are buffered and
appended in batches (BATCH chunks, or LINGER seconds after the first), always before the step's
checkpoint is written; a step attempt that raises has its chunks retracted by a reset marker, and
the first write of an attempt retracts what earlier attempts of the step left behind (a crash).
`read` (behind `app.read_stream`) yields entries from an offset and follows the stream live until
the run ends. Sits above tether.core, beside tether.approvals; it never imports a backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tether.core.context import StepContext, current_scope
from tether.core.engine import Engine
from tether.core.execution import RunContext
from tether.core.outage import MISSING
from tether.errors import ConfigurationError, RunNotFound
from tether.store.port import CheckpointStatus
from tether.store.port.streams import StreamAppend, StreamEntry, StreamKind

BATCH = 256  # a step's buffered chunks are appended when this many wait...
LINGER = 0.005  # ...or this many seconds after the first of them was written
PAGES = (50, 200, 1000)  # entries a reader asks for at once: few first, for a quick start
POLL = 0.01  # how often a reader at the end looks for entries other processes appended
KEY_MAX = 256


@dataclass(frozen=True, slots=True)
class StreamReset:
    """A reset marker in a stream: the chunks at `offsets` were written by an attempt of step
    `step` that failed (or died); readers drop them. Keep the chunks; on a StreamReset remove
    those offsets."""

    offsets: tuple[int, ...]
    step: str


def check_stream_key(key: str) -> str:
    if not isinstance(key, str) or not key or len(key) > KEY_MAX:
        raise ConfigurationError(
            f"a stream key is a non-empty string of at most {KEY_MAX} characters, not {key!r}"
        )
    return key


class Stream:
    """A stream of the current run, by key: `await tether.stream("tokens").write(chunk)`."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = check_stream_key(key)

    def __repr__(self) -> str:
        return f"<tether stream {self.key!r}>"

    async def write(self, chunk: object) -> None:
        """Append `chunk` (a JSON value, encoded like step results; PayloadTooLarge before
        anything is written). In workflow code it is durable when this returns; in a step it
        is buffered, and durable before the step's outcome is."""
        ctx, step = current_scope("stream")
        text = ctx.engine.serde.dumps(chunk, what=f"a chunk of stream {self.key!r}")
        if step is None:
            await _write_from_workflow(ctx, self.key, text)
        else:
            await _writer(ctx, step, self.key).write(text)


def stream(key: str) -> Stream:
    """The stream `key` of the running run, to write chunks to from the workflow or its steps
    (async steps: a sync step cannot await a write). Raises NotInWorkflow outside a run."""
    check_stream_key(key)
    _, step = current_scope("stream")
    if step is not None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise ConfigurationError(
                f"step {step.name!r} is a plain def, so it cannot await stream writes; make it "
                f"an async def to write to stream {key!r}"
            ) from None
    return Stream(key)


async def _write_from_workflow(ctx: RunContext, key: str, text: str) -> None:
    """One chunk, once: replay finds the checkpoint and skips it; a crash between the append
    and the checkpoint leaves the append, which the store finds again by its ref."""
    slot = ctx.slot(f"stream:{key}", "stream")
    if slot.recorded is not None:
        return
    name = slot.name
    engine = ctx.engine
    entry = StreamAppend(StreamKind.CHUNK, text, writer=name, attempt=0, ref=name)
    await ctx.at_frontier()
    if ctx.pending:
        # Recorded helpers first, like before every other effect: the chunk may hold a value
        # (a uuid4, a now) that replay must give back as it is.
        await ctx.flush()

    async def append() -> list[int]:
        return await engine.store.append_stream(ctx.lease, key, [entry], engine.clock.now())

    offsets = await ctx.durable(append, append)  # appending again is reading back
    engine.stream_appended(ctx.run_id, key)
    now = engine.clock.now()
    # Written with the next checkpoint, like the recorded helpers: losing it only means that
    # replay appends again, which the ref turns into a look-up.
    ctx.pending.append(slot.checkpoint(CheckpointStatus.COMPLETED, result=str(offsets[0]),
                                       attempts=1, started_at=now, finished_at=now))  # fmt: skip


def _writer(ctx: RunContext, step: StepContext, key: str) -> _StepWriter:
    """This step attempt's writer of stream `key`, made and attached on its first write."""
    found = step.attached.get((__name__, key))
    if isinstance(found, _StepWriter):
        return found
    writer = _StepWriter(ctx, step, key)
    step.attached[(__name__, key)] = writer
    step.finalizers.append(writer.finish)
    return writer


class _StepWriter:
    """The chunks one step attempt writes to one stream: buffered, appended in batches (one
    transaction each, in order), settled by `finish` before the attempt's checkpoint."""

    def __init__(self, ctx: RunContext, step: StepContext, key: str) -> None:
        self.ctx, self.step, self.key = ctx, step, key
        self.buffer: list[str] = []
        self.written: list[int] = []  # offsets of this attempt's chunks, durable
        self.earlier: list[int] | None = None  # earlier attempts' leftovers, to retract first
        self.lock = asyncio.Lock()  # one batch at a time, in order
        self.timer: asyncio.Task[None] | None = None  # the LINGER flush, until it is done
        self.lingering = False  # the timer still sleeps (it has not started to flush)
        self.failure: BaseException | None = None  # a background flush failed: raise it
        self.closed = False

    async def write(self, text: str) -> None:
        if self.closed:
            raise ConfigurationError(
                f"stream {self.key!r} was written after attempt {self.step.attempt} of step "
                f"{self.step.name!r} ended; write from the step's own code, before it returns"
            )
        if self.failure is not None:
            raise self.failure
        self.buffer.append(text)
        if len(self.buffer) >= BATCH:
            self._stop_timer(flushing_too=False)
            await self.flush()
        elif self.timer is None:
            self.lingering = True
            self.timer = asyncio.create_task(self._linger(), name=f"tether-stream-{self.key}")

    async def _linger(self) -> None:
        try:
            await asyncio.sleep(LINGER)
            self.lingering = False
            while self.buffer:  # chunks written meanwhile go in the next batch at once
                await self.flush()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # LeaseLost (as Abandon), the store gone: raised later
            self.failure = exc
        finally:
            if self.timer is asyncio.current_task():
                self.timer = None

    def _stop_timer(self, *, flushing_too: bool) -> None:
        if self.timer is not None and (self.lingering or flushing_too):
            self.timer.cancel()
            self.timer = None
        self.lingering = False

    async def flush(self) -> None:
        """Append the buffered chunks (after retracting what earlier attempts left)."""
        async with self.lock:
            if self.failure is not None:
                raise self.failure
            batch, self.buffer = self.buffer, []
            if batch:
                await self._append(batch)

    async def _append(self, batch: list[str]) -> None:
        ctx, step, key = self.ctx, self.step, self.key
        engine = ctx.engine
        store = engine.store

        async def leftovers() -> list[int]:
            return await store.stream_unretracted(ctx.run_id, key, step.name)

        if self.earlier is None:
            self.earlier = await ctx.durable(leftovers, leftovers)
        earlier, done = self.earlier, len(self.written)
        entries = [StreamAppend(StreamKind.CHUNK, text, step.name, step.attempt) for text in batch]
        if earlier:  # the retraction goes first, in the same transaction
            reset = StreamAppend(StreamKind.RESET, json.dumps(earlier), step.name, step.attempt)
            entries.insert(0, reset)

        async def append() -> list[int]:
            offsets = await store.append_stream(ctx.lease, key, entries, engine.clock.now())
            return offsets[len(offsets) - len(batch) :]

        async def read_back() -> object:
            # Unretracted chunks of this step: after the append, exactly this attempt's.
            live = await leftovers()
            if set(earlier) & set(live) or len(live) != done + len(batch):
                return MISSING
            return live[done:]

        self.written += await ctx.durable(append, read_back)
        self.earlier = []
        engine.stream_appended(ctx.run_id, key)

    async def _retract(self) -> None:
        """Retract this attempt's chunks: one reset marker naming their offsets."""
        ctx, step, key = self.ctx, self.step, self.key
        engine = ctx.engine
        offsets = list(self.written)
        reset = StreamAppend(StreamKind.RESET, json.dumps(offsets), step.name, step.attempt)

        async def append() -> None:
            await engine.store.append_stream(ctx.lease, key, [reset], engine.clock.now())

        async def read_back() -> object:
            live = await engine.store.stream_unretracted(ctx.run_id, key, step.name)
            return MISSING if set(offsets) & set(live) else None

        await ctx.durable(append, read_back)
        self.written = []
        engine.stream_appended(ctx.run_id, key)

    async def finish(self, error: BaseException | None) -> None:
        """The attempt's body ended: flush (and, if it raised, retract) before its checkpoint.
        Interrupted (cancelled, lease lost) it writes nothing: the buffer is dropped, and the
        next attempt retracts what was appended."""
        interrupted = error is not None and not isinstance(error, Exception)
        self._stop_timer(flushing_too=interrupted)
        try:
            if interrupted:
                self.buffer = []
                return
            await self.flush()
            if error is not None and self.written:
                await self._retract()
        finally:
            self.closed = True


async def read(
    engine: Engine, run_id: str, key: str, offset: int = 0, *, follow: bool = True
) -> AsyncGenerator[tuple[int, object], None]:
    """Entries of the stream from `offset` on, as (offset, chunk) and (offset, StreamReset);
    with `follow`, waits at the end for more until the run has ended (then one last read)."""
    store = engine.store
    run = await store.get_run(run_id)
    if run is None:
        raise RunNotFound(f"no run has id {run_id!r}; check the id with `tether runs list`")
    ended = run.status.terminal
    pages = iter(PAGES)
    while True:
        limit = next(pages, PAGES[-1])
        # Registered before the read: an append in between still wakes this reader.
        waiter = engine.stream_future(run_id, key) if follow and not ended else None
        try:
            page = await store.read_stream(run_id, key, offset, limit)
            for entry in page:
                yield entry.offset, _decode(engine, entry)
                offset = entry.offset + 1
            if len(page) == limit:
                continue
            if ended or not follow or waiter is None:
                return
            run = await store.get_run(run_id)
            ended = run is None or run.status.terminal
            if ended:
                continue  # the last read: whatever the run appended before it ended
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL):
                    await waiter
        finally:
            if waiter is not None:
                engine.drop_stream_future(run_id, key, waiter)


def _decode(engine: Engine, entry: StreamEntry) -> object:
    if entry.kind is StreamKind.RESET:
        return StreamReset(offsets=tuple(json.loads(entry.data)), step=entry.writer)
    return engine.serde.loads(entry.data, what=f"a chunk of stream at offset {entry.offset}")


class StreamsMixin:
    """App.read_stream (App inherits it)."""

    engine: Engine

    if TYPE_CHECKING:

        async def open(self) -> None: ...

    def read_stream(
        self, run_id: str, key: str, offset: int = 0, *, follow: bool = True
    ) -> AsyncGenerator[tuple[int, object], None]:
        """The run's stream `key` from `offset` on, as `(offset, chunk)` pairs and `(offset,
        tether.StreamReset)` markers (drop the chunks at its offsets). With `follow` it waits
        for new entries until the run ends, then stops; RunNotFound (at the first iteration)
        for an unknown run. Close it (`contextlib.aclosing`) if you stop reading early."""
        check_stream_key(key)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ConfigurationError(f"a stream offset is an int >= 0, not {offset!r}")
        return self._read_stream(run_id, key, offset, follow)

    async def _read_stream(
        self, run_id: str, key: str, offset: int, follow: bool
    ) -> AsyncGenerator[tuple[int, object], None]:
        await self.open()
        async with contextlib.aclosing(read(self.engine, run_id, key, offset,
                                                    follow=follow)) as entries:  # fmt: skip
            async for entry in entries:
                yield entry

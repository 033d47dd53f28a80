"""Statements sent straight through libpq (psycopg.pq) on an idle autocommit connection: the
hot path of a write alone (a checkpoint, a run's start and end) and of a read, without a
cursor's machinery. Values are dumped and rows loaded by psycopg's own Transformer, results read
by psycopg's own generator, errors raised as psycopg's classes: only sending the statement and
waiting for its answer are Tether's. It never runs inside a transaction or a pipeline, never
sends a statement without parameters (the simple protocol's), and knows nothing of runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import select
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import abc, adapt, errors, generators, pq
from psycopg.adapt import PyFormat
from psycopg.waiting import READY_R, READY_W, WAIT_R, WAIT_W

Conn = psycopg.AsyncConnection[Any]
Results = list[pq.abc.PGresult]

# An answer is waited for on the spot when the event loop has nothing else to run: poll() on
# the connection's socket for at most this long, before the wait goes to the loop. A round
# trip to a server nearby takes about 0.1 ms; on the spot it costs a third of the CPU it costs
# through the loop (no reader to register, no future, no turn of the loop). A connection whose
# answer did not come in time (a lock wait, a server far away) waits by the loop for a while.
ON_THE_SPOT = 0.002
BY_THE_LOOP = 1.0  # seconds a connection waits by the loop after an answer came late
# Answers taken on the spot never let the loop turn, so sockets that became ready meanwhile
# are not seen: once this long has passed since the loop last turned here, the next answer is
# waited for by the loop (as psycopg's own wait yields after 5 ms busy).
BUSY = 0.005
DRAIN = 1.0  # seconds an interrupted statement's answer is awaited, to keep its connection
MAX_PREPARED = 200  # statements prepared on one connection; more are sent unnamed

_NAMES = itertools.count()  # prepared statements' names, unique in the process
_SESSION = "_tether_direct"  # the attribute of a connection that holds its _Session
_PLACEHOLDER = re.compile(r"%(?:\((\w+)\))?s|%%")
_OK = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)
_IDLE = pq.TransactionStatus.IDLE
_OFF = pq.PipelineStatus.OFF
# Deallocated behind our back (DISCARD ALL, a pooler's reset) or, after a fork, a name taken:
# the statement never ran, so it is prepared again.
_STALE = (errors.InvalidSqlStatementName, errors.DuplicatePreparedStatement)


@dataclass(frozen=True, slots=True)
class Numbered:
    """A statement with psycopg's placeholders as PostgreSQL's ($1, $2...): `names` says which
    value of a mapping goes where; None when its placeholders are positional (`%s`)."""

    text: bytes
    names: tuple[str, ...] | None

    @classmethod
    def of(cls, sql: str) -> Numbered:
        names: list[str] = []
        count = 0

        def number(found: re.Match[str]) -> str:
            nonlocal count
            if found.group(0) == "%%":
                return "%"
            name = found.group(1)
            if name is None:
                count += 1
                return f"${count}"
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        text = _PLACEHOLDER.sub(number, sql)
        if names and count:
            raise psycopg.ProgrammingError("a query mixes named and positional placeholders")
        return cls(text.encode(), tuple(names) if names else None)

    def values(self, params: Mapping[str, Any] | Sequence[Any]) -> list[Any]:
        if self.names is None:
            return list(params)
        assert isinstance(params, Mapping)
        try:
            return [params[name] for name in self.names]
        except KeyError as missing:
            raise psycopg.ProgrammingError(f"query parameter missing: {missing}") from None


@dataclass(slots=True)
class _Session:
    """What one connection has of the direct path: a Transformer per statement (as a cursor
    keeps one per query), the statements prepared on it, by their parameters' types, until when
    its answers are waited for by the loop, and when the loop last turned while it waited."""

    encoding: str
    transformers: dict[bytes, abc.Transformer] = field(default_factory=dict)
    prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = field(default_factory=dict)
    by_the_loop_until: float = 0.0
    turned: float = field(default_factory=time.monotonic)


class Direct:
    """Runs one statement at a time on connections it is handed, straight through libpq.
    `prepare`: False sends each statement unnamed, as PgBouncer in transaction mode needs."""

    def __init__(self, *, prepare: bool) -> None:
        self.prepare = prepare
        self._numbered: dict[str, Numbered] = {}

    @staticmethod
    def takes(conn: Conn, params: object) -> bool:
        """Whether a statement with these parameters may go this way on `conn` now."""
        pgconn = conn.pgconn
        return (
            bool(params)
            and conn.autocommit
            and pgconn.transaction_status == _IDLE
            and pgconn.pipeline_status == _OFF
        )

    async def execute(self, conn: Conn, sql: str, params: Mapping[str, Any] | Sequence[Any]) -> Any:
        """The statement's rows (a SELECT, a RETURNING) or the number of rows it changed."""
        numbered = self._numbered.get(sql)
        if numbered is None:
            numbered = self._numbered[sql] = Numbered.of(sql)
        # Kept on the connection itself, so it goes with it (its Transformers refer to it).
        session: _Session | None = getattr(conn, _SESSION, None)
        if session is None:
            session = _Session(conn.info.encoding)
            setattr(conn, _SESSION, session)
        tx = session.transformers.get(numbered.text)
        if tx is None:
            tx = session.transformers[numbered.text] = adapt.Transformer(conn)
        values = numbered.values(params)
        dumped = tx.dump_sequence(values, [PyFormat.AUTO] * len(values))
        pgconn = conn.pgconn
        key = (numbered.text, tx.types or ())
        if not self.prepare or (
            key not in session.prepared and len(session.prepared) >= MAX_PREPARED
        ):
            pgconn.send_query_params(
                numbered.text, dumped, param_types=tx.types, param_formats=tx.formats
            )
            return _outcome(await answer(conn, session), tx, session)
        for attempt in (1, 2):
            try:
                name = session.prepared.get(key)
                if name is None:
                    name = f"_tether_{next(_NAMES)}".encode()
                    pgconn.send_prepare(name, numbered.text, param_types=tx.types)
                    _outcome(await answer(conn, session), tx, session)
                    session.prepared[key] = name
                pgconn.send_query_prepared(name, dumped, param_formats=tx.formats)
                return _outcome(await answer(conn, session), tx, session)
            except _STALE:
                session.prepared.clear()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def _outcome(results: Results, tx: abc.Transformer, session: _Session) -> Any:
    if not results:
        raise psycopg.InterfaceError("the server sent no answer to a statement")
    result = results[-1]
    status = result.status
    if status not in _OK:
        raise errors.error_from_result(result, encoding=session.encoding)
    if status == pq.ExecStatus.COMMAND_OK:
        count = result.command_tuples
        return -1 if count is None else count
    tx.set_pgresult(result)
    return tx.load_rows(0, result.ntuples, tuple)


async def answer(conn: Conn, session: _Session) -> Results:
    """Send what is queued on the connection and read every result of it, with psycopg's own
    generator: on the spot while the event loop has nothing else to run, else by the loop.
    Cancelled, it still reads the answer (the statement was sent: it runs, whatever happens
    here) for up to DRAIN seconds, so the connection stays usable; else it closes it."""
    gen: Generator[int, int, Results] = generators.execute(conn.pgconn)
    fd = conn.pgconn.socket
    loop = asyncio.get_running_loop()
    wait = 0
    try:
        wait = next(gen)
        now = time.monotonic()
        if now - session.turned < BUSY and now >= session.by_the_loop_until and _idle(loop):
            wait = _on_the_spot(gen, fd, wait)
            session.by_the_loop_until = time.monotonic() + BY_THE_LOOP  # not answered in time
        while True:
            ready = await _ready(loop, fd, wait)
            session.turned = time.monotonic()
            wait = gen.send(ready)
    except StopIteration as done:
        results: Results = done.value
        return results
    except asyncio.CancelledError:
        await _drain(conn, gen, fd, wait)
        raise
    except BaseException:
        if conn.pgconn.transaction_status == pq.TransactionStatus.ACTIVE:
            await conn.close()  # interrupted in the middle (Ctrl-C): its state is unknown
        raise
    finally:
        gen.close()


async def _drain(conn: Conn, gen: Generator[int, int, Results], fd: int, wait: int) -> None:
    """Read the rest of an interrupted statement's answer, or close its connection."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(DRAIN):
            while wait:
                wait = gen.send(await _ready(loop, fd, wait))
    except StopIteration:
        return
    except BaseException:  # noqa: S110 - whatever stopped the drain, the connection goes
        pass
    with contextlib.suppress(Exception):
        await conn.close()


def _on_the_spot(gen: Generator[int, int, Results], fd: int, wait: int) -> int:
    """Drive `gen` with poll() on its socket for at most ON_THE_SPOT: what it waits for then
    (StopIteration once it ended)."""
    poller = select.poll()
    asked = _mask(wait)
    poller.register(fd, asked)
    deadline = time.monotonic() + ON_THE_SPOT
    while (left := deadline - time.monotonic()) > 0:
        events = poller.poll(left * 1000)
        if not events:
            break
        got = events[0][1]
        # An error or a hang-up is told as readable: libpq then reads it, psycopg raises it.
        ready = READY_R if got & (select.POLLIN | select.POLLERR | select.POLLHUP) else 0
        wait = gen.send(ready | (READY_W if got & select.POLLOUT else 0))
        if _mask(wait) != asked:
            asked = _mask(wait)
            poller.modify(fd, asked)
    return wait


def _mask(wait: int) -> int:
    return (select.POLLIN if wait & WAIT_R else 0) | (select.POLLOUT if wait & WAIT_W else 0)


def _idle(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether nothing else would run in this turn of the loop: no callback ready but
    cancelled ones (CPython's private ready queue; another loop counts as busy) and no timer
    due already. A timer or a socket that comes due meanwhile waits at most ON_THE_SPOT, as it
    would behind any callback that long."""
    ready = getattr(loop, "_ready", None)
    if ready is None or (ready and not all(handle.cancelled() for handle in ready)):
        return False
    scheduled = getattr(loop, "_scheduled", None)
    return not scheduled or scheduled[0].when() > loop.time()


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, wait: int) -> int:
    """Wait in the loop until the socket is ready as `wait` asks; what it is ready for."""
    future: asyncio.Future[int] = loop.create_future()

    def ready(flag: int) -> None:
        if not future.done():
            future.set_result(flag)

    if wait & WAIT_R:
        loop.add_reader(fd, ready, READY_R)
    if wait & WAIT_W:
        loop.add_writer(fd, ready, READY_W)
    try:
        return await future
    finally:
        if wait & WAIT_R:
            loop.remove_reader(fd)
        if wait & WAIT_W:
            loop.remove_writer(fd)

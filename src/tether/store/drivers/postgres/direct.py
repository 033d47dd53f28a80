"""Statements sent straight through libpq (psycopg.pq) on an idle autocommit connection: the
hot path of a write alone (a checkpoint, a run's start and end) and of a read, without a
cursor's machinery. Values are dumped and rows loaded by psycopg's own Transformer, results read
by psycopg's own generator, errors raised as psycopg's classes, a cancelled statement cancelled
in the server as psycopg does: only sending the statement and waiting for its answer are
Tether's. It never runs inside a transaction or a pipeline, never sends a statement without
parameters (the simple protocol's), and knows nothing of runs.
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

from tether.store.drivers.ready import others_ready

Conn = psycopg.AsyncConnection[Any]
Results = list[pq.abc.PGresult]

# An answer is waited for on the spot when the event loop has nothing else to do: poll() on the
# connection's socket for at most this long, before the wait goes to the loop. A round trip to
# a server nearby takes about 0.1 ms; on the spot it costs a third of the CPU it costs through
# the loop (no reader to register, no future, no turn of the loop). The loop's own selector is
# polled with it, so a socket of anything else that becomes ready ends the wait on the spot at
# once; a timer that comes due meanwhile waits at most this long. A connection whose answer did
# not come in time (a lock wait, a server far away) waits by the loop for BY_THE_LOOP seconds.
ON_THE_SPOT = 0.002
BY_THE_LOOP = 1.0
DRAIN = 1.0  # seconds a cancelled statement gets to be cancelled and answered, else closed
MAX_PREPARED = 200  # statements prepared on one connection; more are sent unnamed

_NAMES = itertools.count()  # prepared statements' names, unique in the process
_SESSION = "_tether_direct"  # the attribute of a connection that holds its _Session
_PLACEHOLDER = re.compile(r"%(?:\((\w+)\))?s|%%")
_OK = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)
_IDLE = pq.TransactionStatus.IDLE
_ACTIVE = pq.TransactionStatus.ACTIVE
_OFF = pq.PipelineStatus.OFF
# Deallocated behind our back (DISCARD ALL, a pooler's reset) or, after a fork, a name taken:
# the statement never ran, so it is prepared again.
_STALE = (errors.InvalidSqlStatementName, errors.DuplicatePreparedStatement)


@dataclass(frozen=True, slots=True)
class Numbered:
    """A statement with psycopg's placeholders as PostgreSQL's ($1, $2...): `names` says which
    value of a mapping goes where, None when its placeholders are positional (`%s`), `count`
    how many there are."""

    text: bytes
    names: tuple[str, ...] | None
    count: int

    @classmethod
    def of(cls, sql: str) -> Numbered | None:
        """The statement numbered; None when it has a placeholder of another kind (`%b`,
        `%t`) or a stray `%`, which only psycopg's cursor reads as psycopg does."""
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

        if "%" in _PLACEHOLDER.sub("", sql):
            return None
        text = _PLACEHOLDER.sub(number, sql)
        if names and count:
            return None
        return cls(text.encode(), tuple(names) if names else None, len(names) or count)

    def values(self, params: Mapping[str, Any] | Sequence[Any]) -> list[Any]:
        """The parameters in placeholder order, refused as psycopg's cursor refuses them."""
        if self.names is None:
            if isinstance(params, Mapping | str | bytes):
                raise psycopg.ProgrammingError("positional placeholders need a sequence")
            values = list(params)
            if len(values) != self.count:
                raise psycopg.ProgrammingError(
                    f"the query has {self.count} placeholders but {len(values)} parameters "
                    f"were passed"
                )
            return values
        if not isinstance(params, Mapping):
            raise psycopg.ProgrammingError("named placeholders need a mapping")
        try:
            return [params[name] for name in self.names]
        except KeyError as missing:
            raise psycopg.ProgrammingError(f"query parameter missing: {missing}") from None


@dataclass(slots=True)
class _Session:
    """What one connection has of the direct path: a Transformer per statement (as a cursor
    keeps one per query), the statements prepared on it, by their parameters' types, and until
    when its answers are waited for by the loop."""

    encoding: str
    transformers: dict[bytes, abc.Transformer] = field(default_factory=dict)
    prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = field(default_factory=dict)
    by_the_loop_until: float = 0.0


class Direct:
    """Runs one statement at a time on connections it is handed, straight through libpq.
    `prepare`: False sends each statement unnamed, as PgBouncer in transaction mode needs."""

    def __init__(self, *, prepare: bool) -> None:
        self.prepare = prepare
        self._numbered: dict[str, Numbered | None] = {}

    def takes(self, conn: Conn, sql: str, params: object) -> bool:
        """Whether this statement with these parameters may go this way on `conn` now."""
        pgconn = conn.pgconn
        return (
            bool(params)
            and conn.autocommit
            and pgconn.transaction_status == _IDLE
            and pgconn.pipeline_status == _OFF
            and self._numbering(sql) is not None
        )

    def _numbering(self, sql: str) -> Numbered | None:
        try:
            return self._numbered[sql]
        except KeyError:
            numbered = self._numbered[sql] = Numbered.of(sql)
            return numbered

    async def execute(self, conn: Conn, sql: str, params: Mapping[str, Any] | Sequence[Any]) -> Any:
        """The statement's rows (a SELECT, a RETURNING) or the number of rows it changed."""
        numbered = self._numbering(sql)
        assert numbered is not None, "a statement this way does not take"
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
        prepared = session.prepared
        if not self.prepare or (key not in prepared and len(prepared) >= MAX_PREPARED):
            pgconn.send_query_params(
                numbered.text, dumped, param_types=tx.types, param_formats=tx.formats
            )
            return _outcome(await answer(conn, session), tx, session)
        for attempt in (1, 2):
            try:
                name = prepared.get(key)
                if name is None:
                    # Known before its answer: prepared by a cancelled task, it is used (or,
                    # never prepared, found stale) rather than left unknown in the server.
                    name = prepared[key] = f"_tether_{next(_NAMES)}".encode()
                    pgconn.send_prepare(name, numbered.text, param_types=tx.types)
                    try:
                        _outcome(await answer(conn, session), tx, session)
                    except psycopg.Error:
                        del prepared[key]
                        raise
                pgconn.send_query_prepared(name, dumped, param_formats=tx.formats)
                return _outcome(await answer(conn, session), tx, session)
            except _STALE:
                prepared.clear()
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
    try:
        return tx.load_rows(0, result.ntuples, tuple)
    finally:
        tx.set_pgresult(None)  # the Transformer outlives the rows: it must not keep them


async def answer(conn: Conn, session: _Session) -> Results:
    """Send what is queued on the connection and read every result of it, with psycopg's own
    generator: on the spot while the event loop has nothing else to do, else by the loop.
    Cancelled, the statement is cancelled in the server and its answer read (DRAIN seconds at
    most), as psycopg's own wait does, so the connection stays usable; else it is closed."""
    gen: Generator[int, int, Results] = generators.execute(conn.pgconn)
    fd = conn.pgconn.socket
    loop = asyncio.get_running_loop()
    wait = 0
    try:
        wait = next(gen)
        if time.monotonic() >= session.by_the_loop_until and (other := _idle(loop)) is not None:
            wait, late = _on_the_spot(gen, fd, other, wait)
            if late:
                session.by_the_loop_until = time.monotonic() + BY_THE_LOOP
        while True:
            wait = gen.send(await _ready(loop, fd, wait))
    except StopIteration as done:
        results: Results = done.value
        return results
    except asyncio.CancelledError:
        await _interrupted(conn, gen, fd, wait)
        raise
    except BaseException:
        if conn.pgconn.transaction_status == _ACTIVE:
            await conn.close()  # interrupted in the middle (Ctrl-C): its state is unknown
        raise
    finally:
        gen.close()


async def _interrupted(conn: Conn, gen: Generator[int, int, Results], fd: int, wait: int) -> None:
    """A statement sent, its task cancelled: cancel it in the server and read its answer, or
    close its connection."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(Exception, asyncio.CancelledError):  # no answer: closed below
        async with asyncio.timeout(DRAIN):
            await conn.cancel_safe(timeout=DRAIN)
            while wait:
                wait = _step(gen, await _ready(loop, fd, wait))
    if wait:
        await conn.close()


def _step(gen: Generator[int, int, Results], ready: int) -> int:
    """What `gen` waits for next, 0 once it ended."""
    try:
        return gen.send(ready)
    except StopIteration:
        return 0


def _on_the_spot(
    gen: Generator[int, int, Results], fd: int, other: int, wait: int
) -> tuple[int, bool]:
    """Drive `gen` with poll() on its socket, and on `other` (the loop's selector: readable
    once any socket the loop waits on is), for at most ON_THE_SPOT: what it waits for then
    (StopIteration once it ended), and whether the answer came late."""
    poller = select.poll()
    asked = _mask(wait)
    poller.register(fd, asked)
    poller.register(other, select.POLLIN)
    deadline = time.monotonic() + ON_THE_SPOT
    while (left := deadline - time.monotonic()) > 0:
        ready = 0
        for got_fd, got in poller.poll(left * 1000):
            if got_fd != fd:
                return wait, False  # something else is ready: the loop takes over
            # An error or a hang-up is told as readable: libpq then reads it, psycopg raises.
            if got & (select.POLLIN | select.POLLERR | select.POLLHUP):
                ready |= READY_R
            if got & select.POLLOUT:
                ready |= READY_W
        if not ready:
            break
        wait = gen.send(ready)
        if _mask(wait) != asked:
            asked = _mask(wait)
            poller.modify(fd, asked)
    return wait, True


def _mask(wait: int) -> int:
    return (select.POLLIN if wait & WAIT_R else 0) | (select.POLLOUT if wait & WAIT_W else 0)


def _idle(loop: asyncio.AbstractEventLoop) -> int | None:
    """The file descriptor of the loop's selector when nothing else would run in this turn of
    the loop (no callback ready but cancelled ones, no timer due), else None. CPython's private
    ready queue, timers and selector: another loop, or a selector without a descriptor of its
    own, counts as busy."""
    if others_ready(loop):
        return None
    scheduled = getattr(loop, "_scheduled", None)
    if scheduled and scheduled[0].when() <= loop.time():
        return None
    try:
        other: int = loop._selector.fileno()  # type: ignore[attr-defined]
    except (AttributeError, NotImplementedError):
        return None
    return other


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

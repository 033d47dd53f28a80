"""Values a run publishes for its callers: `await tether.set_value(key, value)` in a workflow, and
`app.get_value(run_id, key, wait=...)` outside, read from the store without replay.

A reader waiting for a value wakes at once when this process sets it or stops executing the
run, and looks at the store every POLL seconds for what other processes wrote. It must not
import a backend, the server or the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from tether.clock import to_datetime
from tether.core.values import check_value_key, set_value, wake_key
from tether.errors import ConfigurationError, RunNotFound, ValueNotFound
from tether.store.port import RunRecord
from tether.store.port.values import ValueRecord

if TYPE_CHECKING:
    from tether.core.engine import Engine

__all__ = ["ValueInfo", "ValueNotFound", "ValuesMixin", "set_value"]

POLL = (0.02, 0.2)  # a waiting reader looks at the store this often: first, then at most


@dataclass(frozen=True, slots=True)
class ValueInfo:
    """A value a run published: its latest `value` under `key`, which set_value call of the
    run set it (`version`, from 1 per key) and when."""

    key: str
    value: object
    version: int
    set_at: datetime


_NO_DEFAULT = object()


class ValuesMixin:
    """The App's value methods (App inherits them)."""

    engine: Engine

    if TYPE_CHECKING:

        async def open(self) -> None: ...

    async def get_value(
        self,
        run_id: str,
        key: str,
        *,
        wait: float | timedelta | None = None,
        default: object = _NO_DEFAULT,
        after_version: int = 0,
    ) -> object:
        """The latest value the run set under `key` (`tether.set_value`), read without replay.
        If it has none (newer than `after_version`), waits up to `wait` (seconds or a
        timedelta) for the run to set one, and stops waiting when the run ends. Still none:
        `default` if given, else ValueNotFound. RunNotFound for an unknown run, default or not."""
        check_value_key(key)
        limit = _seconds(wait)
        after = _version(after_version)
        await self.open()
        found, run = await _await_value(self.engine, run_id, key, after, limit)
        if found is not None:
            return _decode(self.engine, found)
        if default is not _NO_DEFAULT:
            return default
        raise ValueNotFound(_missing(run_id, key, after, limit, run))

    async def list_values(self, run_id: str) -> list[ValueInfo]:
        """The latest value of each key the run set, by key. RunNotFound for an unknown run."""
        await self.open()
        store = self.engine.store
        if await store.get_run(run_id) is None:
            raise RunNotFound(f"no run has id {run_id!r}; check the id with `tether runs list`")
        return [_info(self.engine, record) for record in await store.list_values(run_id)]

    def watch_value(
        self, run_id: str, key: str, *, after_version: int = 0
    ) -> AsyncGenerator[ValueInfo, None]:
        """The run's value `key` as it changes: its latest version newer than `after_version`
        now (if any), then each newer one seen (the latest wins: a reader may skip versions
        set in quick succession), until the run ends. For progress. RunNotFound (at the first
        iteration) for an unknown run; close it (`contextlib.aclosing`) to stop early."""
        check_value_key(key)
        return self._watch_value(run_id, key, _version(after_version))

    async def _watch_value(
        self, run_id: str, key: str, after: int
    ) -> AsyncGenerator[ValueInfo, None]:
        await self.open()
        while True:
            found, _ = await _await_value(self.engine, run_id, key, after, math.inf)
            if found is None:
                return  # the run ended
            yield _info(self.engine, found)
            after = found.version


async def _await_value(
    engine: Engine, run_id: str, key: str, after: int, limit: float
) -> tuple[ValueRecord | None, RunRecord | None]:
    """(the latest version newer than `after`, None if there is none after waiting up to
    `limit` seconds or once the run ended; the run as last read, None if it was not read)."""
    store = engine.store
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    poll = POLL[0]
    run: RunRecord | None = None
    where = wake_key(key)
    while True:
        waiter = engine.stream_future(run_id, where)  # registered before the read
        try:
            found = await store.get_value(run_id, key)
            if found is not None and found.version > after:
                return found, run
            run = await store.get_run(run_id)
            if run is None:
                raise RunNotFound(f"no run has id {run_id!r}; check the id with `tether runs list`")
            if run.status.terminal:  # one last look: what it set just before it ended
                found = await store.get_value(run_id, key)
                return (found if found is not None and found.version > after else None), run
            left = deadline - loop.time()
            if left <= 0:
                return None, run
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(poll, left)):
                    await waiter
            poll = min(poll * 2, POLL[1])
        finally:
            engine.drop_stream_future(run_id, where, waiter)


def _decode(engine: Engine, record: ValueRecord) -> object:
    return engine.serde.loads(record.value, what=f"value {record.key!r} of run {record.run_id!r}")


def _info(engine: Engine, record: ValueRecord) -> ValueInfo:
    return ValueInfo(record.key, _decode(engine, record), record.version,
                     to_datetime(record.created_at))  # fmt: skip


def _seconds(wait: float | timedelta | None) -> float:
    seconds = wait.total_seconds() if isinstance(wait, timedelta) else wait
    if seconds is None:
        return 0.0
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
        raise ConfigurationError(f"wait= takes seconds >= 0 or a timedelta, not {wait!r}")
    return float(seconds)


def _version(after_version: int) -> int:
    if isinstance(after_version, bool) or not isinstance(after_version, int) or after_version < 0:
        raise ConfigurationError(f"after_version= takes an int >= 0, not {after_version!r}")
    return after_version


def _missing(run_id: str, key: str, after: int, limit: float, run: RunRecord | None) -> str:
    what = f"value {key!r}" + (f" newer than version {after}" if after else "")
    fallback = "pass default= to get a fallback instead of this error"
    status = "?" if run is None else run.status.value
    if run is not None and run.status.terminal:
        return f"run {run_id!r} ended ({status}) without setting {what}; {fallback}"
    if limit > 0:
        return (f"run {run_id!r} did not set {what} within {limit:g}s (it is {status} and goes "
                f"on); wait again, or {fallback}")  # fmt: skip
    return (
        f"run {run_id!r} has not set {what} yet (it is {status}); pass wait= to wait, or {fallback}"
    )

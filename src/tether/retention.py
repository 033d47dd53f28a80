"""Retention: how long finished runs, their checkpoints, stream chunks and audit trails are
kept, the worker service that deletes what is older in small batches with pauses between (and
the one that checkpoints the SQLite WAL), `app.gc()` to do it by hand and
`app.storage_status()` for sizes (docs/retention.md).

It must not import a backend, the server or the CLI.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from tether.clock import to_datetime
from tether.errors import ConfigurationError
from tether.store.port.maintenance import StorageSizes
from tether.store.port.retention import START, Cursor, Purge

if TYPE_CHECKING:
    from tether.core.engine import Engine
    from tether.core.worker import Worker

__all__ = ["GcReport", "Retention", "RetentionMixin", "StorageStatus"]

log = logging.getLogger("tether.retention")

# Pacing: after each batch the deleter pauses PACE times as long as the batch took (at least
# MIN_PAUSE), so it takes at most about half of the database's write time from live runs.
PACE = 1.0
MIN_PAUSE = 0.005
COMPACT_PAGES = 64  # free pages given back to the file system per transaction (SQLite)
WAL_INTERVAL = 10.0  # seconds between the WAL service's checkpoints (SQLite)

PurgeFn = Callable[..., Awaitable[Purge]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    """How long finished things are kept: runs that ended (succeeded, failed, cancelled,
    dead) with their checkpoints, events and values for `runs`; their stream chunks for
    `streams` (None: as long as the runs, at most that); approvals and their audit trail for
    `audit` after their last change, and never before their run is deleted (at least `runs`).
    The worker deletes `batch` rows per transaction and sweeps again every `interval`."""

    runs: timedelta = timedelta(days=30)
    streams: timedelta | None = None
    audit: timedelta = timedelta(days=365)
    batch: int = 500
    interval: timedelta = timedelta(minutes=1)

    def __post_init__(self) -> None:
        for name in ("runs", "streams", "audit", "interval"):
            value = getattr(self, name)
            if value is None and name == "streams":
                continue
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise ConfigurationError(
                    f"Retention({name}={value!r}): give a positive timedelta, e.g. "
                    f"{name}=timedelta(days=30)"
                )
        if self.streams is not None and self.streams > self.runs:
            raise ConfigurationError(
                f"Retention(streams={self.streams}) is longer than runs={self.runs}: a run's "
                f"stream chunks go with it at the latest; give streams <= runs (or None)"
            )
        if self.audit < self.runs:
            raise ConfigurationError(
                f"Retention(audit={self.audit}) is shorter than runs={self.runs}: the audit "
                f"trail is kept longest; give audit >= runs"
            )
        if not isinstance(self.batch, int) or isinstance(self.batch, bool) or self.batch < 1:
            raise ConfigurationError(
                f"Retention(batch={self.batch!r}): give the rows deleted per transaction as an "
                f"int >= 1 (default 500)"
            )

    @property
    def streams_kept(self) -> timedelta:
        """How long stream chunks are kept: `streams`, or `runs` when it is None."""
        return self.streams if self.streams is not None else self.runs

    def to_json(self) -> dict[str, object]:
        """The policy with its durations in seconds."""
        return {"runs": self.runs.total_seconds(), "streams": self.streams_kept.total_seconds(),
                "audit": self.audit.total_seconds(), "batch": self.batch,
                "interval": self.interval.total_seconds()}  # fmt: skip


@dataclass(frozen=True, slots=True)
class GcReport:
    """What a collection deleted, or with `dry_run` would delete: rows per table, the times
    before which things counted as old, how many transactions it took, and the bytes the
    database file gave back (SQLite; None where unknown)."""

    dry_run: bool
    deleted: Mapping[str, int]
    runs_before: datetime
    streams_before: datetime
    audit_before: datetime
    batches: int = 0
    bytes_freed: int | None = None
    vacuumed: bool = False
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.deleted.values())

    def to_json(self) -> dict[str, object]:
        return {
            "dry_run": self.dry_run, "deleted": dict(sorted(self.deleted.items())),
            "total": self.total, "batches": self.batches, "bytes_freed": self.bytes_freed,
            "vacuumed": self.vacuumed, "seconds": round(self.seconds, 3),
            "before": {"runs": self.runs_before.isoformat(),
                       "streams": self.streams_before.isoformat(),
                       "audit": self.audit_before.isoformat()},
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class StorageStatus:
    """The database's sizes (files, tables), its runs by status, and the App's retention
    (None: nothing is deleted unless someone runs `tether gc`)."""

    url: str
    sizes: StorageSizes
    runs: Mapping[str, int]
    retention: Retention | None = None

    def to_json(self) -> dict[str, object]:
        s = self.sizes
        return {
            "database": hide_password(self.url), "backend": s.backend,
            "database_bytes": s.database_bytes, "wal_bytes": s.wal_bytes,
            "free_bytes": s.free_bytes, "auto_vacuum": s.auto_vacuum,
            "tables": [{"name": t.name, "rows": t.rows, "bytes": t.bytes} for t in s.tables],
            "runs": dict(self.runs),
            "retention": None if self.retention is None else self.retention.to_json(),
        }  # fmt: skip


def hide_password(url: str) -> str:
    """The URL with its password, if any, replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


@dataclass(slots=True)
class _Sweep:
    """One collection in progress: the store's purge calls in batches, paced, counted."""

    engine: Engine
    retention: Retention
    dry_run: bool
    pace: bool = True
    deleted: dict[str, int] = field(default_factory=dict)
    batches: int = 0

    async def drain(self, purge: PurgeFn, before: float, after: Cursor = START) -> Cursor:
        """Call `purge` until it has nothing more before `before`; returns the cursor of its
        last batch that had more to do (where a later sweep may start again)."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            done = await purge(before, self.retention.batch, after, dry_run=self.dry_run)
            self.batches += 1
            for table, count in done.rows.items():
                self.deleted[table] = self.deleted.get(table, 0) + count
            took = loop.time() - started
            if done.rows and not self.dry_run:
                # Copy what the batch wrote into the database now, off the event loop: the
                # WAL stays short, so no live commit pays for SQLite's automatic checkpoint.
                await self.engine.store.checkpoint_wal()
            if done.after is None or (done.after == after and not done.rows):
                return after
            after = done.after
            await self.pause(took)

    async def pause(self, took: float) -> None:
        if self.pace:
            await asyncio.sleep(max(MIN_PAUSE, took * PACE))

    async def compact(self) -> int:
        """Give free pages back to the file system, a few at a time; returns the bytes."""
        freed, loop = 0, asyncio.get_running_loop()
        while True:
            started = loop.time()
            step = await self.engine.store.compact(COMPACT_PAGES)
            if step <= 0:
                return freed
            freed += step
            await self.pause(loop.time() - started)


async def collect(
    engine: Engine,
    retention: Retention,
    now: float,
    *,
    dry_run: bool = False,
    vacuum: bool = False,
    pace: bool = True,
    streams_after: Cursor = START,
) -> tuple[GcReport, Cursor]:
    """Delete (or count) what `retention` says is old at `now`: runs with their rows, then
    stream chunks of the runs kept, then approvals with their audit trail, in batches of
    `retention.batch` rows, pausing between them when `pace`; then give free pages back and
    checkpoint the WAL. Returns the report and where the stream phase may start next time."""
    store, loop = engine.store, asyncio.get_running_loop()
    started = loop.time()
    runs_before = now - retention.runs.total_seconds()
    streams_before = now - retention.streams_kept.total_seconds()
    audit_before = now - retention.audit.total_seconds()
    sweep = _Sweep(engine, retention, dry_run, pace)
    await sweep.drain(store.purge_runs, runs_before)
    if streams_before > runs_before:
        streams_after = await sweep.drain(store.purge_streams, streams_before, streams_after)
    await sweep.drain(store.purge_approvals, audit_before)
    freed: int | None = None
    if not dry_run:
        freed = await sweep.compact()
        if vacuum:
            shrunk = await store.vacuum()
            freed = None if shrunk is None else freed + shrunk
        if await store.checkpoint_wal() is None and not vacuum:
            freed = None  # no file of Tether's to measure (PostgreSQL, memory)
    report = GcReport(
        dry_run=dry_run, deleted=sweep.deleted, runs_before=to_datetime(runs_before),
        streams_before=to_datetime(streams_before), audit_before=to_datetime(audit_before),
        batches=sweep.batches, bytes_freed=freed, vacuumed=vacuum and not dry_run,
        seconds=loop.time() - started,
    )  # fmt: skip
    return report, streams_after


def retention_service(retention: Retention) -> Callable[[Worker], Awaitable[None]]:
    """The worker service deleting what `retention` says is old: a sweep, then `interval`."""

    async def service(worker: Worker) -> None:
        engine, streams_after = worker.engine, START
        while not worker.stopped:
            report, streams_after = await collect(
                engine, retention, engine.clock.now(), streams_after=streams_after
            )
            if report.total:
                log.info("retention deleted %d rows in %d batches: %s", report.total,
                         report.batches, dict(report.deleted))  # fmt: skip
            await asyncio.sleep(retention.interval.total_seconds())

    return service


async def wal_service(worker: Worker) -> None:
    """Every WAL_INTERVAL seconds, checkpoint SQLite's write-ahead log off the event loop and
    cut it back once a long reader let go; ends at once on backends without one."""
    while not worker.stopped:
        if await worker.engine.store.checkpoint_wal() is None:
            return
        await asyncio.sleep(WAL_INTERVAL)


def _seconds_of(now: datetime | None, engine: Engine) -> float:
    if now is None:
        return engine.clock.now()
    if not isinstance(now, datetime) or now.tzinfo is None:
        raise ConfigurationError(
            f"now={now!r}: give a timezone-aware datetime, e.g. datetime.now(UTC), or None "
            f"for the App's clock"
        )
    return now.timestamp()


class RetentionMixin:
    """The App's retention methods (App inherits them)."""

    engine: Engine
    url: str
    retention: Retention | None

    if TYPE_CHECKING:

        async def open(self) -> None: ...

    def _init_retention(self, retention: Any) -> None:
        """Called by App.__init__ with its `retention=`: the WAL service always, the deleting
        service only with a Retention (without one nothing is deleted but by `app.gc()`)."""
        if retention is not None and not isinstance(retention, Retention):
            raise ConfigurationError(
                f"retention= takes a tether.Retention, not {retention!r}; e.g. "
                f"tether.Retention(runs=timedelta(days=30))"
            )
        self.retention = retention
        self.engine.services["tether-wal"] = wal_service
        if retention is not None:
            self.engine.services["tether-retention"] = retention_service(retention)

    async def gc(
        self,
        *,
        retention: Retention | None = None,
        dry_run: bool = False,
        vacuum: bool = False,
        now: datetime | None = None,
    ) -> GcReport:
        """Delete now what `retention` (else the App's, else the default Retention(): runs 30
        days, audit 365 days) says is old at `now` (default: the App's clock), in batches
        paced like the worker's; with `dry_run` only count it. `vacuum` then rebuilds the
        database at its smallest (SQLite VACUUM: writers wait meanwhile). Returns the report."""
        if retention is not None and not isinstance(retention, Retention):
            raise ConfigurationError(f"retention= takes a tether.Retention, not {retention!r}")
        policy = retention or self.retention or Retention()
        moment = _seconds_of(now, self.engine)
        await self.open()
        report, _ = await collect(self.engine, policy, moment, dry_run=dry_run, vacuum=vacuum)
        return report

    async def storage_status(self) -> StorageStatus:
        """The database's sizes (file and WAL on SQLite, each table's rows and bytes), its runs
        by status, and the App's retention."""
        await self.open()
        sizes = await self.engine.store.storage_sizes()
        stats = await self.engine.store.stats(self.engine.clock.now())
        runs = {status.value: count for status, count in stats.runs.items()}
        return StorageStatus(self.url, sizes, runs, self.retention)

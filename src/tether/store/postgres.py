"""The PostgreSQL backend of the Store port, on psycopg 3 and psycopg_pool.

Each operation is one transaction on a pooled connection; PostgreSQL is the coordination
substrate for many workers on many machines: claims use FOR UPDATE SKIP LOCKED, writes are
fenced by (owner, epoch), and NOTIFY tells idle workers that something became due. A URL's
`?schema=name` keeps Tether's tables in that schema. SQL lives in sql/postgres/*.sql. This module
must not import tether.core.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg_pool import AsyncConnectionPool

from tether import faults
from tether.errors import (
    ConfigurationError,
    LeaseLost,
    RunNotFound,
    StoreUnavailable,
)
from tether.store.base import (
    Checkpoint,
    EventRef,
    HeartbeatReply,
    Lease,
    NewRun,
    QueueLimits,
    RunRecord,
    RunStatus,
    StoreStats,
    WorkerInfo,
    child_key,
    child_outcome,
)
from tether.store.postgres_approvals import PostgresApprovals, close_approvals
from tether.store.postgres_outbox import PostgresOutbox
from tether.store.postgres_retention import PostgresRetention
from tether.store.postgres_schedules import PostgresSchedules
from tether.store.postgres_streams import PostgresStreams
from tether.store.postgres_users import PostgresUsers
from tether.store.postgres_values import PostgresValues
from tether.store.rows import (
    checkpoint_from_row,
    checkpoint_params,
    load_sql,
    page_params,
    run_from_row,
    worker_from_row,
    worker_params,
)
from tether.store.rules import duplicate_run, queue_budget, store_stats

T = TypeVar("T")
Conn = psycopg.AsyncConnection[Any]

CHANNEL = "tether"  # NOTIFY channel: something became due
_Q, _MIGRATIONS = load_sql("postgres")


def parse_postgres_url(url: str) -> tuple[str, str | None]:
    """(the connection URL without Tether's own options, the schema or None)."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    schema = query.pop("schema", [None])[0]
    if schema is not None and not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", schema):
        raise ConfigurationError(
            f"schema={schema!r} in the database URL: use lower-case letters, digits and _"
        )
    rest = urlencode({k: v[0] for k, v in query.items()})
    scheme = "postgresql" if parts.scheme in ("postgres", "postgresql") else parts.scheme
    return urlunsplit((scheme, parts.netloc, parts.path, rest, "")), schema


async def _lease_lost(conn: Conn, lease: Lease) -> LeaseLost:
    cur = await conn.execute(
        "SELECT owner, epoch, status FROM tether_runs WHERE id = %s", (lease.run_id,)
    )
    row = await cur.fetchone()
    now = "is gone" if row is None else f"is {row[2]}, owner {row[0]!r}, epoch {row[1]}"
    return LeaseLost(
        f"worker {lease.worker_id!r} lost run {lease.run_id!r} (it held epoch {lease.epoch}; "
        f"the run {now}); this worker stops executing it"
    )


async def _deliver_event(conn: Conn, run_id: str, key: str, payload: str, now: float) -> None:
    args = {"run_id": run_id, "key": key, "payload": payload, "now": now}
    await conn.execute(_Q["lock_run"], args)  # serialized with the run's suspend_run
    await conn.execute(_Q["insert_event"], args)
    await conn.execute(_Q["wake_for_event"], args)
    await conn.execute(f"NOTIFY {CHANNEL}")


class PostgresStore(
    PostgresUsers,
    PostgresStreams,
    PostgresApprovals,
    PostgresOutbox,
    PostgresSchedules,
    PostgresValues,
    PostgresRetention,
):
    """Store on a PostgreSQL database; many workers on many machines may share it."""

    def __init__(
        self, url: str, *, min_size: int = 1, max_size: int = 10, listen: bool = True
    ) -> None:
        self.url = url
        self._conninfo, self._schema = parse_postgres_url(url)
        self._sizes = (min_size, max_size)
        self._listens = listen
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._listener: Conn | None = None
        self._listening: asyncio.Task[None] | None = None
        self._changed = False

    async def _configure(self, conn: Conn) -> None:
        if self._schema is not None:
            await conn.execute(f'SET search_path TO "{self._schema}"')
        await conn.commit()

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            async with await psycopg.AsyncConnection.connect(self._conninfo) as conn:
                await self._migrate(conn)
            pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
                self._conninfo, min_size=self._sizes[0], max_size=self._sizes[1],
                configure=self._configure, open=False,
            )  # fmt: skip
            await pool.open(wait=True)
            listener = None
            if self._listens:
                listener = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                await listener.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot open PostgreSQL database {self.url!r}: {exc}") from exc
        self._pool, self._listener = pool, listener
        if listener is not None:
            self._listening = asyncio.create_task(self._listen(listener))

    def another(self) -> PostgresStore:
        return PostgresStore(self.url, min_size=1, max_size=1, listen=False)

    async def _listen(self, conn: Conn | None) -> None:
        # Short rounds: cancelling a task blocked inside notifies() can hang the connection,
        # so close() asks the loop to end instead and waits for the round to finish. A lost
        # connection (server restart, killed backend) is opened again.
        while self._pool is not None:
            try:
                if conn is None or conn.closed:
                    conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self._listener = conn
                    self._changed = True  # notifications may have been missed meanwhile
                async for _ in conn.notifies(timeout=0.2):
                    self._changed = True
            except psycopg.Error:
                conn = None
                await asyncio.sleep(0.1)

    async def _migrate(self, conn: Conn) -> None:
        async with conn.transaction():
            # One migrator at a time, across processes and machines.
            await conn.execute("SELECT pg_advisory_xact_lock(7231)")
            if self._schema is not None:
                await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self._schema}"')
                await conn.execute(f'SET LOCAL search_path TO "{self._schema}"')
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS tether_migrations "
                "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
            )
            cur = await conn.execute("SELECT version FROM tether_migrations")
            done = {r[0] for r in await cur.fetchall()}
            for version, sql in _MIGRATIONS:
                if version not in done:
                    await conn.execute(sql.encode())
                    await conn.execute(
                        "INSERT INTO tether_migrations VALUES (%s, extract(epoch FROM now()))",
                        (version,),
                    )

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if self._listening is not None:
            with contextlib.suppress(Exception):
                await self._listening
        if self._listener is not None:
            await self._listener.close()
        if pool is not None:
            await pool.close()
        self._listener = self._listening = None

    async def _tx(self, fn: Callable[[Conn], Awaitable[T]], *, write: bool, label: str = "") -> T:
        """Run `fn` in one transaction on a pooled connection. A read that meets a broken
        connection (a server restart, a killed backend) is tried again on a fresh one; a write
        is not, since it may have committed: the engine resolves that by reading back."""
        if self._pool is None:
            raise StoreUnavailable(f"the PostgreSQL store {self.url!r} is not open; open() it")
        tries = 1 if write else 3
        for attempt in range(1, tries + 1):
            try:
                async with self._pool.connection() as conn:
                    if write:
                        faults.hit("store.before_write", label)
                    async with conn.transaction():
                        result = await fn(conn)
                        if write:
                            faults.hit("store.before_commit", label)
                    if write:
                        faults.hit("store.after_commit", label)
                    return result
            except psycopg.OperationalError as exc:
                if attempt == tries:
                    raise StoreUnavailable(f"PostgreSQL operation failed: {exc}") from exc
                await asyncio.sleep(0.05 * attempt)
        raise AssertionError("unreachable")

    async def _rows(self, query: str, args: Any) -> list[tuple[Any, ...]]:
        async def op(c: Conn) -> list[tuple[Any, ...]]:
            return await (await c.execute(query, args)).fetchall()

        return await self._tx(op, write=False)

    # -- the port ---------------------------------------------------------------------------

    async def register_worker(self, worker: WorkerInfo, now: float) -> None:
        args = worker_params(worker, now)

        async def op(c: Conn) -> None:
            await c.execute(_Q["upsert_worker"], args)

        await self._tx(op, write=True, label=f"register_worker:{worker.id}")

    async def list_workers(self, host: str | None = None) -> list[WorkerInfo]:
        return [worker_from_row(r) for r in await self._rows(_Q["list_workers"], {"host": host})]

    async def release_worker(self, worker_id: str, now: float) -> list[str]:
        async def op(c: Conn) -> list[str]:
            cur = await c.execute(_Q["release_worker_runs"], {"id": worker_id, "now": now})
            ids = sorted(r[0] for r in await cur.fetchall())
            await c.execute(_Q["delete_worker"], {"id": worker_id})
            if ids:
                await c.execute(f"NOTIFY {CHANNEL}")
            return ids

        return await self._tx(op, write=True, label=f"release_worker:{worker_id}")

    async def heartbeat(
        self, worker_id: str, leases: Sequence[Lease], lease_until: float, now: float
    ) -> HeartbeatReply:
        async def op(c: Conn) -> HeartbeatReply:
            lost, cancel = [], []
            for lease in leases:
                cur = await c.execute(_Q["extend_lease"], {
                    "run_id": lease.run_id, "worker": worker_id, "epoch": lease.epoch,
                    "lease_until": lease_until})  # fmt: skip
                row = await cur.fetchone()
                if row is None:
                    lost.append(lease.run_id)
                elif row[0]:
                    cancel.append(lease.run_id)
            cur = await c.execute(_Q["touch_worker"], {"id": worker_id, "now": now})
            return HeartbeatReply(lost=lost, cancel=cancel, unknown=cur.rowcount == 0)

        return await self._tx(op, write=True, label="heartbeat")

    async def create_run(
        self,
        run: NewRun,
        now: float,
        *,
        owner: str | None = None,
        lease_until: float | None = None,
    ) -> tuple[RunRecord, bool]:
        args = {
            "id": run.id,
            "workflow": run.workflow,
            "args": run.args,
            "now": now,
            "deadline_at": run.deadline_at,
            "parent_id": run.parent_id,
            "owner": owner,
            "status": (RunStatus.RUNNING if owner else RunStatus.PENDING).value,
            "wake_at": None if owner else run.wake_at,  # app.start_at: waiting until then
            "epoch": 1 if owner else 0,
            "lease_expires_at": lease_until if owner else None,
            "queue": run.queue,
            "priority": run.priority,
            "dedup_key": run.dedup_key,
            "started_by": run.started_by,
            # A run created already claimed has started: rate limits count it.
            "started_at": now if owner else None,
        }
        if args["wake_at"] is not None:
            args["status"] = RunStatus.WAITING.value

        async def op(c: Conn) -> tuple[RunRecord, bool]:
            try:
                async with c.transaction():  # a savepoint: the holder is looked up after
                    created = (await c.execute(_Q["insert_run"], args)).rowcount == 1
            except psycopg.errors.UniqueViolation:
                holder = await (await c.execute(_Q["dedup_holder"], args)).fetchone()
                raise duplicate_run(
                    run.queue, run.dedup_key, holder[0] if holder else "?"
                ) from None
            if created and owner is None:
                await c.execute(f"NOTIFY {CHANNEL}")
            row = await (await c.execute(_Q["get_run"], {"id": run.id})).fetchone()
            assert row is not None
            return run_from_row(row), created

        return await self._tx(op, write=True, label=f"create_run:{run.id}")

    async def get_run(self, run_id: str) -> RunRecord | None:
        rows = await self._rows(_Q["get_run"], {"id": run_id})
        return run_from_row(rows[0]) if rows else None

    async def list_runs(
        self,
        *,
        statuses: Sequence[RunStatus] = (),
        workflow: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        args = {"any_status": not statuses, "statuses": [str(s) for s in statuses],
                "workflow": workflow, "limit": max(0, limit), **page_params(before)}  # fmt: skip
        return [run_from_row(r) for r in await self._rows(_Q["list_runs"], args)]

    async def claim_runs(
        self,
        worker_id: str,
        workflows: Sequence[str],
        now: float,
        lease_until: float,
        limit: int,
        queues: Mapping[str, QueueLimits] | None = None,
    ) -> list[RunRecord]:
        limited = dict(queues or {})
        base = {"worker": worker_id, "workflows": list(workflows), "now": now,
                "lease_until": lease_until}  # fmt: skip

        async def op(c: Conn) -> list[RunRecord]:
            rows: list[Any] = []
            room = limit
            for name in sorted(limited):  # a fixed order: no deadlock between claimers
                limits = limited[name]
                # Claims of one queue are serialized, so its limits hold across workers.
                await c.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"tether:{name}",))
                load = {**base, "queue": name, "since": now - limits.period}
                counts = await (await c.execute(_Q["queue_load"], load)).fetchone()
                assert counts is not None
                budget = queue_budget(limits, counts[0], counts[1], counts[2], room)
                if budget:
                    cur = await c.execute(_Q["claim_queue"], {**load, "limit": budget})
                    rows += await cur.fetchall()
                    room = limit - len(rows)
            if room > 0:
                args = {**base, "limited": list(limited), "limit": room}
                rows += await (await c.execute(_Q["claim_runs"], args)).fetchall()
            return sorted(
                (run_from_row(r) for r in rows), key=lambda r: (-r.priority, r.created_at, r.id)
            )

        return await self._tx(op, write=True, label="claim_runs")

    async def next_wake_at(self, workflows: Sequence[str]) -> float | None:
        rows = await self._rows(_Q["next_wake_at"], {"workflows": list(workflows)})
        return None if rows[0][0] is None else float(rows[0][0])

    async def load_history(self, run_id: str) -> list[Checkpoint]:
        return [
            checkpoint_from_row(r) for r in await self._rows(_Q["load_history"], {"run_id": run_id})
        ]

    async def write_checkpoint(self, lease: Lease, checkpoint: Checkpoint, now: float) -> None:
        args = _checkpoint_args(lease, checkpoint, checkpoint.result)

        async def op(c: Conn) -> None:
            if (await c.execute(_Q["upsert_checkpoint"], args)).rowcount != 1:
                raise await _lease_lost(c, lease)

        label = f"write_checkpoint:{checkpoint.name}:{checkpoint.status.value}"
        await self._tx(op, write=True, label=label)

    async def suspend_run(
        self, lease: Lease, wake_at: float | None, now: float, wake_on: Sequence[str] = ()
    ) -> None:
        # Locked first, so an event delivered meanwhile is seen by the UPDATE (see lock_run).
        op = self._fenced(
            lease, "suspend_run", lock=True, wake_at=wake_at, now=now,
            wake_on=json.dumps(list(wake_on)), wake_on_keys=list(wake_on),
        )  # fmt: skip
        await self._tx(op, write=True, label=f"suspend_run:{lease.run_id}")

    def _fenced(
        self, lease: Lease, query: str, *, lock: bool = False, **extra: Any
    ) -> Callable[[Conn], Awaitable[None]]:
        """The update `query` under `lease` (LeaseLost when it is not held), then a wake-up
        for waiting workers; with `lock`, the run's row is locked first."""
        args = {"run_id": lease.run_id, "worker": lease.worker_id, "epoch": lease.epoch, **extra}

        async def op(c: Conn) -> None:
            if lock:
                await c.execute(_Q["lock_run"], args)
            if (await c.execute(_Q[query], args)).rowcount != 1:
                raise await _lease_lost(c, lease)
            await c.execute(f"NOTIFY {CHANNEL}")

        return op

    async def finish_run(
        self,
        lease: Lease,
        status: RunStatus,
        result: str | None,
        error: str | None,
        now: float,
    ) -> None:
        if not RunStatus(status).terminal:
            raise ValueError(f"finish_run needs a terminal status, not {status!r}")
        op = self._finish(lease, RunStatus(status), result, error, None, now)
        await self._tx(op, write=True, label=f"finish_run:{lease.run_id}")

    def _finish(
        self,
        lease: Lease,
        status: RunStatus,
        result: str | None,
        error: str | None,
        failures: int | None,
        now: float,
    ) -> Callable[[Conn], Awaitable[None]]:
        args = {"run_id": lease.run_id, "worker": lease.worker_id, "epoch": lease.epoch,
                "status": str(status), "result": result, "error": error, "now": now,
                "failures": failures}  # fmt: skip

        async def op(c: Conn) -> None:
            row = await (await c.execute(_Q["finish_run"], args)).fetchone()
            if row is None:
                raise await _lease_lost(c, lease)
            await c.execute(f"NOTIFY {CHANNEL}")  # a queue's budget may have freed up
            await _ended(c, lease.run_id, row[0], status, result, error, now)

        return op

    async def fail_execution(
        self, lease: Lease, error: str, failures: int, retry_at: float | None, now: float
    ) -> None:
        label = f"fail_execution:{lease.run_id}"
        if retry_at is None:
            await self._tx(self._finish(lease, RunStatus.DEAD, None, error, failures, now),
                           write=True, label=label)  # fmt: skip
            return
        op = self._fenced(
            lease, "fail_execution", error=error, failures=failures, retry_at=retry_at, now=now
        )
        await self._tx(op, write=True, label=label)

    async def hold_run(
        self, lease: Lease, error: str, failures: int, wake_at: float, now: float
    ) -> None:
        op = self._fenced(
            lease, "hold_run", error=error, failures=failures, wake_at=wake_at, now=now
        )
        await self._tx(op, write=True, label=f"hold_run:{lease.run_id}")

    async def wake_held(self, workflows: Sequence[str], now: float) -> int:
        async def op(c: Conn) -> int:
            woken = (await c.execute(_Q["wake_held"], {"workflows": list(workflows),
                                                       "now": now})).rowcount  # fmt: skip
            if woken:
                await c.execute(f"NOTIFY {CHANNEL}")
            return woken

        return await self._tx(op, write=True, label="wake_held")

    async def database_time(self) -> float | None:
        return float((await self._rows(_Q["database_time"], {}))[0][0])

    async def dead_letter_unserved(
        self, since: float, error: Callable[[str, str], str], now: float
    ) -> list[str]:
        async def op(c: Conn) -> list[str]:
            live = [r[0] for r in await (await c.execute(_Q["live_workflows"],
                                                         {"since": since})).fetchall()]  # fmt: skip
            if any(names is None for names in live):
                return []  # an older worker: what it serves is unknown
            served = sorted({name for names in live for name in json.loads(names)})
            cur = await c.execute(_Q["unserved_runs"], {"since": since, "served": served})
            buried = []
            for run_id, workflow, parent_id in await cur.fetchall():
                text = error(run_id, workflow)
                await c.execute(_Q["bury_run"], {"id": run_id, "error": text, "now": now})
                await _ended(c, run_id, parent_id, RunStatus.DEAD, None, text, now)
                buried.append(run_id)
            return buried

        return await self._tx(op, write=True, label="dead_letter_unserved")

    async def resume_run(
        self, run_id: str, now: float, deadline_at: float | None, retry: str | None = None
    ) -> RunRecord:
        args = {"id": run_id, "now": now, "deadline_at": deadline_at, "retry": retry}

        async def op(c: Conn) -> RunRecord:
            try:
                async with c.transaction():  # a savepoint: the holder is looked up after
                    resumed = (await c.execute(_Q["resume_run"], args)).rowcount == 1
            except psycopg.errors.UniqueViolation:  # an unfinished run holds its dedup key
                row = await (await c.execute(_Q["get_run"], args)).fetchone()
                assert row is not None  # the update matched it
                run = run_from_row(row)
                where = {"queue": run.queue, "dedup_key": run.dedup_key}
                holder = await (await c.execute(_Q["dedup_holder"], where)).fetchone()
                raise duplicate_run(
                    run.queue, run.dedup_key, holder[0] if holder else "?"
                ) from None
            if resumed:
                await c.execute(_Q["resume_checkpoints"], args)
            row = await (await c.execute(_Q["get_run"], args)).fetchone()
            if row is None:
                raise RunNotFound(f"no run has id {run_id!r}; check the id or list runs")
            return run_from_row(row)

        return await self._tx(op, write=True, label=f"resume_run:{run_id}")

    async def cancel_run(self, run_id: str, error: str, now: float) -> RunRecord:
        async def op(c: Conn) -> RunRecord:
            todo = [run_id]
            while todo:  # the run, then its unfinished descendants
                current = todo.pop()
                # Locked first: a suspension committing meanwhile is seen (not a cancel of a
                # row that was running in this statement's snapshot and waiting by its end).
                locked = await c.execute(_Q["lock_run_status"], {"id": current})
                if await locked.fetchone() is None and current == run_id:
                    raise RunNotFound(
                        f"no run has id {run_id!r}; check the id with `tether runs list`"
                    )
                args = {"id": current, "error": error, "now": now}
                row = await (await c.execute(_Q["cancel_unowned"], args)).fetchone()
                if row is None:
                    await c.execute(_Q["cancel_owned"], args)
                else:
                    await close_approvals(c, current, RunStatus.CANCELLED, now)
                    if row[0] is not None:
                        outcome = child_outcome(RunStatus.CANCELLED, None, error)
                        await _deliver_event(c, row[0], child_key(current), outcome, now)
                cur = await c.execute(_Q["children"], {"id": current})
                todo += [r[0] for r in await cur.fetchall()]
            row = await (await c.execute(_Q["get_run"], {"id": run_id})).fetchone()
            assert row is not None
            return run_from_row(row)

        return await self._tx(op, write=True, label=f"cancel_run:{run_id}")

    async def deliver_event(self, run_id: str, key: str, payload: str, now: float) -> RunRecord:
        async def op(c: Conn) -> RunRecord:
            row = await (await c.execute(_Q["get_run"], {"id": run_id})).fetchone()
            if row is None:
                raise RunNotFound(f"no run has id {run_id!r}; check the id with `tether runs list`")
            record = run_from_row(row)
            if not record.status.terminal:
                await _deliver_event(c, run_id, key, payload, now)
            return record

        return await self._tx(op, write=True, label=f"deliver_event:{key}")

    async def take_event(
        self, lease: Lease, keys: Sequence[str], checkpoint: Checkpoint, now: float
    ) -> str | None:
        fence = {"run_id": lease.run_id, "worker": lease.worker_id, "epoch": lease.epoch}
        query = {"run_id": lease.run_id, "keys": list(keys)}
        if not await self._rows(_Q["oldest_event"], query):
            return None  # a look at an empty mailbox is a read

        async def op(c: Conn) -> str | None:
            if await (await c.execute(_Q["lease_held"], fence)).fetchone() is None:
                raise await _lease_lost(c, lease)
            row = await (await c.execute(_Q["oldest_event"], query)).fetchone()
            if row is None:
                return None
            event_id, key, payload = row
            await c.execute(_Q["consume_event"], {"id": event_id, "by": checkpoint.name,
                                                  "now": now})  # fmt: skip
            result = f'{{"key":{json.dumps(key)},"value":{payload}}}'
            await c.execute(_Q["upsert_checkpoint"], _checkpoint_args(lease, checkpoint, result))
            return result

        return await self._tx(op, write=True, label=f"take_event:{checkpoint.name}")

    async def events_after(self, event_id: int, limit: int = 1000) -> list[EventRef]:
        rows = await self._rows(_Q["events_after"], {"after": event_id, "limit": limit})
        return [EventRef(*r) for r in rows]

    async def last_event_id(self) -> int:
        return int((await self._rows(_Q["last_event_id"], {}))[0][0])

    async def poll_changes(self) -> bool:
        changed, self._changed = self._changed, False
        return changed

    async def stats(self) -> StoreStats:
        rows = await self._rows(_Q["store_stats"], {})  # one statement: one snapshot
        by_status = {status: n for status, n, _ in rows if status is not None}
        ((pending, oldest),) = [(n, at) for status, n, at in rows if status is None]
        return store_stats(by_status, pending, oldest)

    # -- what the approval operations (PostgresApprovals) call -------------------------------

    async def _lost(self, conn: Conn, lease: Lease) -> LeaseLost:
        return await _lease_lost(conn, lease)

    async def _deliver(self, conn: Conn, run_id: str, key: str, payload: str, now: float) -> None:
        await _deliver_event(conn, run_id, key, payload, now)


async def _ended(
    conn: Conn,
    run_id: str,
    parent_id: str | None,
    status: RunStatus,
    result: str | None,
    error: str | None,
    now: float,
) -> None:
    """What ending a run does beside its row, in its transaction: its pending approvals are
    cancelled, and its parent is told."""
    await close_approvals(conn, run_id, status, now)
    if parent_id is not None:
        outcome = child_outcome(status, result, error)
        await _deliver_event(conn, parent_id, child_key(run_id), outcome, now)


def _checkpoint_args(lease: Lease, cp: Checkpoint, result: str | None) -> dict[str, Any]:
    return checkpoint_params(lease.run_id, cp, result, lease.worker_id, lease.epoch)

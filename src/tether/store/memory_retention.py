"""Retention in memory: deleting what ended long ago, batch by batch as the SQL backends do
(whole runs here: nothing in memory is slow to delete), and the rows each table holds. There is
no file to compact and no log to checkpoint. Each operation runs whole under the store's lock.

It must not import tether.core.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from tether.store.approval_rows import PENDING, ApprovalRecord, AuditEntry
from tether.store.base import Checkpoint, RunRecord, WorkerInfo
from tether.store.outbox_rows import OutboxMessage
from tether.store.retention_rows import (
    OUTBOX_DONE,
    START,
    Cursor,
    Purge,
    StorageSizes,
    TableSize,
    WalState,
    add_rows,
)
from tether.store.stream_rows import StreamEntry
from tether.store.user_rows import UserRecord
from tether.store.value_rows import ForkRecord, ValueRecord

_GONE = ""  # the run id of an event deleted by retention (event ids stay positions)


class MemoryRetention:
    """Mixed into MemoryStore."""

    _lock: threading.Lock
    _runs: dict[str, RunRecord]
    _history: dict[str, dict[int, Checkpoint]]
    _events: list[list[object]]  # [id, run id, key, payload, consumed_by] in arrival order
    _approvals: dict[str, ApprovalRecord]
    _audit: dict[str, list[AuditEntry]]
    _streams: dict[tuple[str, str], list[StreamEntry]]
    _stream_refs: dict[tuple[str, str], dict[str, int]]
    _values: dict[tuple[str, str], list[ValueRecord]]
    _forks: dict[str, ForkRecord]
    _outbox: dict[str, OutboxMessage]  # by id
    _workers: dict[str, WorkerInfo]
    _users: dict[str, UserRecord]

    def _init_retention(self) -> None:
        """Set up this mixin's state (called by MemoryStore.__init__): none."""

    def _ended(self, before: float, after: Cursor) -> Iterator[RunRecord]:
        """Runs that ended before `before`, oldest first from after the cursor."""
        ended = [r for r in self._runs.values() if r.status.terminal
                 and r.finished_at is not None and r.finished_at < before
                 and (r.finished_at, r.id) > after]  # fmt: skip
        return iter(sorted(ended, key=lambda r: (r.finished_at or 0.0, r.id)))

    def _kept(self, run: RunRecord) -> bool:
        """A run retention must keep although it ended long ago: its parent or a child is
        unfinished, or it has outbox messages not delivered nor failed."""
        parent = self._runs.get(run.parent_id) if run.parent_id is not None else None
        if parent is not None and not parent.status.terminal:
            return True
        if any(m.run_id == run.id and m.status not in OUTBOX_DONE for m in self._outbox.values()):
            return True
        return any(r.parent_id == run.id and not r.status.terminal for r in self._runs.values())

    def _stream_keys(self, run_id: str) -> list[tuple[str, str]]:
        return [k for k in self._streams if k[0] == run_id]

    def _run_rows(self, run_id: str) -> dict[str, int]:
        rows: dict[str, int] = {}
        add_rows(rows, "tether_checkpoints", len(self._history.get(run_id, {})))
        add_rows(rows, "tether_events", sum(1 for e in self._events if e[1] == run_id))
        entries = sum(len(self._streams[k]) for k in self._stream_keys(run_id))
        add_rows(rows, "tether_stream_entries", entries)
        values = sum(len(v) for k, v in self._values.items() if k[0] == run_id)
        add_rows(rows, "tether_values", values)
        add_rows(rows, "tether_forks", 1 if run_id in self._forks else 0)
        add_rows(rows, "tether_outbox", len(self._done_messages(run_id)))
        add_rows(rows, "tether_runs", 1)
        return rows

    def _delete_run(self, run_id: str) -> None:
        self._history.pop(run_id, None)
        for event in self._events:
            if event[1] == run_id:
                event[1:] = [_GONE, "", "null", "retention"]
        self._delete_streams(run_id)
        for key in [k for k in self._values if k[0] == run_id]:
            del self._values[key]
        self._forks.pop(run_id, None)
        for message_id in self._done_messages(run_id):
            del self._outbox[message_id]
        del self._runs[run_id]

    def _done_messages(self, run_id: str) -> list[str]:
        return [m.id for m in self._outbox.values() if m.run_id == run_id
                and m.status in OUTBOX_DONE]  # fmt: skip

    def _delete_streams(self, run_id: str) -> None:
        for key in self._stream_keys(run_id):
            del self._streams[key]
            self._stream_refs.pop(key, None)

    async def purge_runs(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        limit = max(1, int(limit))
        with self._lock:
            counts: dict[str, int] = {}
            cursor = after
            for run in self._ended(before, after):
                if self._kept(run):
                    continue
                if sum(counts.values()) >= limit:
                    return Purge(counts, cursor)
                for table, n in self._run_rows(run.id).items():
                    add_rows(counts, table, n)
                if not dry_run:
                    self._delete_run(run.id)
                cursor = (run.finished_at or 0.0, run.id)
            return Purge(counts, None)

    async def purge_streams(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        limit = max(1, int(limit))
        with self._lock:
            counts: dict[str, int] = {}
            cursor = after
            for run in self._ended(before, after):
                entries = sum(len(self._streams[k]) for k in self._stream_keys(run.id))
                if entries and sum(counts.values()) >= limit:
                    return Purge(counts, cursor)
                add_rows(counts, "tether_stream_entries", entries)
                if not dry_run:
                    self._delete_streams(run.id)
                cursor = (run.finished_at or 0.0, run.id)
            return Purge(counts, None)

    async def purge_approvals(
        self, before: float, limit: int, after: Cursor = START, *, dry_run: bool = False
    ) -> Purge:
        limit = max(1, int(limit))
        with self._lock:
            found = sorted(
                (a for a in self._approvals.values() if a.status != PENDING
                 and a.updated_at < before and (a.updated_at, a.id) > after
                 and a.run_id not in self._runs),
                key=lambda a: (a.updated_at, a.id),
            )  # fmt: skip
            counts: dict[str, int] = {}
            cursor = after
            for approval in found:
                if sum(counts.values()) >= limit:
                    return Purge(counts, cursor)
                add_rows(counts, "tether_approval_audit", len(self._audit.get(approval.id, [])))
                add_rows(counts, "tether_approvals", 1)
                if not dry_run:
                    self._audit.pop(approval.id, None)
                    del self._approvals[approval.id]
                cursor = (approval.updated_at, approval.id)
            return Purge(counts, None)

    async def compact(self, max_pages: int) -> int:
        return 0  # nothing to give back: the memory went with the rows

    async def vacuum(self) -> int | None:
        return None

    async def checkpoint_wal(self) -> WalState | None:
        return None  # no log

    async def storage_sizes(self) -> StorageSizes:
        with self._lock:
            rows = {
                "tether_runs": len(self._runs),
                "tether_checkpoints": sum(len(h) for h in self._history.values()),
                "tether_events": sum(1 for e in self._events if e[1] != _GONE),
                "tether_stream_entries": sum(len(s) for s in self._streams.values()),
                "tether_approvals": len(self._approvals),
                "tether_approval_audit": sum(len(a) for a in self._audit.values()),
                "tether_workers": len(self._workers),
                "tether_users": len(self._users),
                "tether_values": sum(len(v) for v in self._values.values()),
                "tether_forks": len(self._forks),
                "tether_outbox": len(self._outbox),
            }
        tables = tuple(TableSize(name, n) for name, n in sorted(rows.items()))
        return StorageSizes(backend="memory", tables=tables)

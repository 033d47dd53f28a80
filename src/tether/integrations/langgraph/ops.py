"""LangGraph's checkpointer operations on TetherSaver's tables, each written once.

Every function here is one operation of `BaseCheckpointSaver` as a generator of queries
(`tether.store.query`): it encodes values with the saver's serde, yields the statements to run, and
decodes what comes back. None touches a connection, so SQLite and PostgreSQL, sync and async
callers share the code. The storage layout it assumes:

- `tether_lg_checkpoints`: one row per checkpoint: the checkpoint without its channel values
  (channel_versions, versions_seen, ...) encoded by the serde, and its metadata as JSON, which
  `list` filters on;
- `tether_lg_blobs`: one row per (thread, namespace, channel, version): a channel's value is
  written when its version changes, and a checkpoint is reassembled from the blobs of its
  channel_versions (small scalars, cheaper to repeat than to look up, stay in the row);
- `tether_lg_writes`: the pending writes of each checkpoint's tasks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from tether.store.query import Op, Row, execute, execute_many, select

STRATEGIES = ("keep_latest", "delete")
INLINE_TEXT = 64  # longer strings are stored as blobs, written once per version


def _dumps(value: Any) -> str:
    return json.dumps(value)


def _json(value: Any) -> Any:
    """A JSON column's value: SQLite returns text, psycopg has already decoded JSONB."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def _config(thread_id: Any, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


class _Stored(NamedTuple):
    """A checkpoint row, its JSON decoded."""

    thread_id: str
    ns: str
    id: str
    parent: str | None
    checkpoint: dict[str, Any]
    metadata: dict[str, Any]

    @classmethod
    def of(cls, serde: SerializerProtocol, row: Row) -> _Stored:
        checkpoint = serde.loads_typed((row[4], bytes(row[5])))
        return cls(row[0], row[1], row[2], row[3], checkpoint, _json(row[6]))

    def versions(self) -> dict[str, str]:
        """Its channel versions as stored in the blobs' key (text)."""
        return {ch: str(v) for ch, v in self.checkpoint["channel_versions"].items()}


# -- writing ----------------------------------------------------------------------------------


def put(
    serde: SerializerProtocol,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
) -> Op[RunnableConfig]:
    """Store a checkpoint: a blob for each channel whose version is new (small scalars ride
    in the checkpoint's row instead), then the row."""
    configurable = config["configurable"]
    thread_id, ns = str(configurable["thread_id"]), configurable.get("checkpoint_ns", "")
    values = checkpoint["channel_values"]
    inline = {k: v for k, v in values.items() if _small(v)}
    blobs = []
    for channel, version in new_versions.items():
        # A channel emptied at this version has no value to store.
        if channel in values and channel not in inline:
            type_, blob = serde.dumps_typed(values[channel])
            blobs.append({"thread_id": thread_id, "checkpoint_ns": ns, "channel": channel,
                          "version": str(version), "type": type_, "blob": blob})  # fmt: skip
    type_, rest = serde.dumps_typed({**checkpoint, "channel_values": inline})
    row = {
        "thread_id": thread_id,
        "checkpoint_ns": ns,
        "checkpoint_id": checkpoint["id"],
        "parent_checkpoint_id": configurable.get("checkpoint_id"),
        "checkpoint_type": type_,
        "checkpoint": rest,
        "metadata": _dumps(get_serializable_checkpoint_metadata(config, metadata)),
    }
    yield from execute_many("insert_blob", blobs)
    yield from execute("upsert_checkpoint", **row)
    return _config(configurable["thread_id"], ns, checkpoint["id"])


def _small(value: Any) -> bool:
    """Values cheaper to repeat in every checkpoint row than to store as a blob row: None,
    booleans, numbers, short strings (as LangGraph's Postgres saver inlines primitives)."""
    return (
        value is None
        or isinstance(value, bool | int | float)
        or (isinstance(value, str) and len(value) <= INLINE_TEXT)
    )


def put_writes(
    serde: SerializerProtocol,
    config: RunnableConfig,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
) -> Op[None]:
    """Store a task's writes against the checkpoint it ran from."""
    configurable = config["configurable"]
    key = {
        "thread_id": str(configurable["thread_id"]),
        "checkpoint_ns": configurable.get("checkpoint_ns", ""),
        "checkpoint_id": configurable["checkpoint_id"],
        "task_id": task_id,
        "task_path": task_path,
    }
    rows = []
    for idx, (channel, value) in enumerate(writes):
        type_, blob = serde.dumps_typed(value)
        rows.append({**key, "idx": WRITES_IDX_MAP.get(channel, idx), "channel": channel,
                     "type": type_, "blob": blob})  # fmt: skip
    yield from execute_many("put_write", rows)


def delete_thread(thread_id: str) -> Op[None]:
    for table in ("checkpoints", "blobs", "writes"):
        yield from execute(f"delete_thread_{table}", thread_id=str(thread_id))


def copy_thread(source: str, target: str) -> Op[None]:
    for table in ("checkpoints", "blobs", "writes"):
        yield from execute(f"copy_thread_{table}", source=str(source), target=str(target))


def prune(serde: SerializerProtocol, thread_ids: Sequence[str], strategy: str) -> Op[None]:
    """`keep_latest`: keep the latest checkpoint of each namespace (with the ancestors its
    delta channels are rebuilt from) and the blobs and writes they use; `delete`: keep nothing."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown prune strategy {strategy!r}: use one of {STRATEGIES}")
    for thread_id in dict.fromkeys(map(str, thread_ids)):
        if strategy == "delete":
            yield from delete_thread(thread_id)
            continue
        stored = yield from _thread_checkpoints(serde, thread_id)
        blob_keys = {
            (r[0], r[1], r[2]) for r in (yield from select("blob_keys", thread_id=thread_id))
        }
        keep = _latest_with_delta_chain(stored, blob_keys)
        yield from _drop(thread_id, stored, keep, blob_keys)


def delete_for_runs(serde: SerializerProtocol, run_ids: Sequence[str]) -> Op[None]:
    """Delete the checkpoints made by these runs, their writes, and the blobs no checkpoint
    left uses."""
    if not run_ids:
        return
    rows = yield from select("checkpoints_of_runs", run_ids=_dumps([str(r) for r in run_ids]))
    keys = [list(row) for row in rows]
    if not keys:
        return
    yield from execute("delete_checkpoints", keys=_dumps(keys))
    yield from execute("delete_writes", keys=_dumps(keys))
    for thread_id in sorted({key[0] for key in keys}):
        stored = yield from _thread_checkpoints(serde, thread_id)
        blob_keys = {
            (r[0], r[1], r[2]) for r in (yield from select("blob_keys", thread_id=thread_id))
        }
        yield from _drop(thread_id, stored, set(stored), blob_keys)


def _thread_checkpoints(
    serde: SerializerProtocol, thread_id: str
) -> Op[dict[tuple[str, str], _Stored]]:
    rows = yield from select("list_checkpoints", ("where_thread",), thread_id=thread_id, limit=None)
    return {(s.ns, s.id): s for s in (_Stored.of(serde, row) for row in rows)}


def _latest_with_delta_chain(
    stored: dict[tuple[str, str], _Stored], blob_keys: set[tuple[str, str, str]]
) -> set[tuple[str, str]]:
    """The latest checkpoint of each namespace, and, for its delta channels not snapshotted
    since (LangGraph's `counters_since_delta_snapshot`), every ancestor up to and including
    the nearest one holding a stored value for each: the chain those channels replay."""
    latest: dict[str, str] = {}
    for ns, cid in stored:
        latest[ns] = max(latest.get(ns, cid), cid)
    keep = {(ns, cid) for ns, cid in latest.items()}
    for ns, cid in latest.items():
        pending = set(stored[(ns, cid)].metadata.get("counters_since_delta_snapshot") or ())
        parent = stored[(ns, cid)].parent
        while pending and parent is not None and (ns, parent) in stored:
            ancestor = stored[(ns, parent)]
            keep.add((ns, parent))
            versions = ancestor.versions()
            pending = {ch for ch in pending if (ns, ch, versions.get(ch, "")) not in blob_keys}
            parent = ancestor.parent
    return keep


def _drop(
    thread_id: str,
    stored: dict[tuple[str, str], _Stored],
    keep: set[tuple[str, str]],
    blob_keys: set[tuple[str, str, str]],
) -> Op[None]:
    """Delete a thread's checkpoints outside `keep` with their writes, and the blobs that no
    kept checkpoint uses."""
    gone = [[thread_id, ns, cid] for ns, cid in stored if (ns, cid) not in keep]
    if gone:
        yield from execute("delete_checkpoints", keys=_dumps(gone))
        yield from execute("delete_writes", keys=_dumps(gone))
    used = {(ns, ch, v) for ns, cid in keep for ch, v in stored[(ns, cid)].versions().items()}
    unused = [[thread_id, *key] for key in sorted(blob_keys - used)]
    if unused:
        yield from execute("delete_blobs", keys=_dumps(unused))


# -- reading ----------------------------------------------------------------------------------


def get_tuple(serde: SerializerProtocol, config: RunnableConfig) -> Op[CheckpointTuple | None]:
    """The checkpoint named by the config, or the thread's latest in its namespace."""
    configurable = config["configurable"]
    checkpoint_id = get_checkpoint_id(config)
    where = ("where_thread", "where_namespace") + (("where_checkpoint",) if checkpoint_id else ())
    rows = yield from select(
        "list_checkpoints", where, thread_id=str(configurable["thread_id"]),
        checkpoint_ns=configurable.get("checkpoint_ns", ""), checkpoint_id=checkpoint_id, limit=1,
    )  # fmt: skip
    if not rows:
        return None
    return (yield from _load(serde, [_Stored.of(serde, rows[0])]))[0]


def list_checkpoints(
    serde: SerializerProtocol,
    config: RunnableConfig | None,
    filter: dict[str, Any] | None,
    before: RunnableConfig | None,
    limit: int | None,
) -> Op[list[CheckpointTuple]]:
    """Checkpoints matching the config (thread, namespace, id), the metadata filter (every key
    equal) and `before`, newest first."""
    where: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    if config is not None:
        configurable = config["configurable"]
        if configurable.get("thread_id") is not None:
            where.append("where_thread")
            params["thread_id"] = str(configurable["thread_id"])
        if configurable.get("checkpoint_ns") is not None:
            where.append("where_namespace")
            params["checkpoint_ns"] = configurable["checkpoint_ns"]
        if checkpoint_id := get_checkpoint_id(config):
            where.append("where_checkpoint")
            params["checkpoint_id"] = checkpoint_id
    if before is not None and (before_id := get_checkpoint_id(before)):
        where.append("where_before")
        params["before"] = before_id
    in_sql, in_python = _split_filter(filter or {})
    if in_sql:
        where.append("where_metadata")
        params["filter"] = _dumps(in_sql)
    if in_python:  # filtered here, so the database cannot apply the limit
        params["limit"] = None
    rows = yield from select("list_checkpoints", tuple(where), **params)
    if in_python:
        rows = [r for r in rows if all(_json(r[6]).get(k) == v for k, v in in_python.items())]
        rows = rows[:limit] if limit is not None else rows
    return (yield from _load(serde, [_Stored.of(serde, row) for row in rows]))


def _split_filter(filter: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(entries the database compares: keys without quotes, finite numbers and strings;
    the others, compared in Python with ==)."""

    def in_sql(key: Any, value: Any) -> bool:
        if not isinstance(key, str) or '"' in key or "\\" in key:
            return False
        if isinstance(value, bool):  # JSON true is 1 in SQLite, not in PostgreSQL
            return False
        return isinstance(value, str) or (isinstance(value, int | float) and math.isfinite(value))

    sql = {k: v for k, v in filter.items() if in_sql(k, v)}
    return sql, {k: v for k, v in filter.items() if k not in sql}


def _load(serde: SerializerProtocol, stored: Sequence[_Stored]) -> Op[list[CheckpointTuple]]:
    """Reassemble checkpoints: their channel values from the blobs of their versions, their
    pending writes in LangGraph's order. Two queries, whatever the number of checkpoints."""
    if not stored:
        return []
    wanted = {
        (s.thread_id, s.ns, ch, v)
        for s in stored
        for ch, v in s.versions().items()
        if ch not in s.checkpoint["channel_values"]
    }
    blobs: dict[tuple[str, str, str, str], tuple[str, bytes]] = {}
    if wanted:
        rows = yield from select("blobs_of", keys=_dumps(sorted(wanted)))
        blobs = {(r[0], r[1], r[2], r[3]): (r[4], bytes(r[5] or b"")) for r in rows}
    rows = yield from select("writes_of", keys=_dumps([[s.thread_id, s.ns, s.id] for s in stored]))
    writes: dict[tuple[str, str, str], list[PendingWrite]] = {}
    for thread_id, ns, cid, task_id, channel, type_, blob in rows:
        value = serde.loads_typed((type_, bytes(blob or b"")))
        writes.setdefault((thread_id, ns, cid), []).append((task_id, channel, value))
    return [_tuple(serde, s, blobs, writes.get((s.thread_id, s.ns, s.id), [])) for s in stored]


def _tuple(
    serde: SerializerProtocol,
    s: _Stored,
    blobs: dict[tuple[str, str, str, str], tuple[str, bytes]],
    writes: list[PendingWrite],
) -> CheckpointTuple:
    values = dict(s.checkpoint["channel_values"])  # the small values, inline
    for channel, version in s.versions().items():
        blob = blobs.get((s.thread_id, s.ns, channel, version))
        if blob is not None:  # decoded per checkpoint: tuples never share mutable values
            values[channel] = serde.loads_typed(blob)
    checkpoint: Checkpoint = {**s.checkpoint, "channel_values": values}  # type: ignore[typeddict-item]
    return CheckpointTuple(
        config=_config(s.thread_id, s.ns, s.id),
        checkpoint=checkpoint,
        metadata=s.metadata,  # type: ignore[arg-type]
        parent_config=_config(s.thread_id, s.ns, s.parent) if s.parent else None,
        pending_writes=writes,
    )

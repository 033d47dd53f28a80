"""TetherSaver: a LangGraph checkpointer stored in Tether's database.

`TetherSaver(app)` keeps a graph's checkpoints in the App's database (the same SQLite file, or
the same PostgreSQL database and schema), so one backup and one operator cover both workflows
and graphs. It is a complete `BaseCheckpointSaver`: a sync and an async twin of every operation
LangGraph defines, the pair sharing one implementation (`ops.py`), checked by the published
`langgraph-checkpoint-conformance` suite on both backends.

It does not go through Tether's Store port, on purpose. The port is the list of Tether's own
atomic operations, which every backend must answer; a checkpointer's operation list (put,
put_writes, list with metadata filters, copy_thread, prune, ...) is LangGraph's, and changes
with LangGraph's releases. Putting it in the port would make every Tether backend answer for
LangGraph's contract and tie the core to it. So the saver keeps its own tables (`tether_lg_*`),
migrations (`tether_lg_migrations`) and connections, opened with the core's settings, and
shares nothing but the database.

Values are encoded by the saver's `serde`: LangGraph's JsonPlusSerializer (msgpack) with its
pickle fallback off, unless another is given; a serde that would fall back to pickle is refused.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from tether.errors import ConfigurationError
from tether.integrations.langgraph import ops
from tether.store.query import Op

if TYPE_CHECKING:
    from tether.app import App

T = TypeVar("T")


class _Database(Protocol):
    """Where operations run: `sqlite.SqliteDatabase` or `postgres.PostgresDatabase`."""

    url: str

    # `linger`: a write that may wait for the next one to share its commit; `blind`: one that
    # reads no result of its statements, so they may all be sent before any answers.
    def run(
        self, make: Callable[[], Op[T]], *, write: bool, linger: bool = False, blind: bool = False
    ) -> T: ...
    async def arun(
        self, make: Callable[[], Op[T]], *, write: bool, linger: bool = False, blind: bool = False
    ) -> T: ...
    def close(self) -> None: ...
    async def aclose(self) -> None: ...


def _database(url: str) -> _Database:
    if url.startswith("sqlite:"):
        from tether.integrations.langgraph.sqlite import SqliteDatabase

        return SqliteDatabase(url)
    if url.startswith(("postgresql:", "postgres:")):
        try:
            from tether.integrations.langgraph.postgres import PostgresDatabase
        except ImportError as exc:
            raise ConfigurationError(
                f"TetherSaver on PostgreSQL needs psycopg: pip install 'tether[postgres]' ({exc})"
            ) from None
        return PostgresDatabase(url)
    if url.startswith("memory:"):
        raise ConfigurationError(
            f"TetherSaver stores checkpoints in the App's database, and {url!r} keeps none "
            "beyond its App (a private temporary file): give the App a sqlite:/// or "
            "postgresql:// URL (or use LangGraph's InMemorySaver)"
        )
    raise ConfigurationError(
        f"unknown database URL {url!r}: use sqlite:///path/to/file.db or postgresql://user@host/db"
    )


def _without_pickle(serde: SerializerProtocol | None) -> SerializerProtocol:
    if serde is None:
        return JsonPlusSerializer(pickle_fallback=False)
    inner = serde.serde if isinstance(serde, EncryptedSerializer) else serde
    if getattr(inner, "pickle_fallback", False):
        raise ConfigurationError(
            "TetherSaver never stores pickles, and this serde falls back to pickle: "
            "use JsonPlusSerializer(pickle_fallback=False), or leave serde out"
        )
    return serde


class TetherSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer in the App's database: `TetherSaver(app)`, or
    `TetherSaver.from_url("sqlite:///app.db")` / `("postgresql://...")`.

    Connections open on first use; `close()` (or `aclose()` in async code, or a `with` block)
    releases them. Sync methods never need an event loop and async ones never block it.
    """

    def __init__(self, app: App | str, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=_without_pickle(serde))
        self.url = app if isinstance(app, str) else app.url
        self._db = _database(self.url)

    @classmethod
    def from_url(cls, url: str, *, serde: SerializerProtocol | None = None) -> TetherSaver:
        """A saver on the database at `url` (sqlite:///file.db, postgresql://...?schema=s)."""
        return cls(url, serde=serde)

    def __repr__(self) -> str:
        return f"<TetherSaver {self.url!r}>"

    def close(self) -> None:
        self._db.close()

    async def aclose(self) -> None:
        await self._db.aclose()

    def __enter__(self) -> TetherSaver:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> TetherSaver:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- reading --------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint `config` names (its checkpoint_id), or the thread's latest."""
        return self._db.run(partial(ops.get_tuple, self.serde, config), write=False)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._db.arun(partial(ops.get_tuple, self.serde, config), write=False)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints of the config's thread (and namespace, when it names one), newest first;
        `filter`: metadata keys that must be equal; `before`: older than that checkpoint."""
        make = partial(ops.list_checkpoints, self.serde, config, filter, before, limit)
        yield from self._db.run(make, write=False)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        make = partial(ops.list_checkpoints, self.serde, config, filter, before, limit)
        for found in await self._db.arun(make, write=False):
            yield found

    # -- writing --------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint; only the channels in `new_versions` get their value written."""
        make = partial(ops.put, self.serde, config, checkpoint, metadata, new_versions)
        return self._db.run(make, write=True, blind=True)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        make = partial(ops.put, self.serde, config, checkpoint, metadata, new_versions)
        return await self._db.arun(make, write=True, blind=True)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes against the checkpoint in `config`."""
        make = partial(ops.put_writes, self.serde, config, writes, task_id, task_path)
        self._db.run(make, write=True, linger=True, blind=True)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        make = partial(ops.put_writes, self.serde, config, writes, task_id, task_path)
        await self._db.arun(make, write=True, linger=True, blind=True)

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints, values and writes, in every namespace."""
        self._db.run(partial(ops.delete_thread, thread_id), write=True, blind=True)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._db.arun(partial(ops.delete_thread, thread_id), write=True, blind=True)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, value and write of one thread to another."""
        make = partial(ops.copy_thread, source_thread_id, target_thread_id)
        self._db.run(make, write=True, blind=True)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        make = partial(ops.copy_thread, source_thread_id, target_thread_id)
        await self._db.arun(make, write=True, blind=True)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`keep_latest`: keep each namespace's latest checkpoint (and the ancestors its delta
        channels need); `delete`: delete the threads. Run it on threads not running now."""
        self._db.run(partial(ops.prune, self.serde, thread_ids, strategy), write=True)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._db.arun(partial(ops.prune, self.serde, thread_ids, strategy), write=True)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints these runs made (metadata run_id), and their writes."""
        self._db.run(partial(ops.delete_for_runs, self.serde, run_ids), write=True)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._db.arun(partial(ops.delete_for_runs, self.serde, run_ids), write=True)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A version greater than `current`: a zero-padded counter (so versions sort as text)
        and a random fraction, as LangGraph's own savers make them."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(current.split(".")[0])
        return f"{number + 1:032}.{random.random():016}"  # noqa: S311 - not a secret

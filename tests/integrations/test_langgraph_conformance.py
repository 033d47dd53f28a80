"""The published LangGraph checkpointer conformance suite (langgraph-checkpoint-conformance),
run against TetherSaver on SQLite and on PostgreSQL, each capability suite on a fresh database.

The suite calls only the async methods, so it runs twice per backend: on TetherSaver itself,
and on a twin whose async methods call the sync ones in a worker thread (as LangGraph's sync
graphs call them). Every base and extended test must run and pass. The suite skips what a saver
does not override and reports that as a pass, so the number of tests it actually ran is checked
against the number it holds: fewer is a failure, never a quiet success.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
)
from langgraph.checkpoint.conformance.report import ProgressCallbacks
from langgraph.checkpoint.conformance.spec import (
    test_copy_thread,
    test_delete_for_runs,
    test_delete_thread,
    test_get_tuple,
    test_list,
    test_prune,
    test_put,
    test_put_writes,
)
from tests.postgres_server import with_schema

from tether.integrations.langgraph import TetherSaver

# What the suite holds, capability by capability (58 base tests and 23 extended in 0.0.2).
SUITE = {
    "put": len(test_put.ALL_PUT_TESTS),
    "put_writes": len(test_put_writes.ALL_PUT_WRITES_TESTS),
    "get_tuple": len(test_get_tuple.ALL_GET_TUPLE_TESTS),
    "list": len(test_list.ALL_LIST_TESTS),
    "delete_thread": len(test_delete_thread.ALL_DELETE_THREAD_TESTS),
    "delete_for_runs": len(test_delete_for_runs.ALL_DELETE_FOR_RUNS_TESTS),
    "copy_thread": len(test_copy_thread.ALL_COPY_THREAD_TESTS),
    "prune": len(test_prune.ALL_PRUNE_TESTS),
}
BASE = {c.value for c in BASE_CAPABILITIES}
EXTENDED = {c.value for c in EXTENDED_CAPABILITIES}


class SyncTwin(TetherSaver):
    """TetherSaver whose async methods run its sync methods in a worker thread."""

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        def listed() -> list[CheckpointTuple]:
            return [*self.list(config, filter=filter, before=before, limit=limit)]

        for found in await asyncio.to_thread(listed):
            yield found

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


def test_the_suite_holds_58_base_tests_and_the_extended_ones() -> None:
    assert set(SUITE) == BASE | EXTENDED
    assert sum(SUITE[c] for c in BASE) >= 58
    assert sum(SUITE[c] for c in EXTENDED) >= 23


@pytest.mark.parametrize("interface", ["async", "sync"])
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_tether_saver_passes_every_test_of_the_conformance_suite(
    backend: str, interface: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "postgres":
        server = request.getfixturevalue("postgres_url")

    def fresh_url() -> str:  # one database per capability suite: no test sees another's rows
        if backend == "sqlite":
            return f"sqlite:///{tmp_path}/{uuid.uuid4().hex}.db"
        return with_schema(server, f"lg_{uuid.uuid4().hex[:12]}")

    kind: type[TetherSaver] = TetherSaver if interface == "async" else SyncTwin

    @checkpointer_test(name=f"TetherSaver[{backend}, {interface}]")
    async def savers() -> AsyncGenerator[TetherSaver, None]:
        saver = kind.from_url(fresh_url())
        try:
            yield saver
        finally:
            await saver.aclose()

    ran: list[tuple[str, str, bool, str | None]] = []
    record: Callable[[str, str, bool, str | None], None] = lambda *result: ran.append(result)  # noqa: E731
    report = await validate(savers, progress=ProgressCallbacks(on_test_result=record))

    failures = [f"{cap}.{name}:\n{error}" for cap, name, ok, error in ran if not ok]
    assert not failures, "\n\n".join(failures)
    executed = {cap: sum(1 for c, *_ in ran if c == cap) for cap in SUITE}
    assert executed == SUITE, f"the suite ran {executed}, it holds {SUITE}"
    assert sum(executed[c] for c in BASE) >= 58
    assert sum(executed[c] for c in EXTENDED) >= 23
    for cap, result in report.results.items():
        assert result.detected, f"{cap} was not detected as implemented"
        assert (result.tests_passed, result.tests_failed, result.tests_skipped) == (
            SUITE[cap],
            0,
            0,
        )
    assert report.passed_all_base()
    assert report.passed_all()
    assert report.conformance_level() == "FULL"

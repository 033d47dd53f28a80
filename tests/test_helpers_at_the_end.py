"""Recorded helpers (`now`, `uuid4`) still queued when a run ends are written in the commit of
its end (one commit, not two), on every backend and under forced replay; a run that fails
keeps them too, so resuming it replays the values its failed execution saw."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import tether
from tether.store.port import Checkpoint, CheckpointStatus

MakeApp = Callable[..., tether.App]


async def test_helpers_recorded_after_the_last_step_commit_with_the_runs_end(
    make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app()
    calls: list[tuple[str, list[str]]] = []
    store = app.engine.store
    write, finish = store.write_checkpoint, store.finish_run

    async def counted_write(lease: Any, checkpoint: Checkpoint, now: float) -> None:
        calls.append(("write", [checkpoint.name]))
        await write(lease, checkpoint, now)

    async def counted_finish(*args: Any, checkpoints: Any = (), **kwargs: Any) -> None:
        calls.append(("finish", [c.name for c in checkpoints]))
        await finish(*args, checkpoints=checkpoints, **kwargs)

    monkeypatch.setattr(store, "write_checkpoint", counted_write)
    monkeypatch.setattr(store, "finish_run", counted_finish)

    @app.step()
    async def charge() -> int:
        return 120

    @app.workflow()
    async def flow() -> dict[str, object]:
        amount = await charge()
        return {"amount": amount, "at": tether.now().timestamp(), "id": str(tether.uuid4())}

    async with app:
        result = await (await app.start(flow, id="r1")).result()
        history = await store.load_history("r1")
    assert [(c.name, c.status) for c in history] == [
        ("charge", CheckpointStatus.COMPLETED),
        ("now", CheckpointStatus.COMPLETED),
        ("uuid4", CheckpointStatus.COMPLETED),
    ]
    assert calls == [("write", ["charge"]), ("finish", ["now", "uuid4"])]
    assert result["id"] in (history[2].result or "")


async def test_a_failed_run_keeps_its_helpers_and_its_resume_replays_them(
    make_app: MakeApp,
) -> None:
    app = make_app()
    seen: list[str] = []
    fail = [True]

    @app.workflow()
    async def flow() -> str:
        ticket = str(tether.uuid4())
        seen.append(ticket)
        if fail[0]:
            raise ValueError("the ledger refused")
        return ticket

    async with app:
        with pytest.raises(tether.RunFailed):
            await (await app.start(flow, id="r1")).result()
        history = await app.engine.store.load_history("r1")
        assert [(c.name, c.status) for c in history] == [("uuid4", CheckpointStatus.COMPLETED)]
        fail[0] = False
        await app.resume("r1")
        result = await (await app.get("r1")).result()
    assert result == seen[0]
    assert set(seen) == {seen[0]}

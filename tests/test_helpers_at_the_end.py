"""Recorded helpers (`now`, `uuid4`) still queued when a run succeeds are written in the commit
of its end (one commit, not two), on every backend and under forced replay; those queued on a
failure path are not kept, so `app.resume` may take another path."""

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


async def test_a_failed_runs_queued_helpers_do_not_bind_its_resume(make_app: MakeApp) -> None:
    """Helpers queued on a failure path are not kept when the run fails: `app.resume` retries
    the failed step, and the path it takes then records its own helpers where the failure
    path's would have been (kept, they would hold the run as diverged)."""
    app = make_app()
    fail = [True]

    @app.step(retry=tether.Retry(max_attempts=1))
    async def ship() -> str:
        if fail[0]:
            raise ValueError("the carrier refused")
        return "shipped"

    @app.workflow()
    async def flow() -> str:
        try:
            done = await ship()
        except ValueError:
            tether.now()  # when it failed, for the error path's own use
            raise
        return f"{done} as {tether.uuid4()}"

    async with app:
        with pytest.raises(tether.RunFailed):
            await (await app.start(flow, id="r1")).result()
        history = await app.engine.store.load_history("r1")
        assert [(c.name, c.status) for c in history] == [("ship", CheckpointStatus.FAILED)]
        fail[0] = False
        await app.resume("r1")
        result = await (await app.get("r1")).result(timeout=10)
        history = await app.engine.store.load_history("r1")
    assert result.startswith("shipped as ")
    assert [(c.name, c.status) for c in history] == [
        ("ship", CheckpointStatus.COMPLETED), ("uuid4", CheckpointStatus.COMPLETED)
    ]  # fmt: skip

"""The engine's shared parts: the store, serializer, clock, settings and registered workflows.

One Engine per App. It wires things together and holds no execution logic; the runner, the
worker and the step machinery receive it. It never imports a backend.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tether.clock import Clock
from tether.serde import Serde
from tether.store.base import RunRecord, Store

if TYPE_CHECKING:
    from tether.core.workflow import Workflow


@dataclass(frozen=True, slots=True)
class Settings:
    lease_duration: float = 15.0  # seconds a lease lasts without a heartbeat
    inline_wait_max: float = 2.0  # waits up to this long hold the lease; longer ones suspend
    poll_interval: float = 1.0  # fallback for work created by other processes
    concurrency: int = 1000  # runs one worker executes at once
    force_replay: bool = False  # replay the run from the store after every new checkpoint


@dataclass(slots=True)
class Engine:
    store: Store
    serde: Serde
    clock: Clock
    settings: Settings
    workflows: dict[str, Workflow[..., object]] = field(default_factory=dict)
    # Futures of local callers waiting for a run to end, so they wake without polling.
    wakeups: dict[str, list[asyncio.Future[RunRecord | None]]] = field(default_factory=dict)

    def run_ended(self, run_id: str, record: RunRecord | None) -> None:
        """Wake this process's callers waiting on the run; `record` is its final state, when
        known (else they read it)."""
        futures = self.wakeups.pop(run_id, [])
        if not futures:
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for future in futures:
            if future.get_loop() is running:
                _resolve(future, record)
            else:
                future.get_loop().call_soon_threadsafe(_resolve, future, record)


def _resolve(future: asyncio.Future[RunRecord | None], record: RunRecord | None) -> None:
    if not future.done():
        future.set_result(record)

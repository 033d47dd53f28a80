"""The workflow of the recovery benchmark: 10 steps of 0.1 s each."""

from __future__ import annotations

import asyncio

import tether


def make_app(url: str) -> tuple[tether.App, tether.Workflow[[], int]]:
    app = tether.App(url)

    @app.step()
    async def work(i: int) -> int:
        await asyncio.sleep(0.1)
        return i

    @app.workflow()
    async def flow() -> int:
        total = 0
        for i in range(10):
            total += await work(i)
        return total

    return app, flow

"""A fan-out workflow for tests/crash/test_fanout_crashes.py, and its process: `python -m
tests.crash.fanout_flows DB SIDE_DIR` starts (or finds) run `fan`, waits for its result and
writes it to SIDE_DIR/result-<pid>.json. Faults come from $TETHER_FAULTS.

`fan` runs three branches at once (asyncio.gather of helper coroutines). Each branch calls
`add`, takes a `tether.uuid4()`, calls `double`; the last one also starts a child run `kid` and
waits for it; the branches' steps sleep so that they finish in reverse order. Then `total`.
Every step body journals `start RUN NAME` and `end RUN NAME` in SIDE_DIR/bodies.txt (NAME its
checkpoint name), so the test counts executions across processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import tether
from tether.core.context import current_step

from .backends import database_url
from .flows import _append

RUN_ID = "fan"
BRANCHES = 3


def make_app(db: str, side_dir: str | Path) -> tether.App:
    side = Path(side_dir)
    app = tether.App(database_url(db))

    async def body(delay: float) -> None:
        step = current_step()
        assert step is not None
        _append(side / "bodies.txt", f"start {step.run_id} {step.name}")
        await asyncio.sleep(delay)
        _append(side / "bodies.txt", f"end {step.run_id} {step.name}")

    @app.step()
    async def add(i: int) -> int:
        await body((BRANCHES - i) * 0.04)  # the first branch is the slowest
        return i + 1

    @app.step()
    async def double(x: int) -> int:
        await body(0.01 * x)
        return x * 2

    @app.step()
    async def total(values: list[int]) -> int:
        await body(0.0)
        return sum(values)

    @app.workflow()
    async def kid(x: int) -> int:
        return await add(x)

    async def branch(i: int) -> dict[str, Any]:
        a = await add(i)
        token = tether.uuid4()
        b = await double(a)
        if i == BRANCHES - 1:
            b += await kid(10)
        return {"value": b, "token": str(token)}

    @app.workflow()
    async def fan() -> dict[str, Any]:
        branches = await asyncio.gather(*(branch(i) for i in range(BRANCHES)))
        return {"branches": list(branches), "total": await total([b["value"] for b in branches])}

    return app


# Each branch's checkpoints, and the run's own, in every order a kill may find them.
CHECKPOINTS = [
    *(f"{kind}@{i}" for i in range(BRANCHES) for kind in ("add", "uuid4", "double")),
    f"child:kid@{BRANCHES - 1}", f"join:kid@{BRANCHES - 1}", "total",
]  # fmt: skip
STEPS = [*(f"{k}@{i}" for i in range(BRANCHES) for k in ("add", "double")), "total"]
CHILD = f"{RUN_ID}/child:kid@{BRANCHES - 1}"
VALUES = [2, 4, 6 + 11]  # the last branch adds its child's result


async def main(db: str, side_dir: str) -> None:
    app = make_app(db, side_dir)
    async with app:
        handle = await app.start("fan", id=RUN_ID)
        result = await handle.result(timeout=60)
    (Path(side_dir) / f"result-{os.getpid()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))

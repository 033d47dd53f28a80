"""Records the golden histories of this folder: `python -m tests.golden.record` (from the repo
root). Run it only to add a history on purpose; the point of the files is that they stay."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from tests.golden import flows

import tether
from tether.testing import export_history

HERE = Path(__file__).parent


async def record(name: str, order_version: int, workflow: str, *args: object) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        app = tether.App(f"sqlite:///{tmp}/golden.db")
        flows.register(app, order_version=order_version)
        # Waits past 50 ms suspend: the history holds the waits' start markers too.
        app.engine.settings = dataclasses.replace(app.engine.settings, inline_wait_max=0.05)
        async with app:
            handle = await app.start(workflow, *args, id=f"golden-{name}")
            with contextlib.suppress(tether.RunFailed):
                await handle.result(timeout=30)
            history = await export_history(app, handle.id)
    (HERE / f"{name}.json").write_text(json.dumps(history, indent=2, sort_keys=True) + "\n")


RECORDINGS = {
    "order_v2": (2, "order", "o-1", 40),
    "greet": (2, "greet", "ada"),
    "batch": (2, "batch", 3),
    # Recorded from version 1 of `order`: the current code must refuse to replay it.
    "order_v1_nondeterministic": (1, "order", "o-2", 15),
    "survey": (2, "survey", ["north", "south", "east"]),
}


async def main(names: list[str]) -> None:
    for name in names or RECORDINGS:
        version, workflow, *args = RECORDINGS[name]
        await record(name, int(version), str(workflow), *args)  # type: ignore[call-overload]


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))

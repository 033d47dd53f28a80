"""One process of the wait crash tests.

`python -m tests.crash.wait_proc run DB SIDE_DIR WORKFLOW RUN_ID ARG_JSON`
    Opens the app of wait_flows.py (its in-process worker first recovers the runs of dead
    workers on this host), starts run RUN_ID of WORKFLOW (an existing run with that id is the
    same run), waits for its result and writes it as JSON to SIDE_DIR/result-<pid>.json.
`python -m tests.crash.wait_proc send DB RUN_ID KEY PAYLOAD_JSON`
    Sends one event to the run (`App.send`), with no worker in this process.

DB is a database URL (sqlite:///..., postgresql://...?schema=...) or the path of a SQLite file.
Faults come from $TETHER_FAULTS, the inline wait window from $CRASH_INLINE_WAIT.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from tests.crash.backends import database_url
from tests.crash.wait_flows import make_app

import tether


async def run(db: str, side_dir: str, workflow: str, run_id: str, arg: str) -> None:
    app = make_app(db, side_dir)
    async with app:
        handle = await app.start(workflow, json.loads(arg), id=run_id)
        result = await handle.result(timeout=60)
    path = Path(side_dir) / f"result-{os.getpid()}.json"
    path.write_text(json.dumps(result), encoding="utf-8")


async def send(db: str, run_id: str, key: str, payload: str) -> None:
    app = tether.App(database_url(db))
    try:
        await app.send(run_id, key, json.loads(payload))
    finally:
        await app.close()


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    asyncio.run(run(*rest) if command == "run" else send(*rest))

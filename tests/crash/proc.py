"""One worker process of the crash tests: `python -m tests.crash.proc DB SIDE_DIR RUN_ID [...]`.

DB is a database URL (sqlite:///..., postgresql://...?schema=...) or the path of a SQLite file.

Opens the app (its in-process worker first recovers the runs of dead workers on this host),
starts run RUN_ID of `pipeline` (an existing run with that id is the same run, not a new one),
waits for its result and writes it as JSON to SIDE_DIR/result-<pid>.json. With more run ids, it
starts them all at once and also writes {run id: result} to SIDE_DIR/results-<pid>.json. Faults
come from $TETHER_FAULTS, hangs from $CRASH_HANG_IN (see flows.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from tests.crash.flows import make_app


async def main(db: str, side_dir: str, *run_ids: str) -> None:
    app = make_app(db, side_dir)
    async with app:
        handles = await asyncio.gather(*(app.start("pipeline", "order-1", id=i) for i in run_ids))
        results = await asyncio.gather(*(h.result(timeout=60) for h in handles))
    side = Path(side_dir)
    (side / f"result-{os.getpid()}.json").write_text(json.dumps(results[0]), encoding="utf-8")
    if len(run_ids) > 1:
        by_id = dict(zip(run_ids, results, strict=True))
        (side / f"results-{os.getpid()}.json").write_text(json.dumps(by_id), encoding="utf-8")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], *sys.argv[3:]))

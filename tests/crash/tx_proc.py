"""One worker process of the transaction crash tests:
`python -m tests.crash.tx_proc DB SIDE_DIR RECEIVER_URL RUN_ID`.

Opens the app (its worker first recovers the runs, and the outbox claims, of dead workers on
this host), starts run RUN_ID of `ledger` (an existing run is the same run), waits for its
result and for its outbox messages to be delivered, then writes the result as JSON to
SIDE_DIR/result-<pid>.json. Faults come from $TETHER_FAULTS, hangs from $CRASH_HANG_IN.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from tests.crash.tx_flows import ORDER, WORKFLOW, make_app

from tether.store.port.outbox import OutboxStatus


async def main(db: str, side_dir: str, receiver: str, run_id: str) -> None:
    app = make_app(db, side_dir, receiver)
    async with app:
        handle = await app.start(WORKFLOW, ORDER, id=run_id)
        result = await handle.result(timeout=60)
        async with asyncio.timeout(30):
            while True:
                messages = await app.list_outbox(run_id=run_id)
                if len(messages) == 3 and all(m.status is OutboxStatus.DELIVERED for m in messages):
                    break
                await asyncio.sleep(0.01)
    path = Path(side_dir) / f"result-{os.getpid()}.json"
    path.write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))

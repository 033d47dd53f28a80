"""The workflow the transaction crash tests kill: two transaction steps, `debit` and `credit`,
each writing a row of the business table `ledger` and recording an outbox message in its body,
then `await tether.outbox(...)` in workflow code. Messages go to the test's HTTP receiver.

Every body first appends its name to the `bodies` side file (fsynced), so the test counts body
executions across processes killed with SIGKILL. Environment of the first process only:
CRASH_HANG_IN=<step name>  that body, after its insert and its message, writes the marker file
                           `started-<name>` and sleeps 60 s inside the open transaction
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import tether
from tether.core.context import current_step

from .backends import backend_of, database_url
from .flows import _append

WORKFLOW = "ledger"
ORDER = "order-1"
FAST = tether.Retry(max_attempts=20, initial_delay=timedelta(milliseconds=20),
                    max_delay=timedelta(milliseconds=200))  # fmt: skip


def expected_result(done_key: str) -> dict[str, Any]:
    return {"debit": 1, "credit": 2, "done": done_key}


def make_app(db: str | Path, side_dir: str | Path, receiver: str) -> tether.App:
    """An App on `db` with the `ledger` workflow, whose messages go to `receiver` (a URL)."""
    url = database_url(db)
    p = "%s" if backend_of(url) == "postgres" else "?"
    side = Path(side_dir)
    hang_in = os.environ.get("CRASH_HANG_IN", "")
    app = tether.App(url, senders={"http": tether.HttpSender(timeout=5.0, retry=FAST)})

    def body(conn: Any, order: str, amount: int) -> int:
        step = current_step()
        assert step is not None
        _append(side / "bodies", step.name)
        conn.execute("CREATE TABLE IF NOT EXISTS ledger (run_id TEXT, step TEXT, amount INTEGER)")
        conn.execute(f"INSERT INTO ledger VALUES ({p}, {p}, {p})", (step.run_id, step.name, amount))
        tether.outbox(f"{receiver}/{step.name}", {"order": order, "amount": amount})
        if step.name == hang_in:
            _append(side / f"started-{step.name}", str(os.getpid()))
            time.sleep(60)  # the test kills this process meanwhile, inside the transaction
            raise AssertionError(f"body {step.name} was not killed while it hung")
        row = conn.execute(f"SELECT count(*) FROM ledger WHERE run_id = {p}", (step.run_id,))
        return int(row.fetchone()[0])

    @app.transaction()
    def debit(conn: Any, order: str) -> int:
        return body(conn, order, -10)

    @app.transaction()
    def credit(conn: Any, order: str) -> int:
        return body(conn, order, 10)

    @app.workflow(name=WORKFLOW)
    async def ledger(order: str) -> dict[str, Any]:
        a = await debit(order)
        b = await credit(order)
        done = await tether.outbox(f"{receiver}/done", {"order": order, "rows": b})
        return {"debit": a, "credit": b, "done": done.key}

    return app

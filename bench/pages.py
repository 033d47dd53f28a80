"""Server time of the console's pages with 1,000,000 runs in one SQLite file (WAL, FULL): the
runs explorer (first page, filters, a deep page, the id search), a run page, the operations
pages and the inbox, each requested through the ASGI application in this process by a
signed-in admin, median and slowest of the repeats in ms. Prints only; asserts no time.

The runs are written by the bulk SQL of bench/console.py. No worker runs meanwhile.

    python -m bench.pages [--runs N] [--repeat N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import httpx

import tether
from tether.server import create_server
from tether.users import add_user

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.console import populate_sqlite  # noqa: E402

TARGET_MS = 150.0


def pages(path: Path) -> list[tuple[str, str]]:
    """(name, path) of every page measured, with ids read from the populated file."""
    conn = sqlite3.connect(path)
    some_id, workflow = conn.execute(
        "SELECT id, workflow FROM tether_runs ORDER BY created_at DESC LIMIT 1 OFFSET "
        "(SELECT count(*) / 2 FROM tether_runs)"
    ).fetchone()
    conn.close()
    return [
        ("explorer, first page", "/runs"),
        ("explorer, status dead", "/runs?status=dead"),
        ("explorer, two statuses", "/runs?status=failed&status=dead"),
        ("explorer, workflow", f"/runs?workflow={quote(workflow)}"),
        ("explorer, workflow + queue", f"/runs?workflow={quote(workflow)}&queue=q-1"),
        ("explorer, one day", "/runs?since=2023-11-20T00:00&until=2023-11-21T00:00"),
        ("explorer, id search", f"/runs?q={quote(some_id[:5])}"),
        ("run page", f"/runs/{quote(some_id, safe='')}"),
        ("ops: workers", "/ops/workers"),
        ("ops: queues", "/ops/queues"),
        ("ops: schedules", "/ops/schedules"),
        ("ops: outbox", "/ops/outbox"),
        ("ops: dead runs", "/ops/dead"),
        ("inbox", "/"),
    ]


async def measure(path: Path, repeat: int) -> dict[str, list[float]]:
    app = tether.App(f"sqlite:///{path}")
    await app.open()
    _, token = await add_user(app.engine, "bench-admin", frozenset({"admin"}))
    server = create_server(app)
    timed: dict[str, list[float]] = {}
    transport = httpx.ASGITransport(app=server)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        signed = await http.post("/login", data={"token": token},
                                 headers={"Origin": "http://127.0.0.1"})  # fmt: skip
        assert signed.status_code == 303, signed.text
        for name, url in pages(path):
            for _ in range(repeat):
                start = time.perf_counter()
                answer = await http.get(url)
                elapsed = (time.perf_counter() - start) * 1000
                if answer.status_code != 200:
                    raise SystemExit(f"{name}: {url} answered {answer.status_code}")
                timed.setdefault(name, []).append(elapsed)
    await app.close()
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tether-pages-", dir=ROOT / "bench") as tmp:
        path = Path(tmp) / "pages.db"

        async def schema() -> None:
            app = tether.App(f"sqlite:///{path}")
            await app.open()
            await app.close()

        asyncio.run(schema())
        start = time.perf_counter()
        populate_sqlite(path, args.runs)
        filled = time.perf_counter() - start
        timed = asyncio.run(measure(path, args.repeat))
    figures = {name: {"median_ms": round(statistics.median(ms), 1), "max_ms": round(max(ms), 1)}
               for name, ms in timed.items()}  # fmt: skip
    if args.json:
        print(json.dumps({"runs": args.runs, "pages": figures}))
        return
    print(f"{args.runs:,} runs written in {filled:.1f} s; each page {args.repeat} times, "
          f"ms (target: under {TARGET_MS:.0f} ms server time)")  # fmt: skip
    for name, figure in figures.items():
        mark = "" if figure["max_ms"] < TARGET_MS else "   over the target"
        print(
            f"  {name:28} {figure['median_ms']:8.1f} median {figure['max_ms']:8.1f} slowest{mark}"
        )


if __name__ == "__main__":
    main()

"""The runs explorer's page queries on 1,000,000 runs, on SQLite (WAL) and PostgreSQL: ms per
page of store.list_runs (median and slowest of the repeats, through the store as the API calls
it) for the first page, each filter, a deep page by cursor and the id search, with the plan
each one gets (EXPLAIN). Prints only; asserts no time.

The runs are written by bulk SQL (as Tether's schema stores them), spread over statuses,
workflows, queues, versions, starters and 30 days, with pairs of runs created at the same time.

    python -m bench.console [--runs N] [--repeat N] [--json] [--sqlite-only] [--url postgresql://...]
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tether
from tether.store.ops import runs as run_ops
from tether.store.port import RunStatus, Store
from tether.store.query import Queries, Query, drive

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.postgres import server  # noqa: E402

START = 1_700_000_000.0
SPAN = 30 * 86400.0  # the runs' creation times cover 30 days
LIMIT = 50

# The spread, as expressions of the row number i (both dialects): status by a hash of i (70%
# succeeded, 0.2% dead, ...), 20 workflows, 5 queues for 30% of the runs, 5 versions, 50
# starters for 80%, created every SPAN/N seconds with every pair of runs at the same time.
# {h}: (i * 7919) % 1000.
STATUS = (
    "CASE WHEN {h} < 700 THEN 'succeeded' WHEN {h} < 750 THEN 'failed' "
    "WHEN {h} < 800 THEN 'running' WHEN {h} < 900 THEN 'pending' WHEN {h} < 970 THEN 'waiting' "
    "WHEN {h} < 990 THEN 'cancelled' WHEN {h} < 995 THEN 'held' WHEN {h} < 998 THEN 'dead' "
    "ELSE 'succeeded' END"
)
COLUMNS = "id, workflow, status, args, epoch, created_at, updated_at, queue, version, started_by"


def values(dialect: str, n: int) -> str:
    """The SELECT list making run i (SQLite: of a recursive CTE, PostgreSQL: generate_series)."""
    h = "((i * 7919) % 1000)"
    run_id = "lower(hex(randomblob(16)))" if dialect == "sqlite" else "md5(i::text)"
    text = "'{}'" if dialect == "sqlite" else "'{}'::text"
    cat = "||"
    # Pairs: i and i + 1 (i even) share a time (integer division in both dialects).
    at = f"({START} + (i / 2) * 2 * {SPAN} / {n})"
    return (
        f"{run_id}, 'wf-' {cat} (i % 20), {STATUS.format(h=h)}, {text}, 1, {at}, {at}, "
        f"CASE WHEN i % 10 < 3 THEN 'q-' {cat} (i % 5) END, 'v' {cat} (i % 5), "
        f"CASE WHEN i % 5 < 4 THEN 'user-' {cat} (i % 50) END"
    )


def populate_sqlite(path: Path, n: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute(
        f"WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < {n - 1}) "
        f"INSERT INTO tether_runs ({COLUMNS}) SELECT {values('sqlite', n)} FROM s"
    )
    # Ids with LIKE's wildcards, for the search: found literally, or not at all.
    conn.execute(
        f"INSERT INTO tether_runs ({COLUMNS}) VALUES ('order_%-1', 'wf-1', 'succeeded', '{{}}', "
        f"1, {START}, {START}, NULL, 'v1', NULL)"
    )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def populate_postgres(url: str, n: int) -> None:
    import psycopg

    from tether.store.postgres import parse_postgres_url

    conninfo, _ = parse_postgres_url(url)
    with psycopg.connect(conninfo) as conn:
        conn.execute(
            f"INSERT INTO tether_runs ({COLUMNS}) SELECT {values('postgres', n)} "
            f"FROM generate_series(0::bigint, {n - 1}) AS i"
        )
        conn.execute(
            f"INSERT INTO tether_runs ({COLUMNS}) VALUES ('order_%-1', 'wf-1', 'succeeded', "
            f"'{{}}', 1, {START}, {START}, NULL, 'v1', NULL)"
        )
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE tether_runs")


def cases(deep: tuple[float, str], some_id: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(label, list_runs keywords) of each kind of page the explorer asks for."""
    day = (START + SPAN / 2, START + SPAN / 2 + 86400.0)
    yield "first page", {}
    yield "status succeeded (70%)", {"statuses": [RunStatus.SUCCEEDED]}
    yield "status dead (0.3%)", {"statuses": [RunStatus.DEAD]}
    yield "status failed or dead", {"statuses": [RunStatus.FAILED, RunStatus.DEAD]}
    yield "workflow", {"workflow": "wf-7"}
    yield "queue", {"queue": "q-2"}
    yield "version", {"version": "v3"}
    yield "started_by", {"started_by": "user-12"}
    yield "one day", {"created_after": day[0], "created_before": day[1]}
    yield "one day, status failed", {"statuses": [RunStatus.FAILED], "created_after": day[0],
                                     "created_before": day[1]}  # fmt: skip
    yield "status + workflow", {"statuses": [RunStatus.FAILED], "workflow": "wf-3"}
    yield "status + workflow + queue", {"statuses": [RunStatus.PENDING], "workflow": "wf-1",
                                        "queue": "q-1"}  # fmt: skip
    # No run matches (wf-3's runs are in no queue): one filter's index read to its end.
    yield "no match: workflow + queue", {"workflow": "wf-3", "queue": "q-3"}
    yield "deep page (cursor at half)", {"before": deep}
    yield "deep page, status failed", {"statuses": [RunStatus.FAILED], "before": deep}
    yield "id prefix (2 chars)", {"id_prefix": some_id[:2]}
    yield "id prefix (5 chars)", {"id_prefix": some_id[:5]}
    yield "id prefix (whole id)", {"id_prefix": some_id}
    yield "id prefix with % and _", {"id_prefix": "order_%"}


def statements(kwargs: dict[str, Any], queries: Queries) -> list[tuple[str, dict[str, Any]]]:
    """The SQL and parameters list_runs runs for these keywords (one per status if several)."""
    seen: list[Query] = []

    def capture(query: Query) -> list[Any]:
        seen.append(query)
        return []

    args = {"statuses": [], "workflow": None, "limit": LIMIT, "before": None} | kwargs
    drive(run_ops.list_runs(**args), capture)
    return [(queries.sql(q), dict(q.params)) for q in seen]  # type: ignore[arg-type]


def plan_sqlite(path: Path, kwargs: dict[str, Any]) -> str:
    from tether.store.sqlite import _QUERIES

    conn = sqlite3.connect(path)
    try:
        plans = []
        for sql, params in statements(kwargs, _QUERIES):
            rows = conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
            plans.append("; ".join(str(r[-1]) for r in rows))
        return " | ".join(plans)
    finally:
        conn.close()


def plan_postgres(url: str, kwargs: dict[str, Any]) -> str:
    import psycopg

    from tether.store.postgres import _QUERIES, parse_postgres_url

    conninfo, _ = parse_postgres_url(url)
    with psycopg.connect(conninfo) as conn:
        plans = []
        for sql, params in statements(kwargs, _QUERIES):
            rows = conn.execute("EXPLAIN " + sql, params).fetchall()
            nodes = [str(r[0]).strip().removeprefix("->  ") for r in rows]
            plans.append("; ".join(n.split("  (")[0] for n in nodes if "(cost" in n))
        return " | ".join(plans)


Timed = list[tuple[str, dict[str, Any], float, float]]  # label, keywords, median, slowest


async def timings(store: Store, repeat: int, half: int) -> Timed:
    everything = await store.list_runs(limit=1)
    assert everything, "no runs"
    # The cursor halfway down (the 500,000th newest run's of a million), by a walk of pages.
    walked = None
    total = 0
    while total < half:
        page = await store.list_runs(limit=10_000, before=walked)
        if not page:
            break
        total += len(page)
        walked = (page[-1].created_at, page[-1].id)
    assert walked is not None
    some_id = everything[0].id
    found = []
    for label, kwargs in cases(walked, some_id):
        samples = []
        for _ in range(repeat):
            started = time.perf_counter()
            page = await store.list_runs(limit=LIMIT, **kwargs)
            samples.append((time.perf_counter() - started) * 1000)
        assert page or label.startswith("no match"), label
        found.append((label, kwargs, statistics.median(samples), max(samples)))
    return found


def report(name: str, rows: Timed, plans: dict[str, str], as_json: bool) -> dict[str, Any]:
    figures = {label: {"median_ms": round(median, 2), "max_ms": round(worst, 2),
                       "plan": plans[label]} for label, _, median, worst in rows}  # fmt: skip
    if not as_json:
        print(f"\n{name}: page of {LIMIT}, ms (median, slowest)")
        for label, _, median, worst in rows:
            print(f"  {label:32} {median:8.2f} {worst:8.2f}   {plans[label]}")
    return figures


async def measure(url: str, repeat: int, half: int) -> Timed:
    app = tether.App(url)
    await app.open()
    try:
        return await timings(app.engine.store, repeat, half)
    finally:
        await app.close()


def run_sqlite(n: int, repeat: int, as_json: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tether-bench-", dir=ROOT / "bench") as tmp:
        path = Path(tmp) / "console.db"
        url = f"sqlite:///{path}"
        asyncio.run(tether.App(url).open())  # the schema
        note(f"sqlite: writing {n:,} runs")
        started = time.perf_counter()
        populate_sqlite(path, n)
        note(f"  {time.perf_counter() - started:.1f} s; timing the pages")
        rows = asyncio.run(measure(url, repeat, n // 2))
        plans = {label: plan_sqlite(path, kwargs) for label, kwargs, _, _ in rows}
        return report(f"SQLite, {n:,} runs", rows, plans, as_json)


def run_postgres(url: str | None, n: int, repeat: int, as_json: bool) -> dict[str, Any]:
    with server(url) as base:
        asyncio.run(tether.App(base).open())
        note(f"postgres: writing {n:,} runs")
        started = time.perf_counter()
        populate_postgres(base, n)
        note(f"  {time.perf_counter() - started:.1f} s; timing the pages")
        rows = asyncio.run(measure(base, repeat, n // 2))
        plans = {label: plan_postgres(base, kwargs) for label, kwargs, _, _ in rows}
        return report(f"PostgreSQL, {n:,} runs", rows, plans, as_json)


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument("--url", help="a PostgreSQL database to fill (default: a throwaway one)")
    options = parser.parse_args()
    figures = {"sqlite": run_sqlite(options.runs, options.repeat, options.json)}
    if not options.sqlite_only:
        figures["postgres"] = run_postgres(options.url, options.runs, options.repeat,
                                           options.json)  # fmt: skip
    if options.json:
        print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()

"""Makes the legacy databases of tests/test_migrations.py: Tether's schema as of commit 2dfcbfc
(SQLite migrations then numbered 1..12), with a finished run and one waiting for an event.

Run from a checkout of that commit (its src/ first on PYTHONPATH) with a database URL, then
dump it: SQLite with sqlite3's iterdump(), PostgreSQL with `pg_dump -n SCHEMA --no-owner
--no-privileges --inserts`, the schema's name replaced by {schema}.
"""

import asyncio
import sys
from datetime import timedelta

import tether

URL = sys.argv[1]
app = tether.App(URL)


@app.step()
async def add(x: int, y: int) -> int:
    return x + y


@app.workflow()
async def legacy(x: int) -> int:
    a = await add(x, 1)
    b = await add(a, 2)
    got = await tether.wait_for_event("go", timeout=timedelta(days=365))
    return await add(b, int(got))


@app.workflow()
async def finished(x: int) -> int:
    return await add(x, 10)


async def main() -> None:
    async with app:
        done = await app.start(finished, 5, id="legacy-done")
        assert await done.result(timeout=10) == 15
        waiting = await app.start(legacy, 1, id="legacy-waiting")
        for _ in range(200):
            info = await waiting.info()
            if info.status.value == "waiting":
                break
            await asyncio.sleep(0.05)
        assert (await waiting.info()).status.value == "waiting", await waiting.info()
        await app.start(legacy, 100, id="legacy-early-event")
        await asyncio.sleep(0.3)
        await app.send("legacy-early-event", "go", 7)
        await (await app.get("legacy-early-event")).result(timeout=10)


asyncio.run(main())
print("made", URL)

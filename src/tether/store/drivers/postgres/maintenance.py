"""The upkeep of a PostgreSQL database for Tether: VACUUM ANALYZE of its tables on request,
and sizes from pg_total_relation_size. PostgreSQL's autovacuum makes freed space reusable;
there is no log for Tether to checkpoint. It knows nothing of runs. SQL in
sql/postgres/retention.sql.
"""

from __future__ import annotations

from typing import Any

import psycopg

from tether.store.drivers.postgres.options import PostgresOptions
from tether.store.port.maintenance import StorageSizes, TableSize
from tether.store.query import Queries
from tether.store.tables import table_name

Conn = psycopg.AsyncConnection[Any]


async def _one(c: Conn, query: str) -> Any:
    row = await (await c.execute(query)).fetchone()
    assert row is not None
    return row[0]


async def vacuum(options: PostgresOptions, queries: Queries) -> int:
    sizes = queries.named["retention_table_sizes"]
    # VACUUM cannot run inside a transaction: a connection of its own, in autocommit.
    async with await psycopg.AsyncConnection.connect(options.conninfo, autocommit=True) as conn:
        if options.schema is not None:
            await conn.execute(f'SET search_path TO "{options.schema}"')
        before = await (await conn.execute(sizes)).fetchall()
        for name, _ in before:
            await conn.execute(f"VACUUM (ANALYZE) {table_name(name)}")
        after = await (await conn.execute(sizes)).fetchall()
    return sum(int(b) for _, b in before) - sum(int(b) for _, b in after)


async def storage_sizes(conn: Conn, queries: Queries) -> StorageSizes:
    q = queries.named
    found = await (await conn.execute(q["retention_table_sizes"])).fetchall()
    tables = []
    for name, size in found:
        count = await _one(conn, q["retention_count_rows"].format(table=table_name(name)))
        tables.append(TableSize(name, int(count), int(size)))
    database = int(await _one(conn, q["retention_database_bytes"]))
    return StorageSizes(backend="postgres", tables=tuple(tables), database_bytes=database)

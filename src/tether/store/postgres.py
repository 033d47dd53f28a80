"""The PostgreSQL backend of the Store port: the store's operations through the PostgreSQL
driver (a pool, the group commit, LISTEN/NOTIFY).

PostgreSQL is the coordination substrate for many workers on many machines: claims use FOR
UPDATE SKIP LOCKED, writes are fenced by (owner, epoch), and NOTIFY tells idle workers that
something became due. Everything but the driver is the SQL store's, shared with SQLite. This
module must not import tether.core.
"""

from __future__ import annotations

from tether.store.drivers.postgres import CHANNEL, PostgresDriver, parse_postgres_url
from tether.store.sql_store import SqlStore, queries

_QUERIES = queries("postgres")
__all__ = ["CHANNEL", "PostgresStore", "parse_postgres_url"]


class PostgresStore(SqlStore):
    """Store on a PostgreSQL database; many workers on many machines may share it."""

    driver: PostgresDriver

    def __init__(
        self,
        url: str,
        *,
        min_size: int | None = None,
        max_size: int | None = None,
        listen: bool = True,
        hold: bool = True,
    ) -> None:
        self.url = url
        self.driver = PostgresDriver(
            url, _QUERIES, min_size=min_size, max_size=max_size, listen=listen, hold=hold
        )

    def another(self) -> PostgresStore:
        # A keepalive's handle: a heartbeat now and then needs no connection of its own.
        return PostgresStore(self.url, min_size=1, max_size=1, listen=False, hold=False)

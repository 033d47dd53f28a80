"""The SQLite backend of the Store port: the store's operations on one file, through the
SQLite driver's group commit (many runs share one fsync).

WAL mode and synchronous=FULL by default: a checkpoint is durable when its operation returns.
Everything but the driver is the SQL store's, shared with PostgreSQL. This module must not
import tether.core.
"""

from __future__ import annotations

from tether.store.drivers.sqlite import SqliteDriver
from tether.store.sql_store import SqlStore, queries

_QUERIES = queries("sqlite")


class SqliteStore(SqlStore):
    """Store on one SQLite file; several processes may share the file."""

    driver: SqliteDriver

    def __init__(self, url: str, *, busy_timeout: float = 30.0, auto_open: bool = False) -> None:
        self.url = url
        self.driver = SqliteDriver(url, _QUERIES, busy_timeout=busy_timeout, auto_open=auto_open)
        self.path, self.synchronous = self.driver.path, self.driver.synchronous
        self._busy_timeout = busy_timeout

    def another(self) -> SqliteStore | None:
        return SqliteStore(self.url, busy_timeout=self._busy_timeout)

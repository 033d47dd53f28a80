"""The SQLite driver: one file's connections and group commit (commit), running operations
(driver), a transaction step's guarded connection (body) and the file's upkeep (maintenance).
"""

from tether.store.drivers.sqlite.commit import (
    JOURNAL_SIZE_LIMIT,
    CommitQueue,
    network_filesystem,
    parse_sqlite_url,
)
from tether.store.drivers.sqlite.driver import SqliteDriver, execute

__all__ = [
    "JOURNAL_SIZE_LIMIT",
    "CommitQueue",
    "SqliteDriver",
    "execute",
    "network_filesystem",
    "parse_sqlite_url",
]

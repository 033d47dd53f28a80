"""The retention (deleting what finished long ago, in small batches), WAL checkpoints and sizes:
the operations of the Sqlite backend, mixed into SqliteStore.

SQL in sql/sqlite/. It must not import tether.core.
"""

from __future__ import annotations


class SqliteRetention:
    """Mixed into SqliteStore."""

"""The values a run publishes for callers, and forks (a new run from another's history): the
operations of the Sqlite backend, mixed into SqliteStore.

SQL in sql/sqlite/. It must not import tether.core.
"""

from __future__ import annotations


class SqliteValues:
    """Mixed into SqliteStore."""

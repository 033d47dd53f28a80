"""The schedules (one run per cron slot, a cursor per schedule) and runs started at a later time:
the operations of the Sqlite backend, mixed into SqliteStore.

SQL in sql/sqlite/. It must not import tether.core.
"""

from __future__ import annotations


class SqliteSchedules:
    """Mixed into SqliteStore."""

"""The schedules (one run per cron slot, a cursor per schedule) and runs started at a later time:
the operations of the Postgres backend, mixed into PostgresStore.

SQL in sql/postgres/. It must not import tether.core.
"""

from __future__ import annotations


class PostgresSchedules:
    """Mixed into PostgresStore."""

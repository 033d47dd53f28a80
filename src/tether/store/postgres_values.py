"""The values a run publishes for callers, and forks (a new run from another's history): the
operations of the Postgres backend, mixed into PostgresStore.

SQL in sql/postgres/. It must not import tether.core.
"""

from __future__ import annotations


class PostgresValues:
    """Mixed into PostgresStore."""

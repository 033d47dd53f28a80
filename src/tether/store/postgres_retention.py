"""The retention (deleting what finished long ago, in small batches), WAL checkpoints and sizes:
the operations of the Postgres backend, mixed into PostgresStore.

SQL in sql/postgres/. It must not import tether.core.
"""

from __future__ import annotations


class PostgresRetention:
    """Mixed into PostgresStore."""

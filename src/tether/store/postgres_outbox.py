"""The transactions (a step's business writes committed with its checkpoint) and the outbox
(messages committed with a checkpoint, delivered by key): the operations of the Postgres
backend, mixed into PostgresStore.

SQL in sql/postgres/. It must not import tether.core.
"""

from __future__ import annotations


class PostgresOutbox:
    """Mixed into PostgresStore."""

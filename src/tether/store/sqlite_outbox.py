"""The transactions (a step's business writes committed with its checkpoint) and the outbox
(messages committed with a checkpoint, delivered by key): the operations of the Sqlite backend,
mixed into SqliteStore.

SQL in sql/sqlite/. It must not import tether.core.
"""

from __future__ import annotations


class SqliteOutbox:
    """Mixed into SqliteStore."""

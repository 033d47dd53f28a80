"""The transactions (a step's business writes committed with its checkpoint) and the outbox
(messages committed with a checkpoint, delivered by key): the operations of the Memory backend,
mixed into MemoryStore.

It must not import tether.core.
"""

from __future__ import annotations


class MemoryOutbox:
    """Mixed into MemoryStore."""

    def _init_outbox(self) -> None:
        """Set up this mixin's state (called by MemoryStore.__init__)."""

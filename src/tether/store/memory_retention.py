"""The retention (deleting what finished long ago, in small batches), WAL checkpoints and sizes:
the operations of the Memory backend, mixed into MemoryStore.

It must not import tether.core.
"""

from __future__ import annotations


class MemoryRetention:
    """Mixed into MemoryStore."""

    def _init_retention(self) -> None:
        """Set up this mixin's state (called by MemoryStore.__init__)."""

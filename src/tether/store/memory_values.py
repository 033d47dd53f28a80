"""The values a run publishes for callers, and forks (a new run from another's history): the
operations of the Memory backend, mixed into MemoryStore.

It must not import tether.core.
"""

from __future__ import annotations


class MemoryValues:
    """Mixed into MemoryStore."""

    def _init_values(self) -> None:
        """Set up this mixin's state (called by MemoryStore.__init__)."""

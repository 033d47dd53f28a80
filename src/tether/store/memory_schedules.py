"""The schedules (one run per cron slot, a cursor per schedule) and runs started at a later time:
the operations of the Memory backend, mixed into MemoryStore.

It must not import tether.core.
"""

from __future__ import annotations


class MemorySchedules:
    """Mixed into MemoryStore."""

    def _init_schedules(self) -> None:
        """Set up this mixin's state (called by MemoryStore.__init__)."""

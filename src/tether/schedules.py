"""Schedules: `@app.schedule("cron expr", tz=...)` starts one run per slot, and
`app.start_at(when, ...)` starts a run later; the worker service that starts due slots.

It must not import a backend, the server or the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tether.core.engine import Engine


class ScheduleMixin:
    """The App's schedule methods (App inherits them)."""

    engine: Engine

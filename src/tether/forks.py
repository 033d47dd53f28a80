"""Forks and time travel: `app.fork(run_id, from_step=...)` starts a new run that reuses the
recorded checkpoints before that step and executes the rest under the current code.

It must not import a backend, the server or the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tether.core.engine import Engine


class ForkMixin:
    """The App's fork methods (App inherits them)."""

    engine: Engine

"""Retention: how long finished runs, their checkpoints, stream chunks and audit trails are
kept, the worker service that deletes what is older in small batches (and checkpoints the
SQLite WAL), `app.gc()` to do it by hand and `app.storage_status()` for sizes.

It must not import a backend, the server or the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.core.engine import Engine


class Retention:
    """How long finished things are kept (placeholder, being built)."""


class RetentionMixin:
    """The App's retention methods (App inherits them)."""

    engine: Engine

    def _init_retention(self, retention: Any) -> None:
        """Called by App.__init__ with its `retention=`."""

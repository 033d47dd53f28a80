"""Transactions and the outbox: `@app.transaction()` steps whose business writes commit with
their checkpoint, `tether.outbox(destination, payload)` messages committed with the current
checkpoint, and the worker service that delivers them by key through pluggable senders.

It must not import a backend, the server or the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.core.engine import Engine


class Sender:
    """Delivers outbox messages to one kind of destination (placeholder, being built)."""


class OutboxMixin:
    """The App's transaction and outbox methods (App inherits them)."""

    engine: Engine

    def _init_outbox(self, senders: Mapping[str, Any] | None) -> None:
        """Called by App.__init__ with its `senders=`."""


def outbox(destination: str, payload: object) -> None:
    """Record an outgoing message with the current checkpoint (placeholder, being built)."""
    raise NotImplementedError

"""Values a run publishes for its callers: `tether.set_value(key, value)` in a workflow, and
`app.get_value(run_id, key, wait=...)` outside, read from the store without replay.

It must not import a backend, the server or the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tether.core.engine import Engine


class ValuesMixin:
    """The App's value methods (App inherits them)."""

    engine: Engine


def set_value(key: str, value: object) -> None:
    """Publish a value for callers (placeholder, being built)."""
    raise NotImplementedError

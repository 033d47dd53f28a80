"""Tether's tables by name: which hold a run's rows (in the order a purge deletes them), and
the check that a name is Tether's (the only identifier ever put into SQL text).
"""

from __future__ import annotations

import re

# The tables a run's rows live in, in the order a purge deletes them (the run row goes last).
# tether_streams is PostgreSQL's counter of each stream's next offset.
RUN_TABLES = (
    "tether_checkpoints",
    "tether_events",
    "tether_stream_entries",
    "tether_streams",
    "tether_values",
    "tether_forks",
    "tether_outbox",
)

_TABLE_NAME = re.compile(r"tether_[a-z0-9_]{1,60}")


def table_name(name: str) -> str:
    """`name` if it is the name of a Tether table (tether_ and lower-case letters, digits and
    _): the only identifiers ever put into SQL text (row counts per table)."""
    if not _TABLE_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not the name of a Tether table")
    return name

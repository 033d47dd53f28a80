"""The Store port's records for retention policies' store-side records and size reports: plain
data, no I/O.

It must not import tether.store.base (which builds on it), tether.core or any backend.
"""

from __future__ import annotations

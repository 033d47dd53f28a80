"""The Store port's records for the outbox's message records and the pure rules of delivery state:
plain data, no I/O.

It must not import tether.store.base (which builds on it), tether.core or any backend.
"""

from __future__ import annotations

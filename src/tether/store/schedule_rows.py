"""The Store port's records for schedule cursors and slot records: plain data, no I/O.

It must not import tether.store.base (which builds on it), tether.core or any backend.
"""

from __future__ import annotations

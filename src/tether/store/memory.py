"""MemoryStore: the SQLite store on a private temporary file, for fast tests and tether.testing.

There is no hand-written in-memory backend to keep in step with the databases: the answers are
SQLite's own, fencing, ordering and edge cases alike. The file (synchronous=OFF: nothing needs
to survive the machine) lives as long as the object, across close() and open() again, and is
removed with it; it opens on first use. It must not import tether.core.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from dataclasses import replace
from pathlib import Path

from tether.store.port.maintenance import StorageSizes
from tether.store.sqlite import SqliteStore


class MemoryStore(SqliteStore):
    """A Store of one's own: a SQLite file in a temporary folder, gone with the object."""

    def __init__(self) -> None:
        folder = tempfile.mkdtemp(prefix="tether-memory-")
        weakref.finalize(self, shutil.rmtree, folder, True)
        super().__init__(f"sqlite:///{Path(folder) / 'tether.db'}?synchronous=OFF", auto_open=True)
        self.url = "memory://"

    def another(self) -> None:
        return None  # one process, one object: no second handle for a keepalive thread

    async def storage_sizes(self) -> StorageSizes:
        return replace(await super().storage_sizes(), backend="memory")  # its URL's kind

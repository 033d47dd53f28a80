"""A recording SQLite VFS for the power-loss tests (apsw, a test-only dependency), and the disk
images a power cut would leave.

`RecordingVFS` inherits the operating system's VFS (real files, real shared memory for WAL, so
SQLite runs exactly as it does in production) and logs, in one ordered `Journal`, every write,
truncate, sync and delete of the files SQLite opens through it (the database, its -wal and its
-journal). The journal also takes marks of the caller's own (a transaction began or ended, a
caller was told its write was done), so that a position in the journal is a moment of the
workload.

`power_cuts` replays the journal once and, at each position asked for, gives the content every
file would have after a power cut there: what was written before the file's last sync survives,
what was written since is lost. With `torn`, a random part of the unsynced writes survives too
(the disk wrote some of its cache back, in any order), which is the harsher model SQLite's own
crash tests use. Deletes are taken as durable at once, and the -shm file is never kept: it is
rebuilt from the WAL when the database is opened again, as after a real reboot.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import apsw

# Journal entries are tuples, first the kind: ("write", file, offset, data), ("truncate", file,
# size), ("sync", file), ("delete", file), or a mark: (kind, *anything) for any other kind.
Entry = tuple[Any, ...]
FILE_OPS = frozenset({"write", "truncate", "sync", "delete"})


@dataclass(repr=False)
class Journal:
    """The ordered log of file operations and marks; a position is an index into `entries`."""

    entries: list[Entry] = field(default_factory=list)
    syncs: int = 0

    def __repr__(self) -> str:  # the entries hold megabytes: keep assertion messages short
        return f"<Journal of {len(self.entries)} entries, {self.syncs} syncs>"

    def add(self, entry: Entry) -> int:
        self.entries.append(entry)
        if entry[0] == "sync":
            self.syncs += 1
        return len(self.entries)

    def mark(self, kind: str, *data: object) -> int:
        """Note a moment of the workload; returns the position just after it."""
        return self.add((kind, *data))

    def positions(self, kind: str) -> list[int]:
        """The positions just after each entry of this kind: where a cut would follow it."""
        return [i + 1 for i, e in enumerate(self.entries) if e[0] == kind]


_NAMES = count()


class RecordingVFS(apsw.VFS):
    """The default VFS, with every change to a file's content noted in `journal`. Register one
    per test (its name is unique) and `unregister()` it after."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.vfs_name = f"tether-power-loss-{next(_NAMES)}"
        super().__init__(self.vfs_name, base="")

    def xOpen(self, name: Any, flags: list[int]) -> apsw.VFSFile:
        return RecordingFile(self.journal, name, flags)

    def xDelete(self, filename: str, syncdir: bool) -> None:
        self.journal.add(("delete", filename))
        super().xDelete(filename, syncdir)


class RecordingFile(apsw.VFSFile):
    def __init__(self, journal: Journal, name: Any, flags: list[int]) -> None:
        self.journal = journal
        self.path = name.filename() if isinstance(name, apsw.URIFilename) else str(name)
        super().__init__("", name, flags)

    def xWrite(self, data: bytes, offset: int) -> None:
        self.journal.add(("write", self.path, offset, bytes(data)))
        super().xWrite(data, offset)

    def xTruncate(self, newsize: int) -> None:
        self.journal.add(("truncate", self.path, newsize))
        super().xTruncate(newsize)

    def xSync(self, flags: int) -> None:
        super().xSync(flags)
        self.journal.add(("sync", self.path))  # durable once the sync has returned


def _apply(image: bytearray, op: Entry) -> None:
    if op[0] == "write":
        _, _, offset, data = op
        end = offset + len(data)
        if len(image) < offset:
            image.extend(bytes(offset - len(image)))
        image[offset:end] = data
    else:  # truncate
        size = op[2]
        if len(image) > size:
            del image[size:]
        else:
            image.extend(bytes(size - len(image)))


@dataclass
class _File:
    durable: bytearray | None = None  # None: the file would not exist after a cut
    pending: list[Entry] = field(default_factory=list)  # written since the last sync


def power_cuts(
    journal: Journal, positions: Iterable[int], *, torn: random.Random | None = None
) -> Iterator[tuple[int, dict[str, bytes]]]:
    """(position, {path: content}) for each position (ascending): the files a power cut just
    before entry `position` would leave. Replays the journal once."""
    files: dict[str, _File] = {}
    entries = journal.entries
    done = 0
    for position in sorted(set(positions)):
        for entry in entries[done:position]:
            kind = entry[0]
            if kind not in FILE_OPS:
                continue
            f = files.setdefault(entry[1], _File())
            if kind == "sync":
                f.durable = bytearray() if f.durable is None else f.durable
                for op in f.pending:
                    _apply(f.durable, op)
                f.pending.clear()
            elif kind == "delete":
                files[entry[1]] = _File()
            else:
                f.pending.append(entry)
        done = max(done, position)
        yield position, _images(files, torn)


def _images(files: dict[str, _File], torn: random.Random | None) -> dict[str, bytes]:
    out = {}
    for path, f in files.items():
        kept = [op for op in f.pending if torn is not None and torn.random() < 0.5]
        if f.durable is None and not kept:
            continue
        image = bytearray() if f.durable is None else bytearray(f.durable)
        for op in kept:
            _apply(image, op)
        out[path] = bytes(image)
    return out


def lay_out(images: dict[str, bytes], original: Path, into: Path) -> Path:
    """Write the images of the database `original` (and its -wal, -journal) into the folder
    `into`, emptied first; returns the path of the database there."""
    into.mkdir(parents=True, exist_ok=True)
    for old in into.iterdir():
        old.unlink()
    target = into / original.name
    for path, content in images.items():
        name = Path(path).name
        if not name.startswith(original.name) or name.endswith("-shm"):
            continue
        (into / name).write_bytes(content)
    return target

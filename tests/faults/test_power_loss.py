"""Power loss under Tether's SQLite store: at every sync point of a workload, the files are cut
back to what was synced (tests/faults/vfs.py), the database is opened again, and it must be
intact, hold a committed state, and lack no acknowledged checkpoint.

The workload (power_loss.workload) is Tether's SqliteStore and CommitQueue, unchanged, on apsw
connections through a recording VFS, with the PRAGMAs the store sets itself (WAL,
synchronous=FULL). A cut is taken after every sync SQLite asked for and after every
acknowledgement the workload received. With synchronous=OFF the same harness must see
acknowledged checkpoints vanish: that is what makes its zero under FULL mean something.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import apsw
import pytest
from tests.faults import figures
from tests.faults.power_loss import (
    Book,
    Tracker,
    Transactions,
    Verdict,
    apsw_store,
    check_cut,
    workload,
)
from tests.faults.vfs import Journal, RecordingVFS, lay_out, power_cuts

pytestmark = pytest.mark.timeout(180)


@dataclass
class Recording:
    journal: Journal
    book: Book
    tracker: Tracker
    db: Path
    pragmas: tuple[object, object]


async def record(tmp_path: Path, synchronous: str) -> Recording:
    """Run the workload once on the recording VFS."""
    journal = Journal()
    vfs = RecordingVFS(journal)
    tracker = Tracker(journal)
    book = Book(journal)
    db = tmp_path / "live" / "tether.db"
    try:
        store = apsw_store(db, synchronous, vfs, tracker)
        await store.open()
        inline = store.driver.queue._inline  # an ApswConnection: what the store's own _connect set
        assert inline is not None
        pragmas = (inline.execute("PRAGMA journal_mode").fetchone()[0],
                   inline.execute("PRAGMA synchronous").fetchone()[0])  # fmt: skip
        await workload(store, book)
    finally:
        vfs.unregister()
    return Recording(journal, book, tracker, db, pragmas)


@dataclass
class Tally:
    cuts: int = 0
    corrupt: list[int] = field(default_factory=list)
    not_committed: list[str] = field(default_factory=list)  # states no commit ever left
    torn: list[str] = field(default_factory=list)
    lost: Counter[int] = field(default_factory=Counter)  # cut position -> acked writes missing
    lost_checkpoints: Counter[int] = field(default_factory=Counter)
    worst: str = ""


def cut_everywhere(rec: Recording, scratch: Path, *, exact: bool,
                   torn: random.Random | None = None) -> Tally:  # fmt: skip
    """Cut after every sync and every acknowledgement; open and judge what is left."""
    positions = {*rec.journal.positions("sync"), *rec.journal.positions("ack"),
                 len(rec.journal.entries)}  # fmt: skip
    transactions = Transactions(rec.journal)
    tally = Tally()
    for position, images in power_cuts(rec.journal, positions, torn=torn):
        path = lay_out(images, rec.db, scratch)
        verdict = check_cut(path, position, rec.book, rec.tracker, transactions, exact=exact)
        tally.cuts += 1
        if verdict.corrupt:
            tally.corrupt.append(position)
            continue
        if verdict.state not in verdict.allowed:
            tally.not_committed.append(
                f"cut at {position}: state {verdict.state}, allowed {verdict.allowed}"
            )
        tally.torn += [f"cut at {position}: {t}" for t in verdict.torn]
        if verdict.lost:
            tally.lost[position] = len(verdict.lost)
            tally.lost_checkpoints[position] = sum(x.startswith("checkpoint") for x in verdict.lost)
            if not tally.worst:
                tally.worst = f"cut at {position}: lost {verdict.lost[:5]}"
    return tally


def _db_syncs_between_acks(rec: Recording) -> int:
    """Syncs of the database file itself (a WAL checkpoint) while the workload ran."""
    acks = rec.journal.positions("ack")
    return sum(
        1
        for i, entry in enumerate(rec.journal.entries)
        if entry[0] == "sync" and entry[1] == str(rec.db) and acks[0] < i < acks[-1]
    )


async def test_no_acknowledged_checkpoint_is_lost_and_no_database_is_corrupt_at_any_sync_point(
    tmp_path: Path,
) -> None:
    rec = await record(tmp_path, "FULL")
    # The store ran as in production, and the workload did what it is meant to.
    assert rec.pragmas == ("wal", 2)  # synchronous=FULL
    assert max(rec.tracker.batch_sizes) >= 6, "no group commit of all runs' checkpoints"
    assert 1 in rec.tracker.batch_sizes, "no lone checkpoint in its implicit transaction"
    assert _db_syncs_between_acks(rec) >= 1, "the WAL was never checkpointed mid-workload"
    assert rec.book.acknowledged(len(rec.journal.entries)) >= 100

    tally = cut_everywhere(rec, tmp_path / "cut", exact=True)

    syncs = len(rec.journal.positions("sync"))
    figures.record("power loss (synchronous=FULL): sync points tried", syncs)
    figures.record("power loss (synchronous=FULL): cuts checked", tally.cuts)
    figures.record("power loss (synchronous=FULL): acknowledged checkpoints lost",
                   sum(tally.lost_checkpoints.values()))  # fmt: skip
    figures.record("power loss (synchronous=FULL): corrupt databases", len(tally.corrupt))
    figures.record("power loss (synchronous=FULL): torn rows or uncommitted states",
                   len(tally.torn) + len(tally.not_committed))  # fmt: skip
    assert syncs >= 80
    assert tally.corrupt == []
    assert tally.worst == ""
    assert tally.torn == []
    assert tally.not_committed == []


async def test_a_random_part_of_the_unsynced_writes_surviving_loses_nothing_acknowledged(
    tmp_path: Path,
) -> None:
    """The harsher model: the disk wrote back some of its cache, in any order (two seeds)."""
    rec = await record(tmp_path, "FULL")
    for seed in (1, 2):
        tally = cut_everywhere(rec, tmp_path / "cut", exact=True, torn=random.Random(seed))
        figures.record("power loss, torn writes (FULL): cuts checked", tally.cuts)
        figures.record("power loss, torn writes (FULL): acknowledged checkpoints lost",
                       sum(tally.lost_checkpoints.values()))  # fmt: skip
        figures.record("power loss, torn writes (FULL): corrupt databases", len(tally.corrupt))
        assert tally.corrupt == []
        assert tally.worst == ""
        assert tally.torn == []
        assert tally.not_committed == []


async def test_the_harness_sees_acknowledged_checkpoints_vanish_when_sqlite_never_syncs(
    tmp_path: Path,
) -> None:
    """synchronous=OFF: the store acknowledges writes that were never synced, so a power cut
    loses them. The harness must see it, or its zero under FULL would prove nothing."""
    rec = await record(tmp_path, "OFF")
    assert rec.pragmas == ("wal", 0)
    tally = cut_everywhere(rec, tmp_path / "cut", exact=False)
    worst = max(tally.lost_checkpoints.values(), default=0)
    figures.record("power loss (synchronous=OFF, harness check): cuts losing acknowledged "
                   "checkpoints", len(tally.lost_checkpoints))  # fmt: skip
    figures.record("power loss (synchronous=OFF, harness check): most acknowledged "
                   "checkpoints lost by one cut", worst)  # fmt: skip
    assert worst >= 50, tally.worst
    assert tally.torn == []


async def test_synchronous_normal_loses_recent_commits_but_never_corrupts(
    tmp_path: Path,
) -> None:
    """synchronous=NORMAL (WAL synced only at checkpoints) is what SQLite documents: recent
    commits may be lost, the database stays intact and holds an earlier committed state."""
    rec = await record(tmp_path, "NORMAL")
    assert rec.pragmas == ("wal", 1)
    tally = cut_everywhere(rec, tmp_path / "cut", exact=False)
    figures.record("power loss (synchronous=NORMAL): cuts losing acknowledged checkpoints",
                   len(tally.lost_checkpoints))  # fmt: skip
    figures.record("power loss (synchronous=NORMAL): corrupt databases", len(tally.corrupt))
    assert tally.corrupt == []
    assert tally.not_committed == []
    assert tally.torn == []


async def test_the_checker_flags_a_damaged_page_a_changed_row_and_a_missing_row(
    tmp_path: Path,
) -> None:
    """The verdicts can fail: damage the final database three ways and look."""
    rec = await record(tmp_path, "FULL")
    end = len(rec.journal.entries)
    transactions = Transactions(rec.journal)
    ((_, images),) = list(power_cuts(rec.journal, [end]))
    assert set(map(Path, images)) == {rec.db}  # closed: the WAL was checkpointed and removed
    content = bytearray(images[str(rec.db)])

    def judge(data: bytes, sql: str = "") -> Verdict:
        path = lay_out({str(rec.db): data}, rec.db, tmp_path / "damaged")
        if sql:
            db = apsw.Connection(str(path))
            db.execute(sql)
            db.close()
        return check_cut(path, end, rec.book, rec.tracker, transactions, exact=True)

    intact = judge(bytes(content))
    assert not intact.corrupt
    assert not intact.lost
    assert not intact.torn
    db = apsw.Connection(str(lay_out(images, rec.db, tmp_path / "pages")))
    ((root,),) = db.execute(
        "SELECT rootpage FROM sqlite_master WHERE name = 'tether_checkpoints'"
    ).fetchall()
    ((page_size,),) = db.execute("PRAGMA page_size").fetchall()
    db.close()
    damaged = bytearray(content)
    start = (root - 1) * page_size
    damaged[start : start + 8] = b"\x0d\xff\xff\xff\xff\xff\xff\xff"  # its page header
    assert judge(bytes(damaged)).corrupt
    changed = judge(bytes(content), "UPDATE tether_checkpoints SET result = '\"x\"' "
                                    "WHERE run_id = 'run-1' AND seq = 3")  # fmt: skip
    assert changed.torn
    assert changed.state is None
    missing = judge(bytes(content), "DELETE FROM tether_checkpoints WHERE run_id = 'run-2'")
    assert len(missing.lost) >= 10

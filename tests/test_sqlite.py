"""SQLite specifics: durability settings, group commit, and waiting for a lock held elsewhere
without blocking the event loop."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

import tether
from tether.store.drivers.sqlite import parse_sqlite_url
from tether.store.port import NewRun
from tether.store.sqlite import SqliteStore


@pytest.mark.serial  # counts the loop's 10 ms ticks in 0.3 s: it needs the CPU then
async def test_a_write_waits_for_a_lock_held_by_another_connection_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path}/t.db")
    await store.open()
    other = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    loop = asyncio.get_running_loop()
    loop.call_later(0.3, other.execute, "COMMIT")
    started = time.monotonic()
    record, created = await store.create_run(NewRun("r1", "wf", "{}"), 1.0)
    waited = time.monotonic() - started
    task.cancel()
    other.close()
    await store.close()
    assert created
    assert record.id == "r1"
    assert waited >= 0.25  # it did wait for the lock...
    assert ticks >= 10  # ...while the loop kept running


async def test_concurrent_checkpoints_of_many_runs_share_commits(tmp_path: Path) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/g.db")
    commits = 0
    store = app.engine.store
    assert isinstance(store, SqliteStore)
    original = store.driver.queue._execute

    def counting(conn: sqlite3.Connection, batch: list) -> None:  # type: ignore[type-arg]
        nonlocal commits
        commits += 1
        original(conn, batch)

    store.driver.queue._execute = counting  # type: ignore[method-assign]

    @app.step()
    async def inc(x: int) -> int:
        return x + 1

    @app.workflow()
    async def ten(x: int) -> int:
        for _ in range(10):
            x = await inc(x)
        return x

    async with app:
        handles = await asyncio.gather(*(app.start(ten, i) for i in range(100)))
        assert [await h.result(timeout=30) for h in handles] == [i + 10 for i in range(100)]
    # 100 runs x (create + 10 checkpoints + finish) = 1,200 writes; group commit shares them.
    assert commits < 200, commits


def test_durability_defaults_to_wal_and_synchronous_full(tmp_path: Path) -> None:
    assert parse_sqlite_url(f"sqlite:///{tmp_path}/a.db") == (f"{tmp_path}/a.db", "FULL")
    assert parse_sqlite_url("sqlite:///rel.db?synchronous=off") == ("rel.db", "OFF")

    async def pragmas() -> tuple[str, int]:
        store = SqliteStore(f"sqlite:///{tmp_path}/a.db")
        await store.open()
        inline = store.driver.queue._inline
        assert inline is not None
        mode = inline.execute("PRAGMA journal_mode").fetchone()[0]
        sync = inline.execute("PRAGMA synchronous").fetchone()[0]
        await store.close()
        return mode, sync

    assert asyncio.run(pragmas()) == ("wal", 2)  # 2 is FULL


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://", "names no file"),
        ("sqlite:///x.db?synchronous=sometimes", "synchronous='SOMETIMES'"),
        ("mysql://x", "unknown database URL"),
    ],
)
def test_a_bad_database_url_is_refused_with_what_to_write(url: str, message: str) -> None:
    with pytest.raises(tether.ConfigurationError, match=message):
        tether.App(url)


def _open_at_the_barrier(path: str, barrier: Any) -> None:
    async def go() -> None:
        store = SqliteStore(f"sqlite:///{path}")
        barrier.wait()
        await store.open()
        await store.close()

    asyncio.run(go())


def test_processes_opening_one_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    """Four processes open a database file that does not exist yet, at the same moment, ten
    times: one creates the schema while the others wait for it. None may fail with "database
    is locked" (a setting that needs the write lock was once set on a connection that never
    waits for it)."""
    context = multiprocessing.get_context("fork")
    failed = 0
    for round_ in range(10):
        path = str(tmp_path / f"new-{round_}.db")
        barrier = context.Barrier(4)
        workers = [context.Process(target=_open_at_the_barrier, args=(path, barrier))
                   for _ in range(4)]  # fmt: skip
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        failed += sum(worker.exitcode != 0 for worker in workers)
    assert failed == 0


def test_a_file_on_a_network_filesystem_is_told_apart_from_a_local_one(tmp_path: Path) -> None:
    from tether.store.drivers.sqlite import network_filesystem

    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/sda1 / ext4 rw 0 0\n"
        "server:/export /mnt/shared nfs4 rw 0 0\n"
        "//nas/share /mnt/shared/smb cifs rw 0 0\n"
    )
    assert network_filesystem("/srv/app/tether.db", str(mounts)) is None
    assert network_filesystem("/mnt/shared/app/tether.db", str(mounts)) == "nfs4"
    assert network_filesystem("/mnt/shared/smb/tether.db", str(mounts)) == "cifs"
    assert network_filesystem("/mnt/sharedother/tether.db", str(mounts)) is None
    assert network_filesystem("/x.db", str(tmp_path / "missing")) is None


@pytest.mark.parametrize("umask", [0o022, 0o000, 0o277])
async def test_a_new_database_and_its_wal_and_shm_are_private_whatever_the_umask(
    tmp_path: Path, umask: int
) -> None:
    import os
    import stat

    path = tmp_path / "new.db"
    old = os.umask(umask)
    try:
        store = SqliteStore(f"sqlite:///{path}")
        await store.open()
        await store.create_run(NewRun("r1", "wf", "{}"), 1.0)  # the -wal and -shm now exist
        files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
        modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in files}
        await store.close()
    finally:
        os.umask(old)
    assert modes == {"new.db": 0o600, "new.db-wal": 0o600, "new.db-shm": 0o600}


async def test_an_existing_database_keeps_its_mode_and_a_readable_one_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import os
    import stat

    path = tmp_path / "shared.db"
    sqlite3.connect(path).close()
    os.chmod(path, 0o640)  # shared with a group on purpose
    store = SqliteStore(f"sqlite:///{path}")
    with caplog.at_level("WARNING", logger="tether.store"):
        await store.open()
        await store.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert "mode 0o640" in caplog.text
    assert "chmod 600" in caplog.text

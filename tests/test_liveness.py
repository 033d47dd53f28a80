"""Which workers are known dead: a pid is judged only inside the boot and PID namespace it was
registered in, so containers sharing a host name never release each other's live runs; and a
live worker whose row was deleted registers again."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from datetime import timedelta

import tether
from tether.core.lease import boot_id, dead_here, gone, pid_namespace, this_worker
from tether.store.memory import MemoryStore
from tether.store.port import NewRun, RunStatus, WorkerInfo


def a_dead_pid() -> int:
    """The pid of a process that has exited and was reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_this_process_knows_its_boot_and_pid_namespace() -> None:
    me = this_worker(0.0)
    assert me.boot_id == boot_id() != ""
    assert me.pid_ns == pid_namespace() != ""
    assert not dead_here(me)


def test_a_dead_process_here_is_dead_and_one_in_another_namespace_is_not_judged() -> None:
    here = dataclasses.replace(this_worker(0.0), id="w-dead", pid=a_dead_pid(), pid_token="")
    assert dead_here(here)
    # The same host name and pid in another container (its own PID namespace): its pid means
    # nothing to this process, so it is never taken for dead.
    container = dataclasses.replace(here, pid_ns="pid:[4026532999]")
    assert not dead_here(container)
    rebooted = dataclasses.replace(here, boot_id="another-boot")
    assert not dead_here(rebooted)
    older = dataclasses.replace(here, boot_id="", pid_ns="")  # a worker of an older version
    assert not dead_here(older)


def test_a_worker_is_gone_when_its_row_is_gone_or_it_died_here() -> None:
    dead = dataclasses.replace(this_worker(0.0), id="w-dead", pid=a_dead_pid(), pid_token="")
    alive = this_worker(0.0)
    far = WorkerInfo("w-far", "elsewhere", 1, "t", boot_id="b", pid_ns="pid:[1]")
    assert gone("w-missing", [alive])
    assert gone("w-dead", [dead, alive])
    assert not gone(alive.id, [dead, alive])
    assert not gone("w-far", [far])  # another machine: judged by its lease, never its pid


async def test_recovery_on_start_leaves_a_live_container_neighbours_runs_alone() -> None:
    store = MemoryStore()
    app = tether.App(store=store)

    @app.workflow()
    async def flow() -> str:
        return "done"

    me = this_worker(0.0)
    neighbour = dataclasses.replace(me, id=f"{me.host}:{me.pid}:other", pid=a_dead_pid(),
                                    pid_token="", pid_ns="pid:[4026532999]")  # fmt: skip
    dead = dataclasses.replace(neighbour, id=f"{me.host}:dead", pid_ns=me.pid_ns)
    now = app.engine.clock.now()
    for worker, run_id in ((neighbour, "theirs"), (dead, "orphan")):
        await store.register_worker(worker, now)
        await store.create_run(NewRun(run_id, "flow", '{"args": [], "kwargs": {}}'), now,
                               owner=worker.id, lease_until=now + 3600)  # fmt: skip
    async with app:
        assert await (await app.get("orphan")).result(timeout=10) == "done"
        theirs = await store.get_run("theirs")
    assert theirs is not None
    assert (theirs.status, theirs.owner) == (RunStatus.RUNNING, neighbour.id)  # left alone
    assert [w.id for w in await store.list_workers()] == [neighbour.id]


async def test_a_live_worker_whose_row_was_deleted_registers_again() -> None:
    store = MemoryStore()
    app = tether.App(store=store, lease_duration=timedelta(seconds=0.3))
    async with app:
        worker_id = app.worker_id
        assert worker_id is not None
        await store.release_worker(worker_id, app.engine.clock.now())  # taken for dead
        assert worker_id not in [w.id for w in await store.list_workers()]
        async with asyncio.timeout(5):
            while worker_id not in [w.id for w in await store.list_workers()]:
                await asyncio.sleep(0.02)

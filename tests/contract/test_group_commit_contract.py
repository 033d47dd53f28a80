"""Writes of many runs at once, as the group commit shares one transaction among them: each is
fenced by its own lease, so one whose lease is lost fails alone and the others commit whole,
single statements and multi-statement writes alike. Run once per backend (see conftest).
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from tests.contract.test_store_contract import LEASE, NOW, WF, checkpoint, lease_of, new

from tether.errors import LeaseLost
from tether.store.port import Lease, RunStatus, Store


async def claimed(store: Store, run_id: str) -> Lease:
    await store.create_run(new(run_id), NOW)
    (run,) = await store.claim_runs(f"w-{run_id}", [WF], NOW, NOW + LEASE, 1)
    return lease_of(run)


async def test_a_lost_lease_among_writes_of_other_runs_fails_that_write_alone(
    store: Store,
) -> None:
    good = [await claimed(store, f"g{i}") for i in range(4)]
    lost = await claimed(store, "lost")
    stale = dataclasses.replace(lost, epoch=lost.epoch - 1)
    suspended = await claimed(store, "suspended")
    finished = await claimed(store, "finished")
    writes = [store.write_checkpoint(lease, checkpoint(seq), NOW + 1)
              for lease in good for seq in range(5)]  # fmt: skip
    writes += [
        store.write_checkpoint(stale, checkpoint(0), NOW + 1),
        store.suspend_run(dataclasses.replace(suspended, epoch=99), NOW + 50, NOW + 1),
        store.finish_run(finished, RunStatus.SUCCEEDED, "7", None, NOW + 1),
        store.suspend_run(suspended, NOW + 60, NOW + 1, ["go"]),
    ]
    outcomes = await asyncio.gather(*writes, return_exceptions=True)
    failed = [i for i, o in enumerate(outcomes) if isinstance(o, BaseException)]
    assert failed == [20, 21]  # the stale checkpoint and the stale suspension only
    assert all(isinstance(outcomes[i], LeaseLost) for i in failed)
    for lease in good:
        assert [cp.seq for cp in await store.load_history(lease.run_id)] == list(range(5))
    assert await store.load_history("lost") == []
    run = await store.get_run("suspended")
    assert run is not None
    assert (run.status, run.wake_at, run.wake_on) == (RunStatus.WAITING, NOW + 60, ("go",))
    done = await store.get_run("finished")
    assert done is not None
    assert (done.status, done.result) == (RunStatus.SUCCEEDED, "7")


@pytest.mark.parametrize("rounds", [3])
async def test_concurrent_writes_of_one_run_at_distinct_positions_all_commit(
    store: Store, rounds: int
) -> None:
    lease = await claimed(store, "fan")
    for r in range(rounds):  # as gather of steps in one workflow writes them
        seqs = range(r * 10, r * 10 + 10)
        await asyncio.gather(*(store.write_checkpoint(lease, checkpoint(s, f"s{s}"), NOW + 1)
                               for s in seqs))  # fmt: skip
    history = await store.load_history("fan")
    assert [(cp.seq, cp.name) for cp in history] == [(s, f"s{s}") for s in range(rounds * 10)]

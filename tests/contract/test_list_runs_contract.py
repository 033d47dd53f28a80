"""The Store contract for the runs explorer's listing, run once per backend: list_runs filters by
status, workflow, queue, version, starter, creation time and id prefix, alone and together; its
keyset pages cover every run once across ties on created_at, several statuses included; the
id search is a literal prefix (LIKE's `%` and `_` are plain characters), up to the last code
point.

Same rules as test_store_contract: times are plain floats chosen by each test, nothing sleeps.
"""

from __future__ import annotations

from tests.contract.test_store_contract import LEASE, NOW, WF, lease_of

from tether.store.port import NewRun, RunRecord, RunStatus, Store


async def make(
    store: Store,
    run_id: str,
    at: float,
    *,
    workflow: str = WF,
    queue: str | None = None,
    started_by: str | None = None,
    version: str | None = None,
) -> None:
    """A run created at `at`; with a version, created claimed by a worker of that version."""
    run = NewRun(run_id, workflow, "{}", queue=queue, started_by=started_by)
    if version is None:
        await store.create_run(run, at)
    else:
        await store.create_run(run, at, owner="w1", lease_until=at + LEASE, version=version)


def ids(runs: list[RunRecord]) -> list[str]:
    return [r.id for r in runs]


async def every_page(store: Store, limit: int, **filters: object) -> list[list[str]]:
    """The pages of a listing, each after the last run of the one before, until one is short."""
    pages: list[list[str]] = []
    before: tuple[float, str] | None = None
    while True:
        page = await store.list_runs(limit=limit, before=before, **filters)  # type: ignore[arg-type]
        pages.append(ids(page))
        if len(page) < limit:
            return pages
        before = (page[-1].created_at, page[-1].id)


async def fleet(store: Store) -> None:
    """Six runs over three queues, two versions, two starters and two workflows."""
    await make(store, "a", NOW, queue="mail", started_by="alice")
    await make(store, "b", NOW + 1, queue="mail", started_by="bob", version="v1")
    await make(store, "c", NOW + 2, queue="batch", started_by="alice", version="v2")
    await make(store, "d", NOW + 3, workflow="other", started_by="alice", version="v1")
    await make(store, "e", NOW + 4, workflow="other", queue="mail")
    await make(store, "f", NOW + 5, queue="batch", started_by="bob", version="v2")


async def test_list_runs_filters_by_queue_version_and_starter(store: Store) -> None:
    await fleet(store)
    assert ids(await store.list_runs(queue="mail")) == ["e", "b", "a"]
    assert ids(await store.list_runs(queue="batch")) == ["f", "c"]
    assert ids(await store.list_runs(version="v1")) == ["d", "b"]
    assert ids(await store.list_runs(version="v2")) == ["f", "c"]
    assert ids(await store.list_runs(started_by="alice")) == ["d", "c", "a"]
    assert ids(await store.list_runs(started_by="bob")) == ["f", "b"]
    for nothing in ({"queue": "none"}, {"version": "v9"}, {"started_by": "eve"}):
        assert await store.list_runs(**nothing) == []  # type: ignore[arg-type]


async def test_list_runs_filters_by_creation_time_from_inclusive_to_exclusive(
    store: Store,
) -> None:
    await fleet(store)
    assert ids(await store.list_runs(created_after=NOW + 2)) == ["f", "e", "d", "c"]
    assert ids(await store.list_runs(created_before=NOW + 2)) == ["b", "a"]
    window = await store.list_runs(created_after=NOW + 1, created_before=NOW + 4)
    assert ids(window) == ["d", "c", "b"]
    assert await store.list_runs(created_after=NOW + 3, created_before=NOW + 3) == []
    assert await store.list_runs(created_after=NOW + 6) == []


async def test_list_runs_combines_every_filter_with_each_other(store: Store) -> None:
    await fleet(store)
    running = [RunStatus.RUNNING]  # the runs created with a version are claimed
    assert ids(await store.list_runs(statuses=running)) == ["f", "d", "c", "b"]
    assert ids(await store.list_runs(statuses=running, queue="mail")) == ["b"]
    assert ids(await store.list_runs(statuses=[RunStatus.PENDING], queue="mail")) == ["e", "a"]
    assert ids(await store.list_runs(workflow="other", started_by="alice")) == ["d"]
    assert ids(await store.list_runs(queue="batch", version="v2", started_by="bob")) == ["f"]
    everything = await store.list_runs(
        statuses=running, workflow=WF, queue="batch", version="v2", started_by="alice",
        created_after=NOW + 2, created_before=NOW + 3, id_prefix="c",
    )  # fmt: skip
    assert ids(everything) == ["c"]
    # Each filter alone excludes it.
    for other in ({"workflow": "other"}, {"queue": "mail"}, {"version": "v1"},
                  {"started_by": "bob"}, {"created_after": NOW + 2.5}, {"id_prefix": "d"},
                  {"statuses": [RunStatus.PENDING]}):  # fmt: skip
        filters = {"statuses": running, "workflow": WF, "queue": "batch", "version": "v2",
                   "started_by": "alice", "created_after": NOW + 2,
                   "created_before": NOW + 3} | other  # fmt: skip
        assert await store.list_runs(**filters) == [], other  # type: ignore[arg-type]


async def test_list_runs_pages_cover_every_run_once_across_ties_on_created_at(
    store: Store,
) -> None:
    # 11 runs at 4 times, three or four of them at each: ties broken by id, descending.
    names = [f"r{i:02d}" for i in range(11)]
    for i, run_id in enumerate(names):
        await make(store, run_id, NOW + i // 3, queue="q" if i % 2 else None)
    expected = sorted(names, key=lambda n: (int(n[1:]) // 3, n), reverse=True)
    for limit in (1, 2, 3, 4, 10, 11, 12):
        pages = await every_page(store, limit)
        assert [run for page in pages for run in page] == expected, limit
        assert all(len(page) == limit for page in pages[:-1])
    queued = [n for n in expected if int(n[1:]) % 2]
    pages = await every_page(store, 2, queue="q")
    assert [run for page in pages for run in page] == queued


async def test_list_runs_of_several_statuses_merges_them_newest_first_and_pages(
    store: Store,
) -> None:
    for i in range(8):
        await make(store, f"p{i}", NOW + i // 2)
    claimed = await store.claim_runs("w1", [WF], NOW + 10, NOW + 10 + LEASE, 3)  # p0, p1, p2
    assert sorted(ids(claimed)) == ["p0", "p1", "p2"]
    await store.finish_run(lease_of(claimed[0]), RunStatus.FAILED, None, '{"type": "E"}', NOW + 11)
    both = [RunStatus.RUNNING, RunStatus.FAILED]
    assert ids(await store.list_runs(statuses=both)) == ["p2", "p1", "p0"]
    # Status and time ties (p2 running and p3 pending at NOW + 1) paged two by two.
    mixed = [RunStatus.PENDING, RunStatus.RUNNING, RunStatus.FAILED, RunStatus.PENDING]
    pages = await every_page(store, 2, statuses=mixed)
    assert pages == [["p7", "p6"], ["p5", "p4"], ["p3", "p2"], ["p1", "p0"], []]
    assert ids(await store.list_runs(statuses=both, limit=2)) == ["p2", "p1"]


async def test_list_runs_id_prefix_is_literal_with_like_wildcards_in_ids(store: Store) -> None:
    names = ["a%b", "a_b", "axb", "a%", "ab", "b%", "A%b", "a\\b"]
    for i, run_id in enumerate(names):
        await make(store, run_id, NOW + i)
    assert ids(await store.list_runs(id_prefix="a%")) == ["a%", "a%b"]
    assert ids(await store.list_runs(id_prefix="a_")) == ["a_b"]
    assert ids(await store.list_runs(id_prefix="a\\")) == ["a\\b"]
    assert sorted(ids(await store.list_runs(id_prefix="a"))) == sorted(
        ["a%b", "a_b", "axb", "a%", "ab", "a\\b"]
    )  # case-sensitive: not "A%b"
    assert ids(await store.list_runs(id_prefix="%")) == []
    assert ids(await store.list_runs(id_prefix="_")) == []
    assert ids(await store.list_runs(id_prefix="a%b")) == ["a%b"]  # a whole id
    assert ids(await store.list_runs(id_prefix="a%bc")) == []
    assert ids(await store.list_runs(id_prefix="")) == ids(await store.list_runs())  # no filter
    assert ids(await store.list_runs(id_prefix="a", limit=2)) == ["a\\b", "ab"]
    assert ids(await store.list_runs(id_prefix="a", created_before=NOW + 2)) == ["a_b", "a%b"]


async def test_list_runs_id_prefix_holds_at_the_ends_of_unicode(store: Store) -> None:
    top, below_surrogates, above_surrogates = "\U0010ffff", "\ud7ff", "\ue000"
    names = [f"z{top}1", f"z{top}", "z", f"{top}{top}", f"y{below_surrogates}",
             f"y{above_surrogates}", "é-1", "é"]  # fmt: skip
    for i, run_id in enumerate(names):
        await make(store, run_id, NOW + i)
    assert ids(await store.list_runs(id_prefix=f"z{top}")) == [f"z{top}", f"z{top}1"]
    assert ids(await store.list_runs(id_prefix=top)) == [f"{top}{top}"]  # nothing after it
    assert ids(await store.list_runs(id_prefix=f"{top}{top}")) == [f"{top}{top}"]
    assert ids(await store.list_runs(id_prefix=f"y{below_surrogates}")) == [f"y{below_surrogates}"]
    assert ids(await store.list_runs(id_prefix="é")) == ["é", "é-1"]

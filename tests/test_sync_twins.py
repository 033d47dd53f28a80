"""The blocking twin of the App for the calls of values, forks, start_at and schedules: each
returns what the async call returns, on a real SQLite file, without an event loop of the
caller's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import tether


def test_values_forks_and_later_starts_through_the_sync_twin(tmp_path: Path) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/sync.db")

    @app.step()
    def add(x: int, y: int) -> int:
        return x + y

    @app.workflow()
    async def total(n: int) -> int:
        acc = 0
        for i in range(n):
            acc = await add(acc, i)
            await tether.set_value("acc", acc)
        return acc

    @app.schedule("0 3 * * *", tz="Europe/Paris")
    @app.workflow()
    async def nightly(scheduled_at: datetime) -> str:
        return scheduled_at.isoformat()

    with app.sync as client:
        handle = client.start(total, 4, id="t")
        assert handle.result(timeout=10) == 6
        assert client.get_value("t", "acc") == 6
        assert client.get_value("t", "nope", default="none") == "none"
        [value] = client.list_values("t")
        assert (value.key, value.value, value.version) == ("acc", 6, 4)
        assert [(v.value, v.version) for v in client.watch_value("t", "acc", after_version=2)] == [
            (6, 4)
        ]

        fork = client.fork("t", "add#3", id="t-fork")
        assert fork.result(timeout=10) == 6
        assert [f.run_id for f in client.get("t").forks()] == ["t-fork"]
        assert fork.info().fork is not None

        later = client.start_at(datetime.now(UTC) + timedelta(hours=1), total, 2, id="later")
        assert later.status() is tether.RunStatus.WAITING
        later.cancel()
        assert later.status() is tether.RunStatus.CANCELLED

        [schedule] = client.list_schedules()
        assert schedule.name == "nightly"

        assert client.list_outbox(run_id="t") == []
        report = client.gc(dry_run=True)
        assert report.dry_run
        assert sum(report.deleted.values()) == 0  # nothing is old enough
        status = client.storage_status()
        assert status.runs["succeeded"] >= 2

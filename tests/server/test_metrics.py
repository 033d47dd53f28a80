"""/metrics: the Prometheus text format (0.0.4) behind a bearer token of group admin or metrics;
gauges that match the store at scrape time, this process's counters and step durations, valid
text for Prometheus' own parser, and no place in the OpenAPI document."""

from __future__ import annotations

import asyncio
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tests.server.kit import Person, start_approval

import tether
from tether.server import create_server
from tether.store.port import RunStatus
from tether.users import add_user

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def bearer(person: Person) -> dict[str, str]:
    return {"Authorization": f"Bearer {person.token}"}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample, parsed by prometheus_client: {(name, sorted labels): value}."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples}  # fmt: skip


async def metrics_user(app: tether.App) -> Person:
    user, token = await add_user(app.engine, "prom", frozenset({"metrics"}))
    return Person(user, token)


async def test_metrics_refuse_a_request_without_a_valid_token(
    client: httpx.AsyncClient,
) -> None:
    missing = await client.get("/metrics")
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == 'Bearer realm="tether"'
    assert missing.json() == {"detail": "a bearer token is required: Authorization: Bearer <token>"}
    wrong = await client.get("/metrics", headers={"Authorization": "Bearer tt_not-a-token"})
    assert wrong.status_code == 401
    assert wrong.headers["www-authenticate"] == 'Bearer realm="tether", error="invalid_token"'
    assert "tether_runs" not in missing.text + wrong.text


async def test_metrics_refuse_a_plain_reviewer_with_403(
    client: httpx.AsyncClient, alice: Person, outsider: Person
) -> None:
    for person in (alice, outsider):
        response = await client.get("/metrics", headers=bearer(person))
        assert response.status_code == 403
        assert response.json() == {
            "detail": "only users of group admin or metrics may read /metrics"
        }


async def test_metrics_serve_admin_and_group_metrics_gauges_that_match_the_store(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    prom = await metrics_user(app)
    talked = await app.start("talk", ["a", "b"], 0.0, id="talk-1")
    assert await talked.result(timeout=10) == 2
    asked = await start_approval(app, "ask-1")
    async with asyncio.timeout(10):
        while await (await app.get("ask-1")).status() != RunStatus.WAITING:
            await asyncio.sleep(0.01)

    before = time.time()
    responses = [await client.get("/metrics", headers=bearer(p)) for p in (admin, prom)]
    after = time.time()
    for response in responses:
        assert response.status_code == 200
        assert response.headers["content-type"] == CONTENT_TYPE
    text = responses[0].text
    assert 'tether_runs{status="succeeded"} 1.0' in text.splitlines()
    assert 'tether_runs{status="waiting"} 1.0' in text.splitlines()
    assert "tether_approvals_pending 1.0" in text.splitlines()
    for line in ("# HELP tether_runs Runs in the database by status.",
                 "# TYPE tether_runs gauge",
                 "# TYPE tether_approvals_pending gauge",
                 "# TYPE tether_approval_oldest_pending_age_seconds gauge",
                 "# TYPE tether_runs_finished_total counter",
                 "# TYPE tether_run_executions_total counter",
                 "# TYPE tether_step_attempts_total counter",
                 "# TYPE tether_step_duration_seconds histogram"):  # fmt: skip
        assert line in text.splitlines()

    found = samples(text)
    stats = await app.engine.store.stats(app.engine.clock.now())
    for status in RunStatus:
        expected = len(await app.list_runs(status=status, limit=1000))
        assert found[("tether_runs", (("status", status.value),))] == expected
        assert stats.runs[status] == expected
    assert found[("tether_approvals_pending", ())] == 1.0
    age = found[("tether_approval_oldest_pending_age_seconds", ())]
    created = asked.created_at.timestamp()
    assert before - created <= age <= after - created
    # The second scrape, by the metrics user, reads the same database.
    assert samples(responses[1].text)[("tether_runs", (("status", "succeeded"),))] == 1.0


async def test_the_counters_count_the_steps_and_runs_this_process_executed(
    app: tether.App, client: httpx.AsyncClient, admin: Person
) -> None:
    handle = await app.start("talk", ["x", "y", "z"], 0.0, id="t1")
    assert await handle.result(timeout=10) == 3
    found = samples((await client.get("/metrics", headers=bearer(admin))).text)
    assert found[("tether_runs_finished_total",
                  (("status", "succeeded"), ("workflow", "talk")))] == 1.0  # fmt: skip
    assert found[("tether_run_executions_total",
                  (("outcome", "succeeded"), ("workflow", "talk")))] == 1.0  # fmt: skip
    assert found[("tether_step_attempts_total",
                  (("outcome", "completed"), ("step", "speak")))] == 1.0  # fmt: skip
    assert found[("tether_step_duration_seconds_count", (("step", "speak"),))] == 1.0
    assert found[("tether_step_duration_seconds_bucket",
                  (("le", "+Inf"), ("step", "speak")))] == 1.0  # fmt: skip
    buckets = sorted((float(dict(labels)["le"]), value) for (name, labels), value in found.items()
                     if name == "tether_step_duration_seconds_bucket")  # fmt: skip
    assert [b for b, _ in buckets][:3] == [0.005, 0.01, 0.025]
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    assert len(buckets) == 16

    # Two more runs: the counters move by exactly their steps.
    for run_id in ("t2", "t3"):
        assert await (await app.start("talk", ["w"], 0.0, id=run_id)).result(timeout=10) == 1
    again = samples((await client.get("/metrics", headers=bearer(admin))).text)
    assert again[("tether_step_attempts_total",
                  (("outcome", "completed"), ("step", "speak")))] == 3.0  # fmt: skip
    assert again[("tether_runs_finished_total",
                  (("status", "succeeded"), ("workflow", "talk")))] == 3.0  # fmt: skip


async def test_label_values_are_escaped(tmp_path: object) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/escape.db")
    name = 'say "hi"\\now\nplease'

    @app.step(name=name)
    async def say() -> str:
        return "hi"

    @app.workflow(name=name)
    async def flow() -> str:
        return await say()

    server = create_server(app)
    async with app:
        _, token = await add_user(app.engine, "root", frozenset({"admin"}))
        await (await app.start(flow, id="e1")).result(timeout=10)
        transport = httpx.ASGITransport(app=server)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            response = await c.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    escaped = 'workflow="say \\"hi\\"\\\\now\\nplease"'
    line = f'tether_runs_finished_total{{status="succeeded",{escaped}}} 1.0'
    assert line in response.text.splitlines()
    found = samples(response.text)
    assert found[("tether_runs_finished_total",
                  (("status", "succeeded"), ("workflow", name)))] == 1.0  # fmt: skip


async def test_metrics_are_not_in_the_openapi_document(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    assert "/metrics" not in document["paths"]
    assert len(document["paths"]) == 19  # the five of the operations pages, the two of the trail
    assert all(path.startswith("/api/") for path in document["paths"])
    assert (await client.get("/metrics")).status_code == 401  # served all the same

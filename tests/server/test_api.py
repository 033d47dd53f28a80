"""The JSON API against a real SQLite file: tokens (missing, wrong, revoked), object-level
authorization (404 for what a user may not see, 403 for what they may see but not do), strict
bodies (duplicate keys, unknown fields, oversized), the decision flow and its refusals, and the
OpenAPI document listing every status an operation can return."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import tether
from tether.server import create_server
from tether.users import add_user, revoke_user


@dataclass
class Api:
    app: tether.App
    client: httpx.AsyncClient
    tokens: dict[str, str]

    def as_(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[user]}"}

    async def pending(self, run_id: str) -> tether.Approval:
        async with asyncio.timeout(10):
            while not (found := await self.app.list_approvals(run_id=run_id)):
                await asyncio.sleep(0.01)
        return found[0]


def build_app(url: str) -> tether.App:
    app = tether.App(url)

    @app.step()
    async def deploy(version: str) -> str:
        return f"deployed {version}"

    @app.workflow()
    async def release(version: str) -> str:
        decision = await tether.approval(
            "Deploy?", operation={"tool": "deploy", "arguments": {"version": version}},
            reviewers=["group:sre"], context={"password": "hunter2"},
        )  # fmt: skip
        return await deploy(version) if decision.approved else decision.status

    @app.step()
    async def speak(words: list[str]) -> int:
        for word in words:
            await tether.stream("tokens").write(word)
        return len(words)

    @app.workflow()
    async def talk(words: list[str]) -> int:
        return await speak(words)

    @app.step()
    async def count(n: int) -> int:
        return n

    @app.workflow()
    async def progress(n: int) -> int:
        for i in range(1, n + 1):
            await tether.set_value("done", {"steps": await count(i), "token": "sk-" + "a" * 24})
        return n

    return app


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    app = build_app(f"sqlite:///{tmp_path}/api.db")
    server = create_server(app, max_body=64 * 1024)
    async with app:
        tokens = {}
        for name, groups in (("alice", {"sre"}), ("bob", {"sre"}), ("eve", set()),
                             ("root", {"admin"})):  # fmt: skip
            _, tokens[name] = await add_user(app.engine, name, frozenset(groups))
        transport = httpx.ASGITransport(app=server)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            yield Api(app, client, tokens)


async def test_every_api_route_needs_a_valid_token(api: Api) -> None:
    await api.app.start("release", "1", id="r1")
    routes = [("GET", "/api/runs"), ("POST", "/api/runs"), ("GET", "/api/runs/r1"),
              ("POST", "/api/runs/r1/cancel"),
              ("POST", "/api/runs/r1/events/go"), ("GET", "/api/approvals"),
              ("GET", "/api/approvals/x"), ("POST", "/api/approvals/x/decision")]  # fmt: skip
    for headers in ({}, {"Authorization": "Bearer tt_wrong"}, {"Authorization": "Basic abc"}):
        for method, path in routes:
            response = await api.client.request(method, path, headers=headers)
            assert response.status_code == 401, (method, path, headers)
            assert response.headers["www-authenticate"].startswith('Bearer realm="tether"')
    await revoke_user(api.app.engine, "alice")
    response = await api.client.get("/api/approvals", headers=api.as_("alice"))
    assert response.status_code == 401
    assert "invalid_token" in response.headers["www-authenticate"]


async def test_a_reviewer_decides_with_the_digest_they_saw_and_the_run_completes(api: Api) -> None:
    handle = await api.app.start("release", "1.0", id="r-ok")
    ask = await api.pending("r-ok")
    listed = (await api.client.get("/api/approvals", headers=api.as_("alice"))).json()
    assert [a["id"] for a in listed] == [ask.id]
    assert listed[0]["context"] == {"password": "[redacted]"}
    shown = (await api.client.get(f"/api/approvals/{ask.id}", headers=api.as_("alice"))).json()
    assert shown["may_decide"] is True
    body = {"option": "approve", "operation_digest": shown["operation_digest"], "comment": "ok"}
    response = await api.client.post(f"/api/approvals/{ask.id}/decision", json=body,
                                     headers=api.as_("alice"))  # fmt: skip
    assert response.status_code == 200
    assert (response.json()["status"], response.json()["reviewer"]) == ("approved", "alice")
    assert await handle.result(timeout=10) == "deployed 1.0"
    events = [(e.event, e.actor) for e in await api.app.approval_history(ask.id)]
    assert events == [("created", None), ("viewed", "alice"), ("decided", "alice")]


async def test_users_outside_the_reviewers_see_nothing_of_the_approval_or_its_run(api: Api) -> None:
    await api.app.start("release", "1", id="r-idor")
    ask = await api.pending("r-idor")
    eve = api.as_("eve")
    assert (await api.client.get("/api/approvals", headers=eve)).json() == []
    assert (await api.client.get("/api/runs", headers=eve)).json() == []
    for method, path in (("GET", f"/api/approvals/{ask.id}"), ("GET", "/api/runs/r-idor"),
                         ("POST", "/api/runs/r-idor/cancel")):  # fmt: skip
        assert (await api.client.request(method, path, headers=eve)).status_code == 404
    body = {"option": "approve", "operation_digest": ask.operation_digest}
    response = await api.client.post(f"/api/approvals/{ask.id}/decision", json=body, headers=eve)
    assert response.status_code == 404
    assert (await api.app.get_approval(ask.id)).status == "pending"
    # A reviewer sees the run of an approval they may decide, but only admin acts on runs.
    assert (await api.client.get("/api/runs/r-idor", headers=api.as_("bob"))).status_code == 200
    cancel = await api.client.post("/api/runs/r-idor/cancel", headers=api.as_("bob"))
    assert cancel.status_code == 403
    event = await api.client.post("/api/runs/r-idor/events/go", json={}, headers=api.as_("bob"))
    assert event.status_code == 403
    admin_runs = (await api.client.get("/api/runs", headers=api.as_("root"))).json()
    assert [r["id"] for r in admin_runs] == ["r-idor"]
    detail = (await api.client.get("/api/runs/r-idor", headers=api.as_("root"))).json()
    assert [s["name"] for s in detail["steps"]] == ["approval"]
    assert [a["id"] for a in detail["approvals"]] == [ask.id]


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        ({"option": "approve", "operation_digest": "0" * 64}, 409, "stale_digest"),
        ({"option": "launch", "operation_digest": None}, 422, "unknown_option"),
        (
            {"option": "approve", "operation_digest": None, "response": {"x": 1}},
            422,
            "invalid_response",
        ),
    ],
)
async def test_refused_decisions_say_why_with_the_matching_status(
    api: Api, body: dict[str, Any], status: int, reason: str
) -> None:
    await api.app.start("release", "1", id="r-ref")
    ask = await api.pending("r-ref")
    body = {**body, "operation_digest": body["operation_digest"] or ask.operation_digest}
    response = await api.client.post(f"/api/approvals/{ask.id}/decision", json=body,
                                     headers=api.as_("alice"))  # fmt: skip
    assert response.status_code == status
    assert response.json()["reason"] == reason
    assert (await api.app.get_approval(ask.id)).status == "pending"


async def test_a_second_decision_and_the_starter_under_separate_duties_are_refused(
    api: Api,
) -> None:
    await api.app.start("release", "1", id="r-twice")
    ask = await api.pending("r-twice")
    body = {"option": "reject", "operation_digest": ask.operation_digest}
    path = f"/api/approvals/{ask.id}/decision"
    first = await api.client.post(path, json=body, headers=api.as_("alice"))
    assert first.status_code == 200
    again = await api.client.post(path, json=body, headers=api.as_("bob"))
    assert (again.status_code, again.json()["reason"]) == (409, "already_decided")


async def test_bodies_are_strict_json_with_known_fields_under_the_size_limit(api: Api) -> None:
    await api.app.start("release", "1", id="r-body")
    ask = await api.pending("r-body")
    path = f"/api/approvals/{ask.id}/decision"
    headers = {**api.as_("alice"), "Content-Type": "application/json"}
    duplicate = '{"option": "reject", "option": "approve", "operation_digest": "%s"}'
    response = await api.client.post(path, content=duplicate % ask.operation_digest,
                                     headers=headers)  # fmt: skip
    assert response.status_code == 400
    assert "repeats the key 'option'" in response.json()["detail"]
    for bad in ("{not json", '{"option": NaN}', b"\xff\xfe"):
        assert (await api.client.post(path, content=bad, headers=headers)).status_code == 400
    unknown = {"option": "approve", "operation_digest": ask.operation_digest, "reviewer": "bob"}
    response = await api.client.post(path, json=unknown, headers=api.as_("alice"))
    assert response.status_code == 422
    big = json.dumps({"option": "approve", "operation_digest": "x", "comment": "a" * 70_000})
    response = await api.client.post(path, content=big, headers=headers)
    assert response.status_code == 413
    assert (await api.app.get_approval(ask.id)).status == "pending"


async def test_admin_sends_events_and_cancels_runs(api: Api) -> None:
    handle = await api.app.start("release", "1", id="r-admin")
    await api.pending("r-admin")
    root = api.as_("root")
    sent = await api.client.post("/api/runs/r-admin/events/note", json={"a": 1}, headers=root)
    assert sent.status_code == 202
    bad_key = await api.client.post("/api/runs/r-admin/events/tether:x", json=1, headers=root)
    assert bad_key.status_code == 422
    assert (await api.client.post("/api/runs/r-admin/cancel", headers=root)).status_code == 200
    with pytest.raises(tether.RunCancelled):
        await handle.result(timeout=10)
    late = await api.client.post("/api/runs/r-admin/events/note", json={}, headers=root)
    assert late.status_code == 409
    missing = await api.client.get("/api/runs/nope", headers=root)
    assert missing.status_code == 404


def sse_events(text: str) -> list[tuple[str | None, str, str]]:
    """(id, event, data) of each event of an SSE body; comments are skipped."""
    events = []
    for block in text.strip().split("\n\n"):
        lines = [line for line in block.splitlines() if not line.startswith(":")]
        fields = dict(line.split(": ", 1) for line in lines)
        if fields:
            events.append((fields.get("id"), fields["event"], fields["data"]))
    return events


async def test_a_stream_is_served_as_sse_and_resumes_from_an_offset_or_the_last_event_id(
    api: Api,
) -> None:
    words = ["a", "b", "<script>", "password=hunter2 sk-" + "x" * 24]
    handle = await api.app.start("talk", words, id="r-talk")
    assert await handle.result(timeout=10) == 4
    root = api.as_("root")
    whole = await api.client.get("/api/runs/r-talk/streams/tokens", headers=root)
    assert whole.status_code == 200
    assert whole.headers["content-type"].startswith("text/event-stream")
    events = sse_events(whole.text)
    assert [(i, e) for i, e, _ in events] == [("0", "chunk"), ("1", "chunk"), ("2", "chunk"),
                                              ("3", "chunk"), (None, "end")]  # fmt: skip
    assert [json.loads(d) for _, e, d in events if e == "chunk"][:3] == ["a", "b", "<script>"]
    assert "sk-xxxx" not in whole.text  # secrets are redacted on the way out
    assert json.loads(events[-1][2]) == {"status": "succeeded"}
    from_offset = await api.client.get("/api/runs/r-talk/streams/tokens?offset=2", headers=root)
    assert [i for i, e, _ in sse_events(from_offset.text) if e == "chunk"] == ["2", "3"]
    resumed = await api.client.get("/api/runs/r-talk/streams/tokens",
                                   headers={**root, "Last-Event-ID": "2"})  # fmt: skip
    assert [i for i, e, _ in sse_events(resumed.text) if e == "chunk"] == ["3"]
    eve = await api.client.get("/api/runs/r-talk/streams/tokens", headers=api.as_("eve"))
    assert eve.status_code == 404
    bad = await api.client.get("/api/runs/r-talk/streams/tokens",
                               headers={**root, "Last-Event-ID": "x"})  # fmt: skip
    assert bad.status_code == 400


async def test_the_openapi_document_lists_every_status_of_every_operation(api: Api) -> None:
    document = (await api.client.get("/openapi.json")).json()
    operations = [op for path in document["paths"].values() for op in path.values()]
    assert len(operations) == 20  # test_ops_api.py checks the operations routes' tokens
    for operation in operations:
        codes = set(operation["responses"])
        assert {"400", "401", "403", "404", "409", "413", "422"} <= codes, operation["summary"]
    for body in ("DecisionIn", "ForkIn", "StartIn"):
        assert document["components"]["schemas"][body]["additionalProperties"] is False


async def test_html_and_json_responses_carry_the_security_headers(api: Api) -> None:
    response = await api.client.get("/api/approvals")
    assert "default-src 'self'" in response.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff"


async def test_values_are_served_redacted_and_a_fork_needs_group_admin(api: Api) -> None:
    await (await api.app.start("progress", 3, id="p")).result(timeout=10)
    root, alice = api.as_("root"), api.as_("alice")
    listed = await api.client.get("/api/runs/p/values", headers=root)
    assert listed.status_code == 200
    [value] = listed.json()
    assert (value["key"], value["version"]) == ("done", 3)
    assert value["value"]["steps"] == 3
    assert "sk-aaaa" not in listed.text  # redacted like step results
    one = await api.client.get("/api/runs/p/values/done", headers=root)
    assert one.json()["version"] == 3
    newer = await api.client.get("/api/runs/p/values/done?after_version=3&wait=0.1", headers=root)
    assert newer.status_code == 404  # the run ended without a fourth
    assert (await api.client.get("/api/runs/p/values/nope", headers=root)).status_code == 404
    assert (await api.client.get("/api/runs/p/values/a%23b", headers=root)).status_code == 422
    # alice reviews no approval of this run: it does not exist for her.
    assert (await api.client.get("/api/runs/p/values", headers=alice)).status_code == 404

    body = {"from_step": "count#2", "id": "p-fork"}
    assert (await api.client.post("/api/runs/p/fork", json=body, headers=alice)).status_code == 404
    forked = await api.client.post("/api/runs/p/fork", json=body, headers=root)
    assert forked.status_code == 201
    link = forked.json()["forked_from"]
    assert (link["run_id"], link["source_run_id"], link["from_step"]) == ("p-fork", "p", "count#2")
    assert await (await api.app.get("p-fork")).result(timeout=10) == 3
    again = await api.client.post("/api/runs/p/fork", json=body, headers=root)
    assert again.status_code == 201  # the same fork: the id is its idempotency key
    other = {"from_step": "count#3", "id": "p-fork"}
    assert (await api.client.post("/api/runs/p/fork", json=other, headers=root)).status_code == 409
    missing = {"from_step": "nope#1"}
    refused = await api.client.post("/api/runs/p/fork", json=missing, headers=root)
    assert refused.status_code == 409
    assert "count#3" in refused.json()["detail"]  # it names the steps the run recorded


async def test_a_starter_starts_a_run_by_name_once_per_id_and_a_conflict_is_refused(
    api: Api,
) -> None:
    _, token = await add_user(api.app.engine, "svc", frozenset({"starter"}))
    svc = {"Authorization": f"Bearer {token}"}
    body = {"workflow": "progress", "args": [2], "id": "s-1"}
    created = await api.client.post("/api/runs", json=body, headers=svc)
    assert created.status_code == 201
    assert (created.json()["id"], created.json()["workflow"]) == ("s-1", "progress")
    assert await (await api.app.get("s-1")).result(timeout=10) == 2
    record = await api.app.engine.store.get_run("s-1")
    assert record is not None
    assert record.started_by == "svc"  # the token's user, always
    again = await api.client.post("/api/runs", json=body, headers=svc)
    assert again.status_code == 200
    assert (again.json()["id"], again.json()["status"]) == ("s-1", "succeeded")
    for other in ({**body, "args": [3]}, {**body, "workflow": "talk", "args": [["a"]]}):
        conflict = await api.client.post("/api/runs", json=other, headers=svc)
        assert conflict.status_code == 409
        assert "exists with another workflow or other arguments" in conflict.json()["detail"]
        assert "[2]" not in conflict.json()["detail"]  # the other run's arguments stay hidden
    # A workflow this server does not register: stored for a worker that has it.
    remote = {"workflow": "elsewhere", "kwargs": {"x": 1}, "queue": "batch"}
    pending = await api.client.post("/api/runs", json=remote, headers=svc)
    assert pending.status_code == 201
    assert pending.json()["status"] == "pending"
    assert (await api.app.engine.store.get_run(pending.json()["id"])).queue == "batch"  # type: ignore[union-attr]


async def test_only_admin_and_starter_start_runs_and_bad_arguments_are_refused_unwritten(
    api: Api,
) -> None:
    body = {"workflow": "progress", "args": [1], "id": "s-2"}
    assert (await api.client.post("/api/runs", json=body)).status_code == 401
    for reviewer in ("alice", "eve"):
        refused = await api.client.post("/api/runs", json=body, headers=api.as_(reviewer))
        assert refused.status_code == 403
    root = api.as_("root")
    for bad in ({**body, "args": ["one"]}, {**body, "args": [1, 2]},
                {**body, "kwargs": {"started_by": "alice"}},
                {**body, "kwargs": {"id": "other"}}, {**body, "colour": 1},
                {**body, "workflow": ""}, {**body, "args": {"n": 1}}):  # fmt: skip
        response = await api.client.post("/api/runs", json=bad, headers=root)
        assert response.status_code == 422, bad
    assert await api.app.engine.store.get_run("s-2") is None  # nothing was written
    assert (await api.client.post("/api/runs", json=body, headers=root)).status_code == 201


async def test_the_openapi_document_declares_the_bearer_scheme_and_the_run_model(
    api: Api,
) -> None:
    document = (await api.client.get("/openapi.json")).json()
    schemes = document["components"]["securitySchemes"]
    assert schemes["bearer"]["type"] == "http"
    assert schemes["bearer"]["scheme"] == "bearer"
    start = document["paths"]["/api/runs"]["post"]
    assert start["security"] == [{"bearer": []}]
    for code in ("200", "201"):
        schema = start["responses"][code]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/RunOut"}
    assert "status" in document["components"]["schemas"]["RunOut"]["required"]

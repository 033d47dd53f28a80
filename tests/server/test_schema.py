"""Schemathesis against the server's own OpenAPI document, over real HTTP to a uvicorn server on
127.0.0.1: generated requests (seeded, bounded) with a valid token and real run, approval and
outbox message ids mixed in, checked for server errors and for statuses or content the document
does not declare; and the operations routes' response models, named in the document."""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import ignored_auth

import tether
from tether.core.handle import page_cursor
from tether.server import create_server
from tether.users import add_user


class Refuses(tether.Sender):
    async def send(self, message: tether.OutboxMessage) -> None:
        raise tether.PermanentError("refused")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """A Tether App with a waiting run, a queue with limits, a schedule and a failed outbox
    message, served by uvicorn in a thread of its own (its own loop, as in production)."""

    def __init__(self, folder: Path) -> None:
        self.url = f"sqlite:///{folder}/schema.db"
        self.port = free_port()
        self.ready = threading.Event()
        self.ids: dict[str, str] = {}
        self.server: uvicorn.Server | None = None
        self.thread = threading.Thread(target=asyncio.run, args=(self.main(),), daemon=True)

    async def main(self) -> None:
        app = tether.App(self.url, senders={"refuses": Refuses()})
        app.queue("mail", concurrency=2, rate=tether.Rate(10, per=timedelta(minutes=1)))

        @app.workflow()
        async def gated(n: int) -> str:
            return (await tether.approval("Go?", reviewers=["*"])).status

        @app.workflow(queue="mail")
        async def notify() -> None:
            await tether.outbox("refuses", {"hello": "world"})

        @app.schedule("0 3 * * *", name="nightly")
        @app.workflow()
        async def nightly(scheduled_at: datetime) -> None:
            return None

        async with app:
            _, self.ids["token"] = await add_user(app.engine, "admin", frozenset({"admin"}))
            await app.start(gated, 1, id="run-1")
            await app.start(notify, id="notify-1")
            while not (asks := await app.list_approvals(run_id="run-1")):
                await asyncio.sleep(0.01)
            self.ids["approval_id"] = asks[0].id
            while not (failed := await app.list_outbox(status="failed")):
                await asyncio.sleep(0.01)
            self.ids["message_id"] = failed[0].id
            config = uvicorn.Config(create_server(app), host="127.0.0.1", port=self.port,
                                    log_level="warning", lifespan="on")  # fmt: skip
            self.server = uvicorn.Server(config)
            serving = asyncio.create_task(self.server.serve())
            while not self.server.started:
                await asyncio.sleep(0.01)
            self.ready.set()
            await serving

    def __enter__(self) -> Served:
        self.thread.start()
        assert self.ready.wait(30), "the server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with Served(tmp_path_factory.mktemp("schema")) as running:
        yield running


OPERATIONS = 20  # the document's operations: a new route must be added to the fuzzing too


def test_the_api_honours_its_openapi_document(served: Served) -> None:
    schema = schemathesis.openapi.from_url(f"http://127.0.0.1:{served.port}/openapi.json")
    headers = {"Authorization": f"Bearer {served.ids['token']}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == OPERATIONS
    turn = itertools.count()
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=30, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        def check(case: Any) -> None:
            # Every other case aims at real objects, so the success paths are exercised too.
            if next(turn) % 2 == 0 and case.path_parameters:
                for name, real in (("run_id", "run-1"), ("approval_id", served.ids["approval_id"]),
                                   ("message_id", served.ids["message_id"])):  # fmt: skip
                    if name in case.path_parameters:
                        case.path_parameters[name] = real
            if case.query is not None and "follow" in case.query:
                case.query["follow"] = "false"  # a followed stream lasts as long as its run
            if case.query is not None and "wait" in case.query:
                case.query["wait"] = 0  # a wait for a value lasts up to a minute
            if case.query is not None and "cursor" in case.query:
                # A cursor is opaque: one the document's schema allows is rarely one the server
                # made (a made-up one is a 422, see test_api_runs_list).
                case.query["cursor"] = page_cursor(1e9, "run-1")
            # The document declares the bearer scheme, so schemathesis also sends bad tokens;
            # after ten the throttle answers 429, not the 401 it expects. test_api checks that
            # every route refuses a missing or bad token.
            case.call_and_validate(headers=headers, excluded_checks=[ignored_auth])

        check()


def test_the_operations_routes_answer_with_their_models_in_the_document(served: Served) -> None:
    document = httpx.get(f"http://127.0.0.1:{served.port}/openapi.json").json()
    schemas, paths = document["components"]["schemas"], document["paths"]

    def answer(path: str, method: str, code: str = "200") -> Any:
        return paths[path][method]["responses"][code]["content"]["application/json"]["schema"]

    for path, model in (("/api/workers", "WorkersOut"), ("/api/queues", "QueuesOut"),
                        ("/api/schedules", "SchedulesOut")):  # fmt: skip
        assert answer(path, "get") == {"$ref": f"#/components/schemas/{model}"}
        assert paths[path]["get"]["security"] == [{"bearer": []}]
    message = {"$ref": "#/components/schemas/OutboxMessageOut"}
    listed = answer("/api/outbox", "get")
    assert (listed["type"], listed["items"]) == ("array", message)
    assert answer("/api/outbox/{message_id}/retry", "post") == message
    refused = answer("/api/outbox/{message_id}/retry", "post", "409")
    assert refused == {"$ref": "#/components/schemas/Problem"}
    status = next(p for p in paths["/api/outbox"]["get"]["parameters"] if p["name"] == "status")
    assert status["schema"]["anyOf"][0] == {"$ref": "#/components/schemas/OutboxStatus"}
    assert schemas["OutboxStatus"]["enum"] == ["pending", "sending", "delivered", "failed"]
    for model, name, item in (("WorkersOut", "workers", "WorkerOut"),
                              ("SchedulesOut", "schedules", "ScheduleOut"),
                              ("QueuesOut", "queues", "QueueOut"),
                              ("ScheduleOut", "runs", "ScheduleRunOut")):  # fmt: skip
        field = schemas[model]["properties"][name]
        assert field["items"] == {"$ref": f"#/components/schemas/{item}"}, (model, name)
    for model, fields in (
        ("WorkerOut", {"id", "host", "pid", "version", "workflows", "started_at", "heartbeat_at",
                       "silent_seconds", "stale", "runs"}),
        ("QueueOut", {"name", "limits", "due", "running", "workflows"}),
        ("QueueLimitsOut", {"concurrency", "worker_concurrency", "rate", "period_seconds"}),
        ("ScheduleOut", {"name", "workflow", "cron", "tz", "catch_up", "defined", "registered",
                         "last_slot", "next_slots", "runs"}),
        ("OutboxMessageOut", {"id", "run_id", "checkpoint", "destination", "status", "attempts",
                              "uncertain", "in_doubt", "next_at", "created_at", "updated_at",
                              "delivered_at", "error_type", "error_message"}),
    ):  # fmt: skip
        assert set(schemas[model]["properties"]) == fields, model
        assert set(schemas[model]["required"]) == fields, model

"""Human approvals: one per call site, bound to the operation by digest, decided once by an
allowed reviewer, expiring closed, audited in a hash chain; every refusal path, on every
backend and in forced-replay mode."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

import tether
from tether import webhooks
from tether.approvals.digest import digest_key
from tether.store.port import RunStatus
from tether.testing import FakeClock, fake_app, run_until_idle

MakeApp = Callable[..., tether.App]
OPERATION = {"tool": "deploy", "arguments": {"version": "1.2.3", "env": "prod"}}


async def pending(app: tether.App, run_id: str) -> tether.Approval:
    """The run's pending approval, once it exists."""
    async with asyncio.timeout(10):
        while True:
            found = await app.list_approvals(run_id=run_id)
            if found:
                return found[0]
            await asyncio.sleep(0.005)


async def digest(app: tether.App, run_id: str, step: str, operation: Any) -> str:
    """The digest the app's database binds `operation` at `step` of `run_id` to (keyed)."""
    key = await digest_key(app.engine.store, app.engine.clock.now())
    return tether.operation_digest(run_id, step, operation, key=key)


def deploy_app(make: MakeApp, effects: list[str], **approval: Any) -> tether.App:
    app = make()

    @app.step()
    async def deploy(version: str) -> str:
        effects.append(version)
        return f"deployed {version}"

    @app.workflow()
    async def release(version: str) -> dict[str, Any]:
        decision = await tether.approval(
            "Deploy to prod?",
            "The agent wants to deploy.",
            operation={"tool": "deploy", "arguments": {"version": version, "env": "prod"}},
            reviewers=approval.get("reviewers", ["alice", "group:sre"]),
            expires_in=approval.get("expires_in", timedelta(hours=1)),
            context={"changelog": "fix login", "api_key": "abc123", "note": "key sk-" + "a" * 24},
            required=approval.get("required", 1),
            separate_duties=approval.get("separate_duties", False),
            **({"options": approval["options"]} if "options" in approval else {}),
        )
        if decision.approved:
            return {"status": decision.status, "result": await deploy(version)}
        return {"status": decision.status, "option": decision.option}

    return app


async def test_an_approved_decision_resumes_the_run_which_acts_once(make_app: MakeApp) -> None:
    effects: list[str] = []
    app = deploy_app(make_app, effects)
    async with app:
        handle = await app.start("release", "1.2.3", id="rel-1", started_by="carol")
        ask = await pending(app, "rel-1")
        assert ask.title == "Deploy to prod?"
        assert ask.status == "pending"
        assert ask.reviewers == ("alice", "group:sre")
        assert [o.id for o in ask.options] == ["approve", "reject"]
        assert ask.starter == "carol"
        assert ask.operation_digest == await digest(app, "rel-1", "approval", OPERATION)
        decision = await app.decide(
            ask.id, "approve", reviewer="alice", operation_digest=ask.operation_digest,
            comment="ship it",
        )  # fmt: skip
        assert (decision.status, decision.reviewer) == ("approved", "alice")
        assert decision.approved
        assert await handle.result(timeout=10) == {"status": "approved", "result": "deployed 1.2.3"}
    assert effects == ["1.2.3"]
    assert len(await app.list_approvals(status=None)) == 1  # replays never asked twice
    events = [e.event for e in await app.approval_history(ask.id)]
    assert events == ["created", "decided"]
    assert await app.verify_approvals() == {ask.id: []}


async def test_a_rejection_reaches_the_workflow_and_the_tool_never_runs(make_app: MakeApp) -> None:
    effects: list[str] = []
    app = deploy_app(make_app, effects)
    async with app:
        handle = await app.start("release", "2.0", id="rel-2")
        ask = await pending(app, "rel-2")
        decision = await app.decide(ask.id, "reject", reviewer="alice",
                                    operation_digest=ask.operation_digest)  # fmt: skip
        assert (decision.status, decision.approved) == ("rejected", False)
        assert await handle.result(timeout=10) == {"status": "rejected", "option": "reject"}
    assert effects == []


async def test_reviewers_see_the_context_and_operation_redacted(make_app: MakeApp) -> None:
    app = make_app()

    @app.workflow()
    async def pay(card: dict[str, str]) -> bool:
        decision = await tether.approval(
            "Refund?", operation={"tool": "refund", "arguments": card}, reviewers=["*"],
            context={"password": "hunter2", "bearer": "Authorization: Bearer abc.def.ghi",
                     "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"},
        )  # fmt: skip
        return decision.approved

    raw = {"amount": "10", "token": "tok_live_123"}
    async with app:
        await app.start(pay, raw, id="pay-1")
        ask = await pending(app, "pay-1")
    text = json.dumps([ask.context, ask.operation])
    for secret in ("hunter2", "tok_live_123", "eyJzdWIiOiIxIn0", "abc.def.ghi"):
        assert secret not in text
    # What runs is hidden but visibly so: its length and a keyed fingerprint are shown.
    shown = ask.operation["arguments"]
    assert shown["amount"] == "10"
    assert re.fullmatch(r"\[hidden secret, 12 chars, fp [0-9a-f]{12}; it runs as given\]",
                        shown["token"]), shown  # fmt: skip
    # The digest binds the raw operation, not the masked view, under the database's key.
    raw_op = {"tool": "refund", "arguments": raw}
    async with app:
        assert ask.operation_digest == await digest(app, "pay-1", "approval", raw_op)
    assert ask.operation_digest != tether.operation_digest("pay-1", "approval", raw_op)


@pytest.mark.parametrize(
    ("reviewer", "option", "digest", "response", "reason"),
    [
        ("mallory", "approve", None, None, "wrong_reviewer"),
        ("alice", "approve", "0" * 64, None, "stale_digest"),
        ("alice", "launch", None, None, "unknown_option"),
        ("alice", "edit", None, {"arguments": {"version": 7}}, "invalid_response"),
        ("alice", "edit", None, None, "invalid_response"),
        ("alice", "approve", None, {"unexpected": True}, "invalid_response"),
    ],
)
async def test_each_invalid_decision_is_refused_audited_and_decides_nothing(
    make_app: MakeApp, reviewer: str, option: str, digest: str | None, response: object,
    reason: str,
) -> None:  # fmt: skip
    edit = tether.Option("edit", "Edit", schema={
        "type": "object", "required": ["arguments"],
        "properties": {"arguments": {"type": "object", "properties": {
            "version": {"type": "string"}}, "required": ["version"]}},
    })  # fmt: skip
    app = deploy_app(make_app, [], options=[*tether.APPROVE_REJECT, edit])
    async with app:
        await app.start("release", "1.0", id="rel-r")
        ask = await pending(app, "rel-r")
        with pytest.raises(tether.ApprovalRefused) as refused:
            await app.decide(ask.id, option, reviewer=reviewer, response=response,
                             operation_digest=digest or ask.operation_digest)  # fmt: skip
        assert refused.value.reason == reason
        assert (await app.get_approval(ask.id)).status == "pending"
        assert not (await (await app.get("rel-r")).status()).terminal
    [created, entry] = await app.approval_history(ask.id)
    assert (created.event, entry.event, entry.actor) == ("created", "refused", reviewer)
    assert entry.detail["reason"] == reason


async def test_a_second_decision_is_refused_and_the_first_stands(make_app: MakeApp) -> None:
    app = deploy_app(make_app, [])
    async with app:
        handle = await app.start("release", "1.0", id="rel-twice")
        ask = await pending(app, "rel-twice")
        await app.decide(ask.id, "reject", reviewer="alice", operation_digest=ask.operation_digest)
        with pytest.raises(tether.ApprovalRefused) as refused:
            await app.decide(ask.id, "approve", reviewer=tether.Reviewer("bob", {"sre"}),
                             operation_digest=ask.operation_digest)  # fmt: skip
        assert refused.value.reason == "already_decided"
        assert (await handle.result(timeout=10))["status"] == "rejected"


async def test_group_members_decide_and_separate_duties_refuse_the_starter(
    make_app: MakeApp,
) -> None:
    app = deploy_app(make_app, [], separate_duties=True)
    async with app:
        handle = await app.start("release", "1.0", id="rel-sod", started_by="bob")
        ask = await pending(app, "rel-sod")
        bob = tether.Reviewer("bob", frozenset({"sre"}))
        assert not ask.may_decide(bob)
        with pytest.raises(tether.ApprovalRefused) as refused:
            await app.decide(ask.id, "approve", reviewer=bob, operation_digest=ask.operation_digest)
        assert refused.value.reason == "separate_duties"
        dana = tether.Reviewer("dana", frozenset({"sre"}))
        assert [a.id for a in await app.list_approvals(reviewer=dana)] == [ask.id]
        assert await app.list_approvals(reviewer=bob) == []
        await app.decide(ask.id, "approve", reviewer=dana, operation_digest=ask.operation_digest)
        assert (await handle.result(timeout=10))["status"] == "approved"


async def test_a_quorum_needs_distinct_approvers_and_resumes_only_when_met(
    make_app: MakeApp,
) -> None:
    effects: list[str] = []
    app = deploy_app(make_app, effects, required=2, reviewers=["group:sre"])
    sre = [tether.Reviewer(n, frozenset({"sre"})) for n in ("ann", "ben")]
    async with app:
        handle = await app.start("release", "3.0", id="rel-q")
        ask = await pending(app, "rel-q")
        first = await app.decide(ask.id, "approve", reviewer=sre[0],
                                 operation_digest=ask.operation_digest)  # fmt: skip
        assert (first.status, first.approved, first.approvers) == ("pending", False, ("ann",))
        with pytest.raises(tether.ApprovalRefused) as again:
            await app.decide(ask.id, "approve", reviewer=sre[0],
                             operation_digest=ask.operation_digest)  # fmt: skip
        assert again.value.reason == "already_voted"
        assert not (await (await app.get("rel-q")).status()).terminal
        assert effects == []
        second = await app.decide(ask.id, "approve", reviewer=sre[1],
                                  operation_digest=ask.operation_digest)  # fmt: skip
        assert (second.status, second.approvers) == ("approved", ("ann", "ben"))
        assert (await handle.result(timeout=10))["status"] == "approved"
    assert effects == ["3.0"]
    events = [e.event for e in await app.approval_history(ask.id)]
    assert events == ["created", "voted", "refused", "decided"]


async def test_expiry_fails_closed_and_a_late_decision_is_refused() -> None:
    clock = FakeClock()
    app = deploy_app(lambda: fake_app(clock=clock), [])
    async with app:
        handle = await app.start("release", "1.0", id="rel-exp")
        await run_until_idle(app, advance=False)
        ask = await pending(app, "rel-exp")
        clock.advance(timedelta(minutes=59))
        assert (await app.get_approval(ask.id)).status == "pending"
        await run_until_idle(app)  # the expiry timer is the next thing due
        assert await handle.result(timeout=5) == {"status": "expired", "option": None}
        with pytest.raises(tether.ApprovalRefused) as refused:
            await app.decide(ask.id, "approve", reviewer="alice",
                             operation_digest=ask.operation_digest)  # fmt: skip
        assert refused.value.reason == "expired"
    events = [e.event for e in await app.approval_history(ask.id)]
    assert events == ["created", "expired", "refused"]


async def test_a_decision_after_the_expiry_time_is_refused_before_the_run_notices() -> None:
    clock = FakeClock()
    app = deploy_app(lambda: fake_app(clock=clock), [])
    async with app:
        await app.start("release", "1.0", id="rel-late")
        await run_until_idle(app, advance=False)
        ask = await pending(app, "rel-late")
        clock.set(clock.now() + 3601)  # no worker step in between: only the decide sees it
        with pytest.raises(tether.ApprovalRefused) as refused:
            await app.decide(ask.id, "approve", reviewer="alice",
                             operation_digest=ask.operation_digest)  # fmt: skip
        assert refused.value.reason == "expired"
        assert (await app.get_approval(ask.id)).status == "expired"
        await run_until_idle(app)
        assert (await (await app.get("rel-late")).result(timeout=5))["status"] == "expired"


async def test_an_edit_changes_the_operation_which_gets_its_own_digest(make_app: MakeApp) -> None:
    app = make_app()
    edit = tether.Option("edit", "Edit", schema={"type": "object", "required": ["arguments"]})

    @app.workflow()
    async def change(version: str) -> dict[str, Any]:
        operation = {"tool": "deploy", "arguments": {"version": version}}
        first = await tether.approval("Deploy?", operation=operation, reviewers=["alice"],
                                      options=[*tether.APPROVE_REJECT, edit])  # fmt: skip
        if first.status != "edit":
            return {"first": first.status}
        again = await tether.approval("Deploy the edited version?", operation=first.operation,
                                      reviewers=["alice"])  # fmt: skip
        return {"first": first.status, "operation": first.operation,
                "digest": first.operation_digest, "second": again.status}  # fmt: skip

    async with app:
        handle = await app.start(change, "1.0", id="edit-1")
        ask = await pending(app, "edit-1")
        await app.decide(ask.id, "edit", reviewer="alice", operation_digest=ask.operation_digest,
                         response={"arguments": {"version": "1.1"}})  # fmt: skip
        async with asyncio.timeout(10):
            while not (asks := await app.list_approvals(run_id="edit-1")) or asks[0].id == ask.id:
                await asyncio.sleep(0.005)
        second = asks[0]
        edited = {"tool": "deploy", "arguments": {"version": "1.1"}}
        assert second.operation == edited
        assert second.operation_digest == await digest(app, "edit-1", "approval#2", edited)
        first_digest = await digest(app, "edit-1", "approval", edited)
        await app.decide(second.id, "approve", reviewer="alice",
                         operation_digest=second.operation_digest)  # fmt: skip
        result = await handle.result(timeout=10)
    assert result["first"] == "edit"
    assert result["second"] == "approved"
    assert result["operation"] == edited
    assert result["digest"] == first_digest
    assert result["digest"] != ask.operation_digest


async def test_the_outcome_is_reported_once_and_cancelling_an_approval_tells_the_run(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow()
    async def two() -> list[str]:
        seen = []
        for title in ("first?", "second?"):
            decision = await tether.approval(title, reviewers=["alice"])
            await decision.report("done" if decision.approved else "skipped", detail={"t": title})
            seen.append(decision.status)
        return seen

    async with app:
        handle = await app.start(two, id="two")
        first = await pending(app, "two")
        await app.decide(first.id, "approve", reviewer="alice",
                         operation_digest=first.operation_digest)  # fmt: skip
        async with asyncio.timeout(10):
            while not (second := await app.list_approvals(run_id="two")):
                await asyncio.sleep(0.005)
        cancelled = await app.cancel_approval(second[0].id, actor="ops", reason="not needed")
        assert (cancelled.status, cancelled.approved) == ("cancelled", False)
        assert await handle.result(timeout=10) == ["approved", "cancelled"]
    history = await app.approval_history(first.id)
    assert [e.event for e in history] == ["created", "decided", "outcome"]
    assert history[-1].detail == {"outcome": "done", "detail": {"t": "first?"}}
    assert [e.event for e in await app.approval_history(second[0].id)] == [
        "created", "cancelled", "outcome"]  # fmt: skip


async def test_cancelling_the_run_cancels_its_pending_approval(make_app: MakeApp) -> None:
    app = deploy_app(make_app, [])
    async with app:
        handle = await app.start("release", "1.0", id="rel-c")
        ask = await pending(app, "rel-c")
        await handle.cancel()
        with pytest.raises(tether.RunCancelled):
            await handle.result(timeout=10)
        assert (await app.get_approval(ask.id)).status == "cancelled"
        with pytest.raises(tether.ApprovalRefused) as refused:
            await app.decide(ask.id, "approve", reviewer="alice",
                             operation_digest=ask.operation_digest)  # fmt: skip
        assert refused.value.reason == "already_decided"


async def test_looking_up_unknown_approvals_says_so(make_app: MakeApp) -> None:
    app = make_app()
    for call in (app.get_approval("nope"), app.approval_history("nope"),
                 app.decide("nope", "approve", reviewer="a", operation_digest="x")):  # fmt: skip
        with pytest.raises(tether.ApprovalNotFound, match="tether approvals list"):
            await call


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reviewers": []}, "needs reviewers"),
        ({"reviewers": "alice"}, "needs reviewers"),
        ({"reviewers": ["a"], "expires_in": timedelta(0)}, "must be positive"),
        ({"reviewers": ["a"], "required": 0}, "required="),
        (
            {"reviewers": ["a"], "options": [tether.Option("a", "A"), tether.Option("a", "B")]},
            "distinct",
        ),
        ({"reviewers": ["a"], "response_schema": {"type": "nonsense"}}, "invalid JSON schema"),
    ],
)
async def test_a_badly_asked_approval_fails_the_run_with_a_clear_error(
    make_app: MakeApp, kwargs: dict[str, Any], message: str
) -> None:
    app = make_app()

    @app.workflow()
    async def ask() -> None:
        await tether.approval("Title", **kwargs)

    async with app:
        handle = await app.start(ask, id="bad")
        with pytest.raises(tether.RunFailed, match=message):
            await handle.result(timeout=10)


def test_options_are_checked_when_made() -> None:
    with pytest.raises(tether.ConfigurationError, match="option id"):
        tether.Option("Approve!", "x")
    with pytest.raises(tether.ConfigurationError, match="style"):
        tether.Option("ok", "OK", style="loud")


# -- notifiers and webhooks -------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def approval_requested(self, approval: tether.Approval) -> None:
        self.calls.append(("requested", approval.title))

    async def approval_decided(self, approval: tether.Approval, decision: tether.Decision) -> None:
        self.calls.append(("decided", decision.status))


class Receiver(BaseHTTPRequestHandler):
    fail_first = 1
    seen: ClassVar[list[tuple[int, bytes, dict[str, str], str]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        code = 503 if len(self.seen) < self.fail_first else 200
        self.seen.append((code, body, {k.lower(): v for k, v in self.headers.items()},
                          self.headers["Idempotency-Key"]))  # fmt: skip
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook"
    server.shutdown()
    server.server_close()


async def test_notifiers_are_told_once_and_the_webhook_is_signed_and_retried_by_key(
    make_app: MakeApp, receiver: str
) -> None:
    recorder = Recorder()
    app = make_app(notifiers=[recorder])
    secret = "s" * 32
    hook = tether.Webhook(receiver, secret, retry=tether.Retry(initial_delay=timedelta(0)))

    @app.workflow()
    async def hooked() -> str:
        decision = await tether.approval("Go?", reviewers=["alice"], on_decision=hook)
        return decision.status

    async with app:
        handle = await app.start(hooked, id="hooked")
        ask = await pending(app, "hooked")
        await app.decide(ask.id, "approve", reviewer="alice", operation_digest=ask.operation_digest)
        assert await handle.result(timeout=10) == "approved"
    assert recorder.calls == [("requested", "Go?"), ("decided", "approved")]
    assert [code for code, *_ in Receiver.seen] == [503, 200]
    (_, body, _headers, key), (_, body2, headers2, key2) = Receiver.seen
    assert key == key2
    assert key.startswith("tether-")
    assert body == body2
    # Standard Webhooks: the webhook-id is the idempotency key, inside what is signed.
    assert webhooks.verify(secret, body2, headers2, now=time.time()) == key
    with pytest.raises(webhooks.WebhookSignatureError):
        webhooks.verify("x" * 32, body2, headers2, now=time.time())
    data = json.loads(body2)
    assert (data["approval_id"], data["status"], data["reviewer"]) == (ask.id, "approved", "alice")
    assert "context" not in data


async def test_adding_or_removing_notifiers_never_breaks_the_replay_of_runs_in_flight(
    make_store: Callable[[], Any],
) -> None:
    recorders = [Recorder()]

    def build(notifiers: list[Recorder]) -> tether.App:
        app = tether.App(store=make_store(), notifiers=notifiers)
        app.engine.settings = dataclasses.replace(app.engine.settings, inline_wait_max=0.05)

        @app.workflow()
        async def twice() -> list[str]:
            first = await tether.approval("one?", reviewers=["alice"])
            second = await tether.approval("two?", reviewers=["alice"])
            return [first.status, second.status]

        return app

    async def decide_next(app: tether.App, done: set[str]) -> None:
        async with asyncio.timeout(10):
            while not (asks := [a for a in await app.list_approvals() if a.id not in done]):
                await asyncio.sleep(0.005)
        done.add(asks[0].id)
        await app.decide(asks[0].id, "approve", reviewer="alice",
                         operation_digest=asks[0].operation_digest)  # fmt: skip

    done: set[str] = set()
    quiet = build([])
    async with quiet:
        await quiet.start("twice", id="flight")
        await decide_next(quiet, done)
        async with asyncio.timeout(10):  # suspended in its second wait
            while len(await quiet.list_approvals(status=None)) < 2 or (
                await (await quiet.get("flight")).status() is not RunStatus.WAITING
            ):
                await asyncio.sleep(0.005)
    told = build([recorders[0]])  # the run resumes where a notifier now exists
    async with told:
        await decide_next(told, done)
        assert await (await told.get("flight")).result(timeout=10) == ["approved", "approved"]
        names = [c.name for c in await (await told.get("flight")).checkpoints()]
    # The first approval was asked and decided without notifiers: its history holds no
    # notification and its replay adds none. The second is told from where the run resumed.
    assert recorders[0].calls == [("requested", "two?"), ("decided", "approved")]
    assert names == ["approval", "approval:wait", "approval#2", "tether.notify",
                     "approval#2:wait", "tether.notify#2"]  # fmt: skip


def test_the_blocking_twin_lists_decides_and_reads_the_history(tmp_path: Any) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/sync.db")

    @app.workflow()
    async def ask() -> str:
        return (await tether.approval("Sync?", reviewers=["alice"])).status

    with app.sync as client:
        handle = client.start(ask, id="sync-1")
        deadline = time.monotonic() + 10
        while not (found := client.list_approvals(run_id="sync-1")):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        shown = client.get_approval(found[0].id, viewer="alice")
        decision = client.decide(shown.id, "approve", reviewer="alice",
                                 operation_digest=shown.operation_digest)  # fmt: skip
        assert decision.approved
        assert handle.result(timeout=10) == "approved"
        events = [e.event for e in client.approval_history(shown.id)]
        assert events == ["created", "viewed", "decided"]
        assert client.verify_approvals() == {shown.id: []}


# -- issue 17: decisions that hold, a trail that covers the row --------------------------------


@pytest.mark.parametrize("word", ["pending", "approved", "rejected", "expired", "cancelled"])
def test_an_option_named_like_a_status_is_refused_with_what_to_use(word: str) -> None:
    with pytest.raises(tether.ConfigurationError, match="reserved") as refused:
        tether.Option(word, "Ship it")
    assert "'approve'" in str(refused.value)


def edit_app(make: MakeApp, effects: list[str]) -> tether.App:
    app = make()
    approve = tether.Option("approve", "Approve", schema={"type": ["object", "null"]})

    @app.step()
    async def deploy(arguments: dict[str, Any]) -> None:
        effects.append(json.dumps(arguments, sort_keys=True))

    @app.workflow()
    async def release(version: str) -> str:
        operation = {"tool": "deploy", "arguments": {"version": version}}
        decision = await tether.approval("Deploy?", operation=operation, reviewers=["*"],
                                         options=[approve, tether.APPROVE_REJECT[1]],
                                         required=2)  # fmt: skip
        if decision.approved:
            await deploy(decision.operation["arguments"])
        return decision.status

    return app


async def test_a_quorum_refuses_an_approval_with_another_edit_than_the_pending_one(
    make_app: MakeApp,
) -> None:
    effects: list[str] = []
    app = edit_app(make_app, effects)
    good = {"arguments": {"version": "1.2.3"}}
    async with app:
        handle = await app.start("release", "1.2.3", id="rel-edit", started_by="carol")
        ask = await pending(app, "rel-edit")
        await app.decide(ask.id, "approve", reviewer="alice", operation_digest=ask.operation_digest,
                         response=good)  # fmt: skip
        evil = {"arguments": {"version": "6.6.6-evil", "force": True}}
        with pytest.raises(tether.ApprovalRefused, match="approve that one or reject") as no:
            await app.decide(ask.id, "approve", reviewer="bob",
                             operation_digest=ask.operation_digest, response=evil)  # fmt: skip
        assert no.value.reason == "differing_edit"
        assert "1.2.3" in str(no.value)
        assert (await app.get_approval(ask.id)).status == "pending"
        # The identical edit counts towards the quorum.
        done = await app.decide(ask.id, "approve", reviewer="bob",
                                operation_digest=ask.operation_digest, response=good)  # fmt: skip
        assert (done.status, done.approvers) == ("approved", ("alice", "bob"))
        assert await handle.result(timeout=10) == "approved"
    assert effects == ['{"version": "1.2.3"}']
    refused = [e for e in await app.approval_history(ask.id) if e.event == "refused"]
    assert [(e.actor, e.detail["reason"]) for e in refused] == [("bob", "differing_edit")]


async def test_separate_duties_without_a_known_starter_fails_the_run_at_creation(
    make_app: MakeApp,
) -> None:
    app = deploy_app(make_app, [], separate_duties=True)
    async with app:
        handle = await app.start("release", "1.0", id="rel-nobody")
        with pytest.raises(tether.RunFailed, match="started_by="):
            await handle.result(timeout=10)
        assert await app.list_approvals(status=None, run_id="rel-nobody") == []


async def test_a_metrics_only_service_account_never_decides_even_for_anyone(
    make_app: MakeApp,
) -> None:
    app = deploy_app(make_app, [], reviewers=["*", "scraper"])
    scraper = tether.Reviewer("scraper", frozenset({"metrics"}))
    async with app:
        await app.start("release", "1.0", id="rel-svc")
        ask = await pending(app, "rel-svc")
        assert not ask.may_decide(scraper)
        assert await app.list_approvals(reviewer=scraper) == []
        with pytest.raises(tether.ApprovalRefused, match="service account") as refused:
            await app.decide(ask.id, "approve", reviewer=scraper,
                             operation_digest=ask.operation_digest)  # fmt: skip
        assert refused.value.reason == "wrong_reviewer"
        # A person who also reads metrics is no service account.
        both = tether.Reviewer("dana", frozenset({"metrics", "sre"}))
        assert ask.may_decide(both)
        assert [a.id for a in await app.list_approvals(reviewer=both)] == [ask.id]


async def test_every_entry_records_the_channel_and_client_and_views_are_recorded_once(
    make_app: MakeApp,
) -> None:
    app = deploy_app(make_app, [])
    async with app:
        await app.start("release", "1.0", id="rel-ch")
        ask = await pending(app, "rel-ch")
        for _ in range(3):
            await app.get_approval(ask.id, viewer="alice", channel="inbox", client="10.0.0.7")
        await app.get_approval(ask.id, viewer="bob", channel="api", client="10.0.0.8")
        with pytest.raises(tether.ApprovalRefused):
            await app.decide(ask.id, "approve", reviewer="mallory",
                             operation_digest=ask.operation_digest, channel="api",
                             client="10.0.0.9")  # fmt: skip
        await app.decide(ask.id, "reject", reviewer="alice", operation_digest=ask.operation_digest,
                         channel="cli", client="host-1/4242")  # fmt: skip
        with pytest.raises(tether.ConfigurationError, match="channel is one of"):
            await app.decide(ask.id, "approve", reviewer="alice",
                             operation_digest=ask.operation_digest, channel="email")  # fmt: skip
        with pytest.raises(tether.ConfigurationError, match="client"):
            await app.get_approval(ask.id, viewer="carol", client="x" * 201)
        trail = await app.approval_history(ask.id)
    seen = [(e.event, e.actor, e.detail.get("channel"), e.detail.get("client")) for e in trail]
    assert seen == [
        ("created", None, None, None),
        ("viewed", "alice", "inbox", "10.0.0.7"),
        ("viewed", "bob", "api", "10.0.0.8"),
        ("refused", "mallory", "api", "10.0.0.9"),
        ("decided", "alice", "cli", "host-1/4242"),
    ]


async def test_cancelling_records_the_channel_and_the_client(make_app: MakeApp) -> None:
    app = deploy_app(make_app, [])
    async with app:
        await app.start("release", "1.0", id="rel-cc")
        ask = await pending(app, "rel-cc")
        await app.cancel_approval(ask.id, actor="ops", channel="cli", client="box/77")
        last = (await app.approval_history(ask.id))[-1]
    assert (last.event, last.detail["channel"], last.detail["client"]) == (
        "cancelled", "cli", "box/77")  # fmt: skip


async def test_the_reviewer_sees_a_hidden_value_flagged_and_a_fake_secret_in_full(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow()
    async def call(arguments: dict[str, str]) -> str:
        decision = await tether.approval("Call?", operation={"tool": "call",
                                         "arguments": arguments}, reviewers=["*"])  # fmt: skip
        return decision.status

    async with app:
        await app.start(call, {"auth_token": "; rm -rf /srv/data", "api_key": "k" * 18,
                               "note": "use tt_" + "a" * 30}, id="call-1")  # fmt: skip
        ask = await pending(app, "call-1")
        again = await app.get_approval(ask.id)
    shown = ask.operation["arguments"]
    assert shown["auth_token"].startswith("[WARNING: not a secret-like value, shown in full")
    assert '"; rm -rf /srv/data"' in shown["auth_token"]
    assert re.fullmatch(r"\[hidden secret, 18 chars, fp [0-9a-f]{12}; it runs as given\]",
                        shown["api_key"])  # fmt: skip
    assert "a" * 30 not in shown["note"]
    assert "hidden secret, 33 chars" in shown["note"]
    assert again.operation == ask.operation  # one fingerprint per value, every time


async def test_verify_finds_a_rewritten_row_who_decided_and_a_deleted_approval(
    tmp_path: Any,
) -> None:
    import sqlite3

    url = f"sqlite:///{tmp_path / 'v.db'}"
    app = deploy_app(lambda: tether.App(url), [], required=2)
    sre = tether.Reviewer("ann", frozenset({"sre"}))
    async with app:
        for run_id in ("v-quorum", "v-who", "v-gone", "v-fine"):
            await app.start("release", "1.0", id=run_id, started_by="carol")
            ask = await pending(app, run_id)
            if run_id != "v-fine":
                await app.decide(ask.id, "approve", reviewer=sre,
                                 operation_digest=ask.operation_digest)  # fmt: skip
                await app.decide(ask.id, "approve", reviewer="alice",
                                 operation_digest=ask.operation_digest)  # fmt: skip
        ids = {a.run_id: a.id for a in await app.list_approvals(status=None)}
        assert all(p == [] for p in (await app.verify_approvals()).values())
    with sqlite3.connect(tmp_path / "v.db") as db:
        db.execute("UPDATE tether_approvals SET body = json_set(body, '$.required', 1) "
                   "WHERE id = ?", (ids["v-quorum"],))  # fmt: skip
        db.execute("UPDATE tether_approvals SET body = json_set(body, '$.decision', "
                   "json_set(json_extract(body, '$.decision'), '$.reviewer', 'eve') || '') "
                   "WHERE id = ?", (ids["v-who"],))  # fmt: skip
        db.execute("DELETE FROM tether_approval_audit WHERE approval_id = ?", (ids["v-gone"],))
        db.execute("DELETE FROM tether_approvals WHERE id = ?", (ids["v-gone"],))
    async with tether.App(url) as again:
        found = await again.verify_approvals()
        checks = await again.check_approvals()
    assert "required" in " ".join(found[ids["v-quorum"]])
    assert "eve" in " ".join(found[ids["v-who"]])
    assert "deleted with its trail" in " ".join(found[ids["v-gone"]])
    assert found[ids["v-fine"]] == []
    assert checks[ids["v-fine"]].covered


async def test_an_approval_made_before_the_commitment_verifies_as_not_covered(
    tmp_path: Any,
) -> None:
    import sqlite3

    url = f"sqlite:///{tmp_path / 'old.db'}"
    app = deploy_app(lambda: tether.App(url), [])
    async with app:
        await app.start("release", "1.0", id="old-1")
        ask = await pending(app, "old-1")
    # What an approval created before this change holds: a `created` entry with its title only.
    with sqlite3.connect(tmp_path / "old.db") as db:
        from tether.store.audit import audit_hash

        detail = json.dumps({"title": ask.title})
        (at,) = db.execute("SELECT at FROM tether_approval_audit WHERE approval_id = ?",
                           (ask.id,)).fetchone()  # fmt: skip
        digest = audit_hash("0" * 64, ask.id, 1, at, "created", None, detail)
        db.execute("UPDATE tether_approval_audit SET detail = ?, hash = ? WHERE approval_id = ?",
                   (detail, digest, ask.id))  # fmt: skip
        db.execute("UPDATE tether_approvals SET audit_head = ? WHERE id = ?", (digest, ask.id))
    async with tether.App(url) as again:
        checks = await again.check_approvals()
    assert checks[ask.id].problems == ()
    assert not checks[ask.id].covered
    from click.testing import CliRunner

    from tether.cli import cli

    result = await asyncio.to_thread(CliRunner().invoke, cli,
                                     ["approvals", "--database", url, "verify"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "1 approvals verified, 0 broken, 1 not covered" in result.output


async def test_an_approval_made_with_an_unkeyed_digest_is_still_decided_and_replayed(
    tmp_path: Any,
) -> None:
    import sqlite3

    effects: list[str] = []
    url = f"sqlite:///{tmp_path / 'legacy.db'}"
    app = deploy_app(lambda: tether.App(url), effects)
    async with app:
        await app.start("release", "1.2.3", id="legacy-1")
        ask = await pending(app, "legacy-1")
    # As an approval made before digests were keyed: the plain SHA-256 in its row and its
    # checkpoint (the workflow recomputes it on replay).
    plain = tether.operation_digest("legacy-1", "approval", OPERATION)
    with sqlite3.connect(tmp_path / "legacy.db") as db:
        db.execute("UPDATE tether_approvals SET body = json_set(body, '$.operation_digest', ?) "
                   "WHERE id = ?", (plain, ask.id))  # fmt: skip
        db.execute("UPDATE tether_checkpoints SET result = json_set(result, '$.digest', ?) "
                   "WHERE run_id = 'legacy-1' AND name = 'approval'", (plain,))  # fmt: skip
    again = deploy_app(lambda: tether.App(url), effects)
    async with again:
        with pytest.raises(tether.ApprovalRefused):
            await again.decide(ask.id, "approve", reviewer="alice",
                               operation_digest=ask.operation_digest)  # fmt: skip
        await again.decide(ask.id, "approve", reviewer="alice", operation_digest=plain)
        result = await (await again.get("legacy-1")).result(timeout=10)
    assert result["status"] == "approved"
    assert effects == ["1.2.3"]

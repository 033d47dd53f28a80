"""The App the operations tests read (test_ops_pages.py, test_ops_api.py), on a real database
with its worker running: a queue with limits (a rate that leaves runs due), a run held by the
worker, a schedule with a run of a past slot, an outbox message its sender refused for good (its
destination holds a password, its error markup and a secret), and a dead run. `more_messages`
adds one outbox message in each other section of the page: in doubt, sending, pending.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

import tether
from tether.store.port import NewRun, RunStatus
from tether.store.port.schedules import ScheduleSpec

HOSTILE = '<img src=x onerror="window.__pwned=1">'
QUEUE = f"mail{HOSTILE}"
SCHEDULE = f"nightly{HOSTILE}"
# A sender's name is looked up before URLs are: this one has a password in it, to redact.
DESTINATION = "https://ops:hunter2@hooks.example/in"
REFUSAL = f"{HOSTILE} refused the message\nsecond line: password=swordfish"
HANGS = "hangs"  # a sender whose sends never end (the message stays sending)
FLAKY = "flaky"  # a sender that fails each send in a way worth retrying (in an hour)


class Refuses(tether.Sender):
    """Refuses every message for good while `refusing`, then accepts them."""

    def __init__(self) -> None:
        self.refusing = True
        self.accepted: list[str] = []

    async def send(self, message: tether.OutboxMessage) -> None:
        if self.refusing:
            raise tether.PermanentError(REFUSAL)
        self.accepted.append(message.key)


class Hangs(tether.Sender):
    """Never finishes a send (the worker cancels them when it stops); counts them."""

    def __init__(self) -> None:
        self.sends: list[tuple[str, bool]] = []  # (run id, in doubt)

    async def send(self, message: tether.OutboxMessage) -> None:
        self.sends.append((message.run_id, message.in_doubt))
        await asyncio.Event().wait()


class Flaky(tether.Sender):
    async def send(self, message: tether.OutboxMessage) -> None:
        raise RuntimeError("the receiver is down for maintenance")


@dataclass
class Setup:
    sender: Refuses = field(default_factory=Refuses)
    hangs: Hangs = field(default_factory=Hangs)
    gate: asyncio.Event = field(default_factory=asyncio.Event)  # holds the run `hold` running
    message_id: str = ""
    slot_run: str = ""


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    async with asyncio.timeout(15):
        while not await check():
            await asyncio.sleep(0.02)


@asynccontextmanager
async def ops_app(url: str, setup: Setup) -> AsyncIterator[tether.App]:
    """The App of the module docstring on `url`, open with its worker once every object the
    pages show exists."""
    built = tether.App(url, senders={DESTINATION: setup.sender, HANGS: setup.hangs,
                                     FLAKY: Flaky()})  # fmt: skip
    built.engine.settings = replace(built.engine.settings, poll_interval=0.05)
    built.outbox_retry = tether.Retry(max_attempts=5, initial_delay=timedelta(hours=1),
                                      max_delay=timedelta(hours=2))  # fmt: skip
    # Two starts an hour: `notify` and `hold` take them, so the queue's later runs stay due.
    built.queue(QUEUE, concurrency=3, worker_concurrency=2,
                rate=tether.Rate(2, per=timedelta(hours=1)))  # fmt: skip

    @built.step()
    async def wait_for_gate() -> str:
        await setup.gate.wait()
        return "opened"

    @built.workflow(queue=QUEUE)
    async def notify(n: int) -> None:
        await tether.outbox(DESTINATION, {"n": n})

    @built.workflow(queue=QUEUE)
    async def hold() -> str:
        return await wait_for_gate()

    @built.workflow()
    async def send_to(destination: str) -> None:  # outside the queue: runs at once
        await tether.outbox(destination, {"to": destination})

    @built.workflow()
    async def typed(n: int) -> int:
        return n

    @built.schedule("* * * * *", name=SCHEDULE)
    @built.workflow()
    async def tick(scheduled_at: datetime) -> str:
        return scheduled_at.isoformat()

    await built.open()
    store, now = built.engine.store, built.engine.clock.now()
    # Registered ten minutes ago (as by an earlier deploy): the worker starts the latest slot.
    await store.put_schedule(ScheduleSpec(SCHEDULE, "tick", "* * * * *", "UTC", "latest"),
                             now - 600)  # fmt: skip
    # Arguments its type hints refuse, as a row changed by hand leaves them: dead at once.
    await store.create_run(NewRun("dead-1", "typed", json.dumps({"args": [HOSTILE], "kwargs": {}}),
                                  None), now)  # fmt: skip
    async with built:
        await built.start(notify, 1, id="notify-1")
        await built.start(hold, id="hold-1")

        async def settled() -> bool:
            failed = await built.list_outbox(status="failed")
            held = await store.get_run("hold-1")
            dead = await store.get_run("dead-1")
            slots = [r for r in await built.list_runs(workflow="tick")
                     if r.status == "succeeded"]  # fmt: skip
            if slots:
                setup.slot_run = slots[0].id
            if failed:
                setup.message_id = failed[0].id
            return bool(failed and slots and held and held.status is RunStatus.RUNNING
                        and dead and dead.status is RunStatus.DEAD)  # fmt: skip

        await until(settled)
        for n in (2, 3):  # over the queue's rate: due, not claimed
            await built.start(notify, n, id=f"notify-{n}")
        try:
            yield built
        finally:
            setup.gate.set()


async def more_messages(app: tether.App, setup: Setup) -> dict[str, str]:
    """One message in doubt, one sending and one pending (due in an hour), by section: their
    ids. In doubt: a send whose claimer vanished (a worker row that never was) is claimed again
    by this App's worker, which sends it again, with its key, and hangs."""
    store = app.engine.store

    async def sending(run_id: str, in_doubt: bool) -> str:
        async def sent() -> bool:
            return (run_id, in_doubt) in setup.hangs.sends

        await until(sent)
        (found,) = await app.list_outbox(status="sending", run_id=run_id)
        return found.id

    await app.start("send_to", HANGS, id="doubt-1")
    doubtful = await sending("doubt-1", False)
    now = app.engine.clock.now()
    # Another claimer takes it (its claim expired, as far as this `now` says), then is gone.
    (taken,) = await store.claim_outbox("vanished-worker", now + 3600, now + 7200, 10)
    assert taken.id == doubtful
    assert await sending("doubt-1", True) == doubtful
    await app.start("send_to", HANGS, id="sending-1")
    plain = await sending("sending-1", False)
    await app.start("send_to", FLAKY, id="pending-1")

    async def retrying() -> bool:
        # Pending after its first send failed (due again in an hour), not pending before it:
        # a message is pending from its commit until the worker claims it.
        found = await app.list_outbox(status="pending", run_id="pending-1")
        return any(m.attempts >= 1 for m in found)

    await until(retrying)
    (pending,) = await app.list_outbox(status="pending", run_id="pending-1")
    return {"in-doubt": doubtful, "sending": plain, "pending": pending.id}

"""The outbox's delivery: a worker service that claims due messages, has each one's sender send
it (with the message's idempotency key), and records the outcome: delivered, pending again
after a retry delay, or failed. A message whose previous send has an unknown outcome (its
worker died mid-send) is reconciled by its sender, or sent again with the same key: never
under a new one. It executes no workflow code and touches the store only through the port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from tether.core.engine import Engine
from tether.core.outage import MISSING, retry_store
from tether.core.retry import Retry
from tether.errors import ConfigurationError, StepOutcomeUnknown
from tether.outbox.client import Client, shown
from tether.outbox.senders import DEFAULT_TIMEOUT, HttpSender, Sender
from tether.redact import redact_text
from tether.serde import encode_error
from tether.store.port.outbox import OutboxMessage, OutboxSettlement, OutboxStatus

if TYPE_CHECKING:
    from tether.core.worker import Worker

log = logging.getLogger("tether.outbox")

SERVICE = "tether-outbox"  # its name in Engine.services
BATCH = 32  # messages in flight at once, per worker
MIN_CLAIM = 60.0  # seconds a claim lasts at least (longer for senders with long timeouts)
HTTP = "http"  # the sender name that handles http(s):// destinations, if the App names one
OUTBOX_RETRY = Retry(
    max_attempts=10, initial_delay=timedelta(seconds=1), max_delay=timedelta(minutes=5)
)


class Delivery:
    """The App's senders and the loop that delivers its messages (Engine.services[SERVICE])."""

    def __init__(self, engine: Engine, senders: Mapping[str, Sender], retry: Retry) -> None:
        self.engine = engine
        self.senders = dict(senders)
        self.retry = retry
        self._default_http = HttpSender()
        # Approval webhooks' pooled connections (tether.approvals.notify), closed with the service.
        self.webhooks = Client("tether-webhook")
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- destinations -------------------------------------------------------------------------

    def resolve(self, destination: str) -> Sender:
        """The sender of `destination`: the App's sender of that name, else, for an http(s)://
        URL, the App's "http" sender or the built-in HttpSender. ConfigurationError else."""
        found = self.senders.get(destination)
        if found is not None:
            return found
        if destination.startswith(("https://", "http://")):
            return self.senders.get(HTTP, self._default_http)
        raise ConfigurationError(
            f"unknown outbox destination {destination!r}: name one of the App's senders "
            f"({sorted(self.senders) or 'none: pass App(senders={name: sender})'}) or give an "
            f"http(s):// URL"
        )

    def _timeout(self, sender: Sender) -> float:
        value = getattr(sender, "timeout", DEFAULT_TIMEOUT)
        return float(value) if isinstance(value, int | float) and value > 0 else DEFAULT_TIMEOUT

    def claim_seconds(self) -> float:
        """How long a claim lasts: longer than any sender's timeout, so a send in progress
        never outlives its claim."""
        longest = max((self._timeout(s) for s in self.senders.values()), default=0.0)
        return max(MIN_CLAIM, 2 * max(longest, self._timeout(self._default_http)) + 10.0)

    # -- wake-ups -----------------------------------------------------------------------------

    def wake(self) -> None:
        """A message committed in this process: look for due messages now."""
        event, loop = self._event, self._loop
        if event is None or loop is None:
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        else:
            with contextlib.suppress(RuntimeError):  # its loop has closed
                loop.call_soon_threadsafe(event.set)

    # -- the service --------------------------------------------------------------------------

    async def __call__(self, worker: Worker) -> None:
        self._loop, self._event = asyncio.get_running_loop(), asyncio.Event()
        event = self._event
        engine = self.engine
        store, clock, settings = engine.store, engine.clock, engine.settings
        inflight: set[asyncio.Task[None]] = set()

        def ended(task: asyncio.Task[None]) -> None:
            inflight.discard(task)
            event.set()  # room for another message

        try:
            while not worker.stopped:
                event.clear()
                due = None
                try:
                    room = BATCH - len(inflight)
                    due = await store.next_outbox_at() if room > 0 else None
                    now = clock.now()
                    if due is not None and due <= now:
                        claimed = await store.claim_outbox(
                            worker.id, now, now + self.claim_seconds(), room
                        )
                        for message in claimed:
                            task = asyncio.create_task(self._deliver(message))
                            inflight.add(task)
                            task.add_done_callback(ended)
                        if claimed:
                            continue
                        due = now + 0.01  # another worker took them: look again shortly
                except Exception as exc:
                    log.warning("outbox: looking for messages failed (%s); retrying", exc)
                    due = None
                timeout = settings.poll_interval
                if due is not None:
                    timeout = min(timeout, max(0.0, due - clock.now()) + 0.001)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await event.wait()
        finally:
            # Sends cut short stay `sending`: their outcome is unknown, so the next claim
            # reconciles them or sends them again with the same key.
            for task in inflight:
                task.cancel()
            await asyncio.gather(*inflight, return_exceptions=True)
            self._event = self._loop = None
            await self._close()

    async def _close(self) -> None:
        """End the HTTP senders' pooled connections (they open new ones when next used)."""
        owners: list[HttpSender | Client] = [self._default_http, self.webhooks]
        owners += [s for s in self.senders.values() if isinstance(s, HttpSender)]
        for owner in owners:
            try:
                await owner.aclose()
            except Exception as exc:
                log.warning("outbox: closing the connections of %r failed: %s", owner, exc)

    async def _deliver(self, message: OutboxMessage) -> None:
        """Send one claimed message and record how it went."""
        try:
            sender = self.resolve(message.destination)
        except ConfigurationError as exc:
            await self._settle(message, OutboxStatus.FAILED, error=exc)
            return
        policy = getattr(sender, "retry", None) or self.retry
        if message.in_doubt:
            verdict = await self._reconcile(sender, message)
            if verdict is True:
                log.info("outbox: message %s was delivered before (reconciled)", message.id)
                await self._settle(message, OutboxStatus.DELIVERED)
                return
            if message.attempts > policy.max_attempts:
                await self._settle(message, OutboxStatus.FAILED, error=StepOutcomeUnknown(
                    f"outbox message {message.id} (key {message.key}) to {_where(message)}: "
                    f"the outcome of {message.uncertain} of its {message.attempts - 1} sends is "
                    f"unknown (the worker died during them) and its retries are spent; check "
                    f"whether the receiver has it, then app.retry_outbox({message.id!r})"
                ))  # fmt: skip
                return
        error = await self._send(sender, message)
        if error is None:
            await self._settle(message, OutboxStatus.DELIVERED)
        elif policy.retries(error, message.attempts):
            delay = _delay(policy, error, message.attempts)
            log.warning("outbox: sending %s to %s failed (attempt %d), again in %.1fs: %s",
                        message.id, _where(message), message.attempts, delay,
                        redact_text(str(error)))  # fmt: skip
            next_at = self.engine.clock.now() + delay
            await self._settle(message, OutboxStatus.PENDING, error=error, next_at=next_at)
        else:
            log.error("outbox: message %s to %s failed for good after %d attempt(s): %s",
                      message.id, _where(message), message.attempts,
                      redact_text(str(error)))  # fmt: skip
            await self._settle(message, OutboxStatus.FAILED, error=error)

    async def _send(self, sender: Sender, message: OutboxMessage) -> Exception | None:
        """One send, within the sender's timeout: None if it was accepted, else the error."""
        timeout = self._timeout(sender)
        try:
            async with asyncio.timeout(timeout):
                await sender.send(message)
        except TimeoutError:
            return TimeoutError(
                f"sending outbox message {message.id} to {_where(message)} took longer "
                f"than {timeout}s"
            )
        except Exception as exc:
            return exc
        return None

    async def _reconcile(self, sender: Sender, message: OutboxMessage) -> bool | None:
        hook = getattr(sender, "reconcile", None)
        if hook is None:
            return None
        try:
            async with asyncio.timeout(self._timeout(sender)):
                verdict = await hook(message)
        except Exception as exc:
            log.warning("outbox: reconciling %s failed (%s); sending it again with its key",
                        message.id, exc)  # fmt: skip
            return None
        return verdict if isinstance(verdict, bool) else None

    async def _settle(
        self,
        message: OutboxMessage,
        status: OutboxStatus,
        *,
        error: BaseException | None = None,
        next_at: float | None = None,
    ) -> None:
        engine = self.engine
        text = None if error is None else json.dumps(encode_error(error))
        settlement = OutboxSettlement(status, next_at, text)

        async def call() -> bool:
            return await engine.store.settle_outbox(
                message.id, message.claim, settlement, engine.clock.now()
            )

        async def read_back() -> Any:
            return MISSING  # settling again is harmless: it is fenced by the claim

        try:
            recorded = await retry_store(engine, call, read_back)
        except Exception:  # the database stayed away: the claim expires, in doubt
            log.exception("outbox: could not record the outcome of %s", message.id)
            return
        if not recorded:
            log.warning(
                "outbox: message %s was claimed again before its send here ended (its claim "
                "expired); the other claim's outcome stands (both carry key %s)",
                message.id, message.key,
            )  # fmt: skip


def _where(message: OutboxMessage) -> str:
    """The destination as logs may show it: a URL without its credentials and query."""
    destination = message.destination
    return shown(destination) if destination.startswith(("https://", "http://")) else destination


def _delay(policy: Retry, error: Exception, attempts: int) -> float:
    delay = policy.delay(attempts, secrets.randbits(32) / (1 << 32))
    asked = getattr(error, "retry_after", None)  # a receiver that says when to come back
    if isinstance(asked, int | float) and not isinstance(asked, bool) and asked > delay:
        delay = float(asked)
    return delay

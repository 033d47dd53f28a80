"""The trail of actions: what people did to runs and messages (cancel, resume, an event sent, a
fork, an outbox retry, a sign-in), who did it, through what (page, api, cli) and from where,
and whether it was done or refused. The server's pages and API and the CLI write it through
`record`; GET /api/actions and the run page read it. Durable and append only: nothing here
changes or deletes an entry, and every text is redacted before it is written.
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from tether.clock import to_datetime
from tether.errors import StoreUnavailable, TetherError
from tether.redact import redact_text
from tether.store.port.actions import NEWEST, ActionRecord

if TYPE_CHECKING:
    from tether.app import App

Via = Literal["page", "api", "cli"]
MAX_DETAIL = 2000  # characters of a detail kept (an error, an event's key, a fork's new run)
MAX_FIELD = 512  # of an actor or a client (names and addresses are shorter)


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts: a user's name (the CLI: `cli:<login>`), through what, from which address."""

    name: str
    via: Via
    client: str

    @classmethod
    def cli(cls) -> Actor:
        """The person at this terminal: their login on this host (the CLI has no user of its
        own: it opens the database directly)."""
        try:
            login = getpass.getuser()
        except (KeyError, OSError):  # no login name for this uid (a container)
            login = "unknown"
        return cls(f"cli:{login}", "cli", socket.gethostname())


@dataclass(frozen=True, slots=True)
class ActionInfo:
    """One entry of the trail, as people read it."""

    id: int
    at: datetime
    actor: str
    via: str
    client: str
    action: str
    subject: str
    outcome: str
    detail: str

    @classmethod
    def of(cls, record: ActionRecord) -> ActionInfo:
        return cls(**{**asdict(record), "at": to_datetime(record.at)})


def about_event(key: str) -> str:
    """The detail of an event sent, wherever it was sent from (its payload is not kept)."""
    return f"event {key!r}"


def about_fork(from_step: str, new_run: str | None = None) -> str:
    """The detail of a fork: its step, and once it is made, its new run."""
    said = f"from step {from_step!r}"
    return said if new_run is None else f"{said}: new run {new_run}"


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def record(
    app: App,
    actor: Actor,
    action: str,
    subject: str,
    *,
    refused: str | None = None,
    detail: str = "",
) -> int:
    """Append one action to the trail: done, or refused with the reason `refused` (which
    becomes its detail). Every text is redacted and bounded first. Its id."""
    said = detail if refused is None else refused
    entry = ActionRecord(
        at=app.engine.clock.now(),
        actor=_bounded(redact_text(actor.name), MAX_FIELD),
        via=actor.via,
        client=_bounded(redact_text(actor.client), MAX_FIELD),
        action=action,
        subject=subject,  # an id or a name, bounded where it was taken in
        outcome="done" if refused is None else "refused",
        detail=_bounded(redact_text(said), MAX_DETAIL),
    )
    return await app.engine.store.record_action(entry)


@dataclass(slots=True)
class Said:
    """What an action says of itself once done (a fork's new run), set inside `recorded`."""

    detail: str = ""


@asynccontextmanager
async def recorded(
    app: App, actor: Actor, action: str, subject: str, *, detail: str = ""
) -> AsyncIterator[Said]:
    """The action in the block, recorded once it is over: done, or refused when the library
    refused it (a TetherError, re-raised, its message the reason). Anything else (a lost
    connection, a crash) records nothing: the action's outcome is not known."""
    said = Said(detail)
    try:
        yield said
    except StoreUnavailable:
        raise  # not a refusal: whether it was done is not known
    except TetherError as exc:
        await record(
            app, actor, action, subject, refused=f"{detail}: {exc}" if detail else str(exc)
        )
        raise
    await record(app, actor, action, subject, detail=said.detail)


async def list_actions(
    app: App,
    *,
    subject: str | None = None,
    actor: str | None = None,
    before: int = NEWEST,
    limit: int = 100,
) -> list[ActionInfo]:
    """Entries of the trail, newest first (below the id `before`): on `subject` (a run id, a
    message id, a user name), by `actor`, both, or all."""
    found = await app.engine.store.list_actions(subject=subject, actor=actor, before=before,
                                                limit=limit)  # fmt: skip
    return [ActionInfo.of(r) for r in found]

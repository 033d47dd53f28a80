"""The actions part of the Store port: the trail of what people did to runs and messages from
the pages, the API or the CLI (who, through what, from where, to what, with what outcome).
Append only: nothing here changes or deletes a row. It must not import tether.core or any
backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

NEWEST = 2**62  # a `before` cursor past every id: the listing from its newest row


@dataclass(frozen=True, slots=True)
class ActionRecord:
    """One action taken: `id` is 0 until the store has written it."""

    at: float
    actor: str  # a user's name, or cli:<login>
    via: str  # page, api or cli
    client: str  # the client's address (the CLI: its host)
    action: str  # cancel, resume, send, fork, retry, sign-in, sign-out
    subject: str  # a run id, an outbox message id, or a user name
    outcome: str  # done or refused
    detail: str  # redacted by the caller
    id: int = 0


class ActionsPort(Protocol):
    """The trail of actions."""

    async def record_action(self, action: ActionRecord) -> int:
        """Append the action; its id (increasing: a later action has a greater id)."""

    async def list_actions(
        self,
        *,
        subject: str | None = None,
        actor: str | None = None,
        before: int = NEWEST,
        limit: int = 100,
    ) -> list[ActionRecord]:
        """Actions with an id below `before`, newest first, at most `limit`: those on `subject`
        when it is given (and by `actor` too, when both are), else those by `actor`, else all."""

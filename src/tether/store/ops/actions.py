"""The operations on the trail of actions: append one, list them newest first by subject, by
actor or all (keyset on id).

Written once for both SQL dialects; it must not touch a connection or a driver.
"""

from __future__ import annotations

from tether.store.port.actions import ActionRecord
from tether.store.query import Op, one, select


def record_action(action: ActionRecord) -> Op[int]:
    row = yield from one(
        "insert_action",
        at=action.at,
        actor=action.actor,
        via=action.via,
        client=action.client,
        action=action.action,
        subject=action.subject,
        outcome=action.outcome,
        detail=action.detail,
    )
    assert row is not None  # RETURNING gives the row it inserted
    return int(row[0])


def list_actions(
    subject: str | None, actor: str | None, before: int, limit: int
) -> Op[list[ActionRecord]]:
    # One query per index: a subject's (with or without its actor), an actor's, or the id's.
    if subject is not None and actor is not None:
        name, params = "list_actions_of_subject_by_actor", {"subject": subject, "actor": actor}
    elif subject is not None:
        name, params = "list_actions_of_subject", {"subject": subject}
    elif actor is not None:
        name, params = "list_actions_of_actor", {"actor": actor}
    else:
        name, params = "list_actions", {}
    rows = yield from select(name, before=before, limit=limit, **params)
    return [ActionRecord(r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], int(r[0])) for r in rows]

"""What a notification says about an approval (the email and Slack notifiers share it): the
title, what is asked, the options, who decides, the expiry and the deep link to the inbox page
`{public_url}/approvals/{id}`, taken from the approval's redacted fields, never its operation or
context. It builds text only: escaping for a medium is the notifier's, and it sends nothing.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote, urlsplit

from tether.approvals.model import Approval, Decision
from tether.errors import ConfigurationError
from tether.redact import redact_text
from tether.text import visible

PUBLIC_URL_ENV = "TETHER_PUBLIC_URL"
TITLE_LIMIT = 200  # characters of a title in a subject or a chat line; the page shows the rest
TEXT_LIMIT = 2000  # characters of a description in a notification


def public_url_of(public_url: str | None, who: str) -> str:
    """The inbox's public origin (and path prefix) from the argument or $TETHER_PUBLIC_URL,
    checked: http(s), a host, no query, fragment or characters a link must not hold."""
    given = public_url if public_url is not None else os.environ.get(PUBLIC_URL_ENV, "")
    if not given:
        raise ConfigurationError(
            f"{who} needs the inbox's public URL for the link to each approval: pass "
            f"public_url='https://tether.example.com' or set ${PUBLIC_URL_ENV} (the address "
            f"where reviewers reach `tether serve`)"
        )
    parts = urlsplit(given)
    bad = set(given) & set("<>&\"'`\\ |{}^") or any(ord(c) < 33 or ord(c) > 126 for c in given)
    if parts.scheme not in ("http", "https") or not parts.hostname or bad:
        raise ConfigurationError(
            f"{who}: public_url is an http(s) URL such as https://tether.example.com, not "
            f"{given[:80]!r}"
        )
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ConfigurationError(
            f"{who}: public_url holds no credentials, query or fragment: the link to an "
            f"approval is public_url + /approvals/<id>"
        )
    return given.rstrip("/")


def link(public_url: str, approval_id: str) -> str:
    """The inbox page where a reviewer decides this approval (quoted: an id is plain ASCII
    today, but a link must never be made of raw text)."""
    return f"{public_url}/approvals/{quote(approval_id, safe='')}"


def clean(text: str, limit: int, *, one_line: bool = True) -> str:
    """Text from an approval, fit to show: secrets redacted again (the title and description
    were redacted when stored; a comment or a reviewer's name is cheap to check twice), control
    and invisible characters spelled out, so a title cannot forge a header or a line."""
    shown = visible(redact_text(text), newlines=not one_line)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


@dataclass(frozen=True, slots=True)
class Summary:
    """The approval as a notification tells it, every field cleaned (see `clean`)."""

    approval_id: str
    run_id: str
    title: str
    description: str
    options: tuple[str, ...]  # "Approve (approve)"
    reviewers: tuple[str, ...]
    expires: str
    link: str

    @classmethod
    def of(cls, approval: Approval, public_url: str) -> Summary:
        return cls(
            approval_id=approval.id,
            run_id=clean(approval.run_id, TITLE_LIMIT),
            title=clean(approval.title, TITLE_LIMIT),
            description=clean(approval.description, TEXT_LIMIT, one_line=False),
            options=tuple(f"{clean(o.label, 80)} ({o.id})" for o in approval.options),
            reviewers=tuple(clean(r, 80) for r in approval.reviewers),
            expires=when(approval.expires_at),
            link=link(public_url, approval.id),
        )


def outcome(decision: Decision) -> str:
    """One line saying how an approval ended: "approved: approve by alice"."""
    # A quorum's approval is everyone's who approved; any other ending is the decider's.
    quorum = decision.approved and len(decision.approvers) > 1
    who = ", ".join(decision.approvers) if quorum else decision.reviewer
    if decision.status in ("expired", "cancelled"):
        return decision.status if who is None else f"{decision.status} by {clean(who, 200)}"
    option = decision.option or decision.status
    by = clean(who, 200) if who else "nobody"
    return f"{decision.status}: {clean(option, 64)} by {by}"


def event_key(approval: Approval, event: str) -> str:
    """What names one notification of one approval, the same on every retry of its step. The
    creation time is in it: a run id used again after its run was purged makes an approval with
    the same id, whose notifications are new ones."""
    return f"{approval.id}.{round(approval.created_at.timestamp() * 1000)}.{event}"


class Sent:
    """Keys of the notifications a notifier delivered in this process, so that the retry of a
    notify step another notifier failed does not send them twice. A crash forgets them: the
    notify step is at least once, and receivers dedupe on the key (Message-ID, header)."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._keys: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def add(self, key: str) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self.limit:
            self._keys.popitem(last=False)

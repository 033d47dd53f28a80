"""Human approvals: a durable question to people, bound to the exact operation it shows,
decided once by someone allowed to, expiring closed, and audited in a hash-chained trail.

model (the shapes), rules (how a decision is judged, atomically in the store), flow (the
workflow side), manage (the App side), notify (notifiers and webhooks), message, mail and slack
(what a notification says; the email and chat notifiers). Sits above tether.core; it never
imports a backend, a web framework or the CLI.
"""

from tether.approvals.flow import approval
from tether.approvals.mail import EmailNotifier
from tether.approvals.model import (
    APPROVE_REJECT,
    Approval,
    Decision,
    HistoryEntry,
    Option,
    Reviewer,
    operation_digest,
)
from tether.approvals.notify import LogNotifier, Notifier, Webhook
from tether.approvals.slack import SlackNotifier

__all__ = [
    "APPROVE_REJECT",
    "Approval",
    "Decision",
    "EmailNotifier",
    "HistoryEntry",
    "LogNotifier",
    "Notifier",
    "Option",
    "Reviewer",
    "SlackNotifier",
    "Webhook",
    "approval",
    "operation_digest",
]

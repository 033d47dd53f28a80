"""Transactions and the outbox: `@app.transaction()` steps whose business writes commit with
their checkpoint, `tether.outbox(destination, payload)` messages committed with a checkpoint,
and the worker service that delivers them by key through pluggable senders (HTTP built in).

record (recording a message), delivery (the service), senders, mixin (the App's methods).
It must not import a backend, the server or the CLI.
"""

from __future__ import annotations

from tether.core.transaction import Transaction
from tether.outbox.delivery import OUTBOX_RETRY, Delivery
from tether.outbox.mixin import OutboxMixin
from tether.outbox.record import Outgoing, outbox
from tether.outbox.senders import HttpError, HttpSender, Sender
from tether.store.port.outbox import OutboxMessage, OutboxStatus

__all__ = [
    "OUTBOX_RETRY",
    "Delivery",
    "HttpError",
    "HttpSender",
    "OutboxMessage",
    "OutboxMixin",
    "OutboxStatus",
    "Outgoing",
    "Sender",
    "Transaction",
    "outbox",
]

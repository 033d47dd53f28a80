"""Webhook signatures: sign a delivery's body, and let receivers reject forged or replayed ones.

The header is Stripe-style, ``Tether-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>``, over
``f"{t}.".encode() + body``. This module only computes and checks signatures: it sends nothing,
reads no clock (callers pass ``timestamp`` and ``now``) and imports only tether.errors.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from tether.errors import ConfigurationError, TetherError

SIGNATURE_HEADER = "Tether-Signature"
DEFAULT_TOLERANCE = 300.0  # seconds either side of `now`; wider lets captured deliveries replay

# int() alone would take "+5", " 5", non-ASCII digits, and raise on 5000-digit strings.
_SECONDS = re.compile(r"[0-9]{1,15}")


class WebhookSignatureError(TetherError):
    """The webhook signature is not valid; reject the delivery (do not process it)."""


def _key(secret: str | bytes) -> bytes:
    if not secret:
        raise ConfigurationError(
            "the webhook secret is empty; pass the secret shared with the receiver"
        )
    return secret.encode() if isinstance(secret, str) else secret


def _digest(key: bytes, body: bytes, timestamp: int) -> str:
    return hmac.new(key, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret: str | bytes, body: bytes, timestamp: int) -> str:
    """The Tether-Signature header value for this body, sent at `timestamp` (unix seconds)."""
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise ConfigurationError(f"timestamp must be whole unix seconds >= 0, not {timestamp!r}")
    return f"t={timestamp},v1={_digest(_key(secret), body, timestamp)}"


def verify(
    secret: str | bytes,
    body: bytes,
    header: str,
    *,
    now: float,
    tolerance: float = DEFAULT_TOLERANCE,
) -> int:
    """Check a Tether-Signature header against the raw body; return its timestamp if valid.

    Several v1= entries are accepted (secret rotation: any match wins); unknown schemes are
    ignored. The timestamp must be within `tolerance` seconds of `now`, which bounds replays.
    Raises WebhookSignatureError saying what was wrong, ConfigurationError for an empty secret.
    """
    key = _key(secret)
    if tolerance < 0:
        raise ConfigurationError(f"tolerance must be >= 0 seconds, not {tolerance!r}")
    timestamp, signatures = _parse(header)
    expected = _digest(key, body, timestamp).encode()
    # Check every entry, without stopping early, so timing does not tell which one matched.
    matched = False
    for candidate in signatures:
        matched |= hmac.compare_digest(expected, candidate.encode())
    if not matched:
        raise WebhookSignatureError(
            "webhook signature mismatch: the body was altered or signed with another secret;"
            " reject the delivery"
        )
    age = now - timestamp
    if age > tolerance:
        raise WebhookSignatureError(
            f"webhook timestamp is too old ({age:.0f}s > {tolerance:.0f}s tolerance):"
            " a replay or a badly delayed delivery; reject it"
        )
    if -age > tolerance:
        raise WebhookSignatureError(
            f"webhook timestamp is too far in the future ({-age:.0f}s > {tolerance:.0f}s"
            " tolerance); check the sender's and receiver's clocks"
        )
    return timestamp


def _parse(header: str) -> tuple[int, list[str]]:
    timestamps: list[str] = []
    signatures: list[str] = []
    for item in header.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep or not name:
            raise WebhookSignatureError(
                f"malformed {SIGNATURE_HEADER} header: expected 't=<seconds>,v1=<hex>'"
            )
        if name == "t":
            timestamps.append(value)
        elif name == "v1":
            signatures.append(value)
    if len(timestamps) != 1 or not _SECONDS.fullmatch(timestamps[0]):
        raise WebhookSignatureError(
            f"malformed {SIGNATURE_HEADER} header: it needs exactly one t=<unix seconds>"
        )
    if not signatures:
        raise WebhookSignatureError(
            f"{SIGNATURE_HEADER} header has no v1 signature; it was not signed by Tether"
        )
    return int(timestamps[0]), signatures


__all__ = [
    "DEFAULT_TOLERANCE",
    "SIGNATURE_HEADER",
    "WebhookSignatureError",
    "sign",
    "verify",
]

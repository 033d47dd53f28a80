"""Webhook signatures in the Standard Webhooks format (https://www.standardwebhooks.com/): sign a
delivery, and let receivers reject forged or replayed ones. Receivers may equally verify with
any Standard Webhooks library (the `standardwebhooks` package and others).

Headers ``webhook-id`` (the delivery's idempotency key), ``webhook-timestamp`` (unix seconds) and
``webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``: the key is inside
what is signed. This module only computes and checks signatures: it sends nothing, reads no
clock (callers pass ``timestamp`` and ``now``) and imports only tether.errors.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Mapping
from typing import Protocol

from tether.errors import ConfigurationError, TetherError

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
DEFAULT_TOLERANCE = 300.0  # seconds either side of `now`; wider lets captured deliveries replay
SECRET_PREFIX = "whsec_"  # noqa: S105 (a prefix, not a secret): base64 key bytes follow
MIN_SECRET = 16  # bytes of key at least

# int() alone would take "+5", " 5", non-ASCII digits, and raise on 5000-digit strings.
_SECONDS = re.compile(r"[0-9]{1,15}")
# A webhook-id travels in a header and is signed as text: visible ASCII only, bounded.
_ID = re.compile(r"[\x21-\x7e]{1,256}")
_MAX_SIGNATURES = 32  # entries in one webhook-signature header (rotation needs a few)


class WebhookSignatureError(TetherError):
    """The webhook signature is not valid; reject the delivery (do not process it)."""


class Headers(Protocol):
    """What receivers hold their request's headers in: a dict, starlette's or httpx's Headers,
    http.server's message: anything with `get(name)`."""

    def get(self, name: str, /) -> str | None: ...


def key(secret: str | bytes) -> bytes:
    """The HMAC key of a secret: ``whsec_<base64>`` decoded as the spec says, any other str as
    its UTF-8 bytes, bytes as they are. ConfigurationError for an empty or undecodable one."""
    if not secret:
        raise ConfigurationError(
            "the webhook secret is empty; pass the secret shared with the receiver"
        )
    if isinstance(secret, bytes):
        return secret
    if not isinstance(secret, str):
        raise ConfigurationError(f"a webhook secret is a str or bytes, not {type(secret).__name__}")
    if secret.startswith(SECRET_PREFIX):
        try:
            decoded = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
        except (binascii.Error, ValueError):
            raise ConfigurationError(
                "the webhook secret starts with whsec_ but the rest is not base64; give the "
                "secret exactly as the receiver shows it, or a raw secret without the prefix"
            ) from None
        if not decoded:
            raise ConfigurationError("the webhook secret whsec_ holds no bytes")
        return decoded
    return secret.encode()


def check_secret(secret: object, what: str) -> None:
    """ConfigurationError unless `secret` is a str whose key has at least MIN_SECRET bytes."""
    if not isinstance(secret, str) or len(key(secret)) < MIN_SECRET:
        raise ConfigurationError(
            f"{what} secret is a str of at least {MIN_SECRET} characters (or whsec_ and the "
            f"base64 of at least {MIN_SECRET} bytes)"
        )


def _digest(secret: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return base64.b64encode(hmac.new(secret, signed, hashlib.sha256).digest()).decode()


def sign(secret: str | bytes, webhook_id: str, body: bytes, timestamp: int) -> str:
    """The webhook-signature header value (``v1,<base64>``) of this delivery."""
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise ConfigurationError(f"timestamp must be whole unix seconds >= 0, not {timestamp!r}")
    if not isinstance(webhook_id, str) or not _ID.fullmatch(webhook_id):
        raise ConfigurationError(
            f"a webhook-id is 1-256 visible ASCII characters (no spaces): {webhook_id!r}"
        )
    return f"v1,{_digest(key(secret), webhook_id, timestamp, body)}"


def headers(secret: str | bytes, webhook_id: str, body: bytes, timestamp: int) -> dict[str, str]:
    """The three headers of a signed delivery: webhook-id, webhook-timestamp, webhook-signature."""
    return {
        ID_HEADER: webhook_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, webhook_id, body, timestamp),
    }


def verify(
    secret: str | bytes,
    body: bytes,
    headers: Headers | Mapping[str, str],
    *,
    now: float,
    tolerance: float = DEFAULT_TOLERANCE,
) -> str:
    """Check a delivery's Standard Webhooks headers against its raw body; return its
    webhook-id (the idempotency key: dedupe on it) if valid.

    Several space-separated signatures are accepted (secret rotation: any v1 match wins);
    other versions are ignored. The timestamp must be within `tolerance` seconds of `now`,
    which bounds replays. Raises WebhookSignatureError saying what was wrong,
    ConfigurationError for an empty secret.
    """
    secret_key = key(secret)
    if tolerance < 0:
        raise ConfigurationError(f"tolerance must be >= 0 seconds, not {tolerance!r}")
    webhook_id, timestamp, signatures = _parse(headers)
    expected = _digest(secret_key, webhook_id, timestamp, body).encode()
    # Check every entry, without stopping early, so timing does not tell which one matched.
    matched = False
    for candidate in signatures:
        matched |= hmac.compare_digest(expected, candidate.encode())
    if not matched:
        raise WebhookSignatureError(
            "webhook signature mismatch: the body, id or timestamp was altered, or it was signed"
            " with another secret; reject the delivery"
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
    return webhook_id


def _header(headers: Headers | Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None and isinstance(headers, Mapping):  # a plain dict keeps the sender's case
        value = next((v for k, v in headers.items() if str(k).lower() == name), None)
    if value is None:
        raise WebhookSignatureError(
            f"the delivery has no {name} header; it was not sent in the Standard Webhooks format"
        )
    return str(value)


def _parse(headers: Headers | Mapping[str, str]) -> tuple[str, int, list[str]]:
    webhook_id = _header(headers, ID_HEADER).strip()
    if not _ID.fullmatch(webhook_id):
        raise WebhookSignatureError(
            f"malformed {ID_HEADER} header: 1-256 visible ASCII characters expected"
        )
    seconds = _header(headers, TIMESTAMP_HEADER).strip()
    if not _SECONDS.fullmatch(seconds):
        raise WebhookSignatureError(
            f"malformed {TIMESTAMP_HEADER} header: whole unix seconds expected"
        )
    entries = _header(headers, SIGNATURE_HEADER).split()
    if not entries or len(entries) > _MAX_SIGNATURES:
        raise WebhookSignatureError(
            f"malformed {SIGNATURE_HEADER} header: expected 'v1,<base64>' entries separated by "
            f"spaces (1 to {_MAX_SIGNATURES})"
        )
    signatures: list[str] = []
    for entry in entries:
        version, sep, value = entry.partition(",")
        if not sep or not version:
            raise WebhookSignatureError(
                f"malformed {SIGNATURE_HEADER} header: each entry is '<version>,<signature>'"
            )
        if version == "v1":
            signatures.append(value)
    if not signatures:
        raise WebhookSignatureError(
            f"{SIGNATURE_HEADER} header has no v1 signature; it was not signed with a shared secret"
        )
    return webhook_id, int(seconds), signatures


__all__ = [
    "DEFAULT_TOLERANCE",
    "ID_HEADER",
    "SECRET_PREFIX",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "Headers",
    "WebhookSignatureError",
    "check_secret",
    "headers",
    "key",
    "sign",
    "verify",
]

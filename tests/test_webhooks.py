"""Tests for tether.webhooks: the header format is pinned, and forged, tampered, replayed and
malformed deliveries are rejected with a message saying why."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from tether.errors import ConfigurationError, TetherError
from tether.webhooks import SIGNATURE_HEADER, WebhookSignatureError, sign, verify

SECRET = "whsec_test"
BODY = b'{"run_id":"r1"}'
T = 1_700_000_000
# Computed once with `hmac.new(b"whsec_test", b"1700000000." + BODY, hashlib.sha256)`.
KNOWN_V1 = "2f968c749c27df9501758a9f038da504a81a51cfcab8bc95bdc210cdf4c061f2"


def test_the_header_format_is_pinned_by_a_known_vector() -> None:
    independent = hmac.new(SECRET.encode(), f"{T}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert independent == KNOWN_V1
    assert sign(SECRET, BODY, T) == f"t={T},v1={KNOWN_V1}"
    assert SIGNATURE_HEADER == "Tether-Signature"


def test_a_signed_body_verifies_and_returns_its_timestamp() -> None:
    header = sign(SECRET, BODY, T)
    assert verify(SECRET, BODY, header, now=T + 10) == T
    assert verify(SECRET, BODY, header, now=T) == T


def test_bytes_and_str_secrets_are_the_same_secret() -> None:
    assert sign(SECRET.encode(), BODY, T) == sign(SECRET, BODY, T)
    assert verify(SECRET.encode(), BODY, sign(SECRET, BODY, T), now=T) == T


def test_a_tampered_body_is_rejected() -> None:
    header = sign(SECRET, BODY, T)
    with pytest.raises(WebhookSignatureError, match="signature mismatch"):
        verify(SECRET, b'{"run_id":"r2"}', header, now=T)


def test_a_wrong_secret_is_rejected() -> None:
    header = sign("another-secret", BODY, T)
    with pytest.raises(WebhookSignatureError, match="signature mismatch"):
        verify(SECRET, BODY, header, now=T)


def test_a_forged_timestamp_breaks_the_signature() -> None:
    header = f"t={T + 1},v1={KNOWN_V1}"
    with pytest.raises(WebhookSignatureError, match="signature mismatch"):
        verify(SECRET, BODY, header, now=T)


def test_an_old_delivery_is_rejected_as_a_replay() -> None:
    header = sign(SECRET, BODY, T)
    assert verify(SECRET, BODY, header, now=T + 300) == T  # the edge is still inside
    with pytest.raises(WebhookSignatureError, match="too old"):
        verify(SECRET, BODY, header, now=T + 301)
    with pytest.raises(WebhookSignatureError, match="too old"):
        verify(SECRET, BODY, header, now=T + 61, tolerance=60)


def test_a_timestamp_too_far_in_the_future_is_rejected() -> None:
    header = sign(SECRET, BODY, T)
    assert verify(SECRET, BODY, header, now=T - 300) == T
    with pytest.raises(WebhookSignatureError, match="future"):
        verify(SECRET, BODY, header, now=T - 301)


def test_any_matching_v1_signature_wins_for_secret_rotation() -> None:
    old = sign("old-secret", BODY, T).split("v1=")[1]
    header = f"t={T},v1={old},v1={KNOWN_V1}"
    assert verify(SECRET, BODY, header, now=T) == T
    assert verify("old-secret", BODY, header, now=T) == T
    with pytest.raises(WebhookSignatureError, match="signature mismatch"):
        verify("third-secret", BODY, header, now=T)


def test_unknown_schemes_and_spaces_are_tolerated() -> None:
    header = f"t={T}, v0=deadbeef, v1={KNOWN_V1}"
    assert verify(SECRET, BODY, header, now=T) == T


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (f"v1={KNOWN_V1}", "exactly one t="),
        (f"t=,v1={KNOWN_V1}", "exactly one t="),
        (f"t=abc,v1={KNOWN_V1}", "exactly one t="),
        (f"t=1.5e9,v1={KNOWN_V1}", "exactly one t="),
        (f"t=-5,v1={KNOWN_V1}", "exactly one t="),
        (f"t=+{T},v1={KNOWN_V1}", "exactly one t="),
        (f"t={'9' * 5000},v1={KNOWN_V1}", "exactly one t="),
        (f"t={T},t={T},v1={KNOWN_V1}", "exactly one t="),
        (f"t={T}", "no v1 signature"),
        (f"t={T},v0={KNOWN_V1}", "no v1 signature"),
        ("", "malformed"),
        ("garbage", "malformed"),
        (f"t={T};v1={KNOWN_V1}", "malformed"),
        (f"t={T},,v1={KNOWN_V1}", "malformed"),
        (f"t={T},=x,v1={KNOWN_V1}", "malformed"),
    ],
)
def test_malformed_headers_are_rejected_saying_why(header: str, message: str) -> None:
    with pytest.raises(WebhookSignatureError, match=message):
        verify(SECRET, BODY, header, now=T)


@pytest.mark.parametrize("candidate", ["", "zz", "é" * 64, KNOWN_V1.upper(), KNOWN_V1[:-1]])
def test_v1_values_that_are_not_the_exact_signature_are_a_mismatch(candidate: str) -> None:
    with pytest.raises(WebhookSignatureError, match="signature mismatch"):
        verify(SECRET, BODY, f"t={T},v1={candidate}", now=T)


def test_the_error_is_a_tether_error() -> None:
    assert issubclass(WebhookSignatureError, TetherError)


@pytest.mark.parametrize("secret", ["", b""])
def test_an_empty_secret_is_refused_when_signing_and_verifying(secret: str | bytes) -> None:
    with pytest.raises(ConfigurationError, match="secret is empty"):
        sign(secret, BODY, T)
    with pytest.raises(ConfigurationError, match="secret is empty"):
        verify(secret, BODY, f"t={T},v1={KNOWN_V1}", now=T)


@pytest.mark.parametrize("timestamp", [-1, 1.5, True])
def test_a_timestamp_that_is_not_whole_seconds_is_refused_when_signing(timestamp: int) -> None:
    with pytest.raises(ConfigurationError, match="timestamp"):
        sign(SECRET, BODY, timestamp)


def test_a_negative_tolerance_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="tolerance"):
        verify(SECRET, BODY, sign(SECRET, BODY, T), now=T, tolerance=-1)

"""Tests for tether.webhooks: the Standard Webhooks format is pinned by the spec's own example
vector (checked by an independent re-implementation here), and forged, tampered, replayed and
malformed deliveries are rejected with a message saying why."""

from __future__ import annotations

import base64
import hashlib
import hmac
from email.message import Message

import pytest

from tether.errors import ConfigurationError, TetherError
from tether.webhooks import (
    ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookSignatureError,
    check_secret,
    headers,
    key,
    sign,
    verify,
)

# The example of the Standard Webhooks specification (and of its reference libraries' tests).
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_T = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

SECRET = "a-raw-secret-of-32-characters-xx"
ID = "tether-0123456789abcdef"
BODY = b'{"run_id":"r1"}'
T = 1_700_000_000


def spec_signature(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The spec's algorithm written out here, apart from tether's code."""
    raw = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(raw, webhook_id.encode() + b"." + str(timestamp).encode() + b"." + body,
                   hashlib.sha256)  # fmt: skip
    return "v1," + base64.b64encode(mac.digest()).decode()


def signed(secret: str | bytes = SECRET, webhook_id: str = ID, body: bytes = BODY,
           timestamp: int = T) -> dict[str, str]:  # fmt: skip
    return headers(secret, webhook_id, body, timestamp)


def test_the_spec_example_vector_is_reproduced_by_the_independent_implementation_and_tether() -> (
    None
):
    assert spec_signature(SPEC_SECRET, SPEC_ID, SPEC_T, SPEC_BODY) == SPEC_SIGNATURE
    assert sign(SPEC_SECRET, SPEC_ID, SPEC_BODY, SPEC_T) == SPEC_SIGNATURE
    given = {ID_HEADER: SPEC_ID, TIMESTAMP_HEADER: str(SPEC_T), SIGNATURE_HEADER: SPEC_SIGNATURE}
    assert verify(SPEC_SECRET, SPEC_BODY, given, now=SPEC_T + 1) == SPEC_ID


def test_the_header_names_are_the_standard_ones() -> None:
    assert (ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER) == (
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    )
    assert signed() == {
        "webhook-id": ID,
        "webhook-timestamp": str(T),
        "webhook-signature": sign(SECRET, ID, BODY, T),
    }


def test_a_raw_secret_is_its_utf8_bytes_and_a_whsec_secret_is_base64() -> None:
    assert key(SECRET) == SECRET.encode() == key(SECRET.encode())
    assert key("whsec_" + base64.b64encode(b"k" * 24).decode()) == b"k" * 24
    raw_as_whsec = "whsec_" + base64.b64encode(SECRET.encode()).decode()
    assert sign(raw_as_whsec, ID, BODY, T) == sign(SECRET, ID, BODY, T)


@pytest.mark.parametrize("secret", ["whsec_not base64!", "whsec_", "whsec_====", 42])
def test_a_malformed_secret_is_refused_saying_why(secret: object) -> None:
    with pytest.raises(ConfigurationError, match="secret"):
        key(secret)  # type: ignore[arg-type]


def test_a_short_secret_is_refused_for_senders() -> None:
    with pytest.raises(ConfigurationError, match="at least 16"):
        check_secret("short", "a webhook")
    with pytest.raises(ConfigurationError, match="at least 16"):
        check_secret("whsec_" + base64.b64encode(b"k" * 8).decode(), "a webhook")
    check_secret(SECRET, "a webhook")


def test_a_signed_delivery_verifies_and_returns_its_id() -> None:
    assert verify(SECRET, BODY, signed(), now=T + 10) == ID
    assert verify(SECRET, BODY, signed(), now=T) == ID


def test_headers_are_found_whatever_their_case_and_container() -> None:
    upper = {k.title(): v for k, v in signed().items()}
    assert verify(SECRET, BODY, upper, now=T) == ID
    message = Message()
    for name, value in upper.items():
        message[name] = value
    assert verify(SECRET, BODY, message, now=T) == ID


def test_a_tampered_body_is_rejected() -> None:
    with pytest.raises(WebhookSignatureError, match="signature mismatch"):
        verify(SECRET, b'{"run_id":"r2"}', signed(), now=T)


def test_a_wrong_secret_is_rejected() -> None:
    with pytest.raises(WebhookSignatureError, match="signature mismatch"):
        verify(SECRET, BODY, signed("another-secret-of-enough-length"), now=T)


def test_the_id_is_inside_what_is_signed() -> None:
    forged = {**signed(), ID_HEADER: "tether-another-key"}
    with pytest.raises(WebhookSignatureError, match="signature mismatch"):
        verify(SECRET, BODY, forged, now=T)


def test_a_forged_timestamp_breaks_the_signature() -> None:
    forged = {**signed(), TIMESTAMP_HEADER: str(T + 1)}
    with pytest.raises(WebhookSignatureError, match="signature mismatch"):
        verify(SECRET, BODY, forged, now=T)


def test_an_old_delivery_is_rejected_as_a_replay() -> None:
    assert verify(SECRET, BODY, signed(), now=T + 300) == ID  # the edge is still inside
    with pytest.raises(WebhookSignatureError, match="too old"):
        verify(SECRET, BODY, signed(), now=T + 301)
    with pytest.raises(WebhookSignatureError, match="too old"):
        verify(SECRET, BODY, signed(), now=T + 61, tolerance=60)


def test_a_timestamp_too_far_in_the_future_is_rejected() -> None:
    assert verify(SECRET, BODY, signed(), now=T - 300) == ID
    with pytest.raises(WebhookSignatureError, match="future"):
        verify(SECRET, BODY, signed(), now=T - 301)


def test_any_matching_v1_signature_wins_for_secret_rotation() -> None:
    old = sign("the-old-secret-of-enough-length", ID, BODY, T)
    rotated = {**signed(), SIGNATURE_HEADER: f"{old} {sign(SECRET, ID, BODY, T)}"}
    assert verify(SECRET, BODY, rotated, now=T) == ID
    assert verify("the-old-secret-of-enough-length", BODY, rotated, now=T) == ID
    with pytest.raises(WebhookSignatureError, match="signature mismatch"):
        verify("a-third-secret-of-enough-length", BODY, rotated, now=T)


def test_other_signature_versions_are_ignored() -> None:
    mixed = {**signed(), SIGNATURE_HEADER: f"v1a,AAAA {sign(SECRET, ID, BODY, T)}"}
    assert verify(SECRET, BODY, mixed, now=T) == ID


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({ID_HEADER: None}, "no webhook-id"),
        ({TIMESTAMP_HEADER: None}, "no webhook-timestamp"),
        ({SIGNATURE_HEADER: None}, "no webhook-signature"),
        ({ID_HEADER: ""}, "malformed webhook-id"),
        ({ID_HEADER: "a b"}, "malformed webhook-id"),
        ({ID_HEADER: "x" * 257}, "malformed webhook-id"),
        ({TIMESTAMP_HEADER: ""}, "malformed webhook-timestamp"),
        ({TIMESTAMP_HEADER: "abc"}, "malformed webhook-timestamp"),
        ({TIMESTAMP_HEADER: "1.5e9"}, "malformed webhook-timestamp"),
        ({TIMESTAMP_HEADER: "-5"}, "malformed webhook-timestamp"),
        ({TIMESTAMP_HEADER: f"+{T}"}, "malformed webhook-timestamp"),
        ({TIMESTAMP_HEADER: "9" * 5000}, "malformed webhook-timestamp"),
        ({TIMESTAMP_HEADER: "\u0661\u0667\u0660\u0660"}, "malformed webhook-timestamp"),
        ({SIGNATURE_HEADER: ""}, "malformed webhook-signature"),
        ({SIGNATURE_HEADER: "garbage"}, "malformed webhook-signature"),
        ({SIGNATURE_HEADER: ",abc"}, "malformed webhook-signature"),
        ({SIGNATURE_HEADER: " ".join(["v1,x"] * 33)}, "malformed webhook-signature"),
        ({SIGNATURE_HEADER: "v0,abc"}, "no v1 signature"),
        ({SIGNATURE_HEADER: f"t={T},v1=abc"}, "no v1 signature"),
    ],
)
def test_malformed_headers_are_rejected_saying_why(
    change: dict[str, str | None], message: str
) -> None:
    given = {**signed(), **change}
    present = {k: v for k, v in given.items() if v is not None}
    with pytest.raises(WebhookSignatureError, match=message):
        verify(SECRET, BODY, present, now=T)


@pytest.mark.parametrize("cut", [1, 4])
def test_v1_values_that_are_not_the_exact_signature_are_a_mismatch(cut: int) -> None:
    exact = sign(SECRET, ID, BODY, T)
    for candidate in ("v1,", "v1,zz", "v1," + "é" * 44, exact.lower(), exact[:-cut]):
        with pytest.raises(WebhookSignatureError, match="signature mismatch"):
            verify(SECRET, BODY, {**signed(), SIGNATURE_HEADER: candidate}, now=T)


def test_the_error_is_a_tether_error() -> None:
    assert issubclass(WebhookSignatureError, TetherError)


@pytest.mark.parametrize("secret", ["", b""])
def test_an_empty_secret_is_refused_when_signing_and_verifying(secret: str | bytes) -> None:
    with pytest.raises(ConfigurationError, match="secret is empty"):
        sign(secret, ID, BODY, T)
    with pytest.raises(ConfigurationError, match="secret is empty"):
        verify(secret, BODY, signed(), now=T)


@pytest.mark.parametrize("timestamp", [-1, 1.5, True])
def test_a_timestamp_that_is_not_whole_seconds_is_refused_when_signing(timestamp: int) -> None:
    with pytest.raises(ConfigurationError, match="timestamp"):
        sign(SECRET, ID, BODY, timestamp)


@pytest.mark.parametrize("webhook_id", ["", "a b", "line\nbreak", "é", "x" * 257])
def test_an_id_that_cannot_travel_in_a_header_is_refused_when_signing(webhook_id: str) -> None:
    with pytest.raises(ConfigurationError, match="webhook-id"):
        sign(SECRET, webhook_id, BODY, T)


def test_a_negative_tolerance_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="tolerance"):
        verify(SECRET, BODY, signed(), now=T, tolerance=-1)

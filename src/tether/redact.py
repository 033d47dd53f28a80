"""Redaction: hide secrets in what people see (approval context shown to reviewers, logs, CLI).

It returns redacted copies for display only; it never mutates its input, never touches what is
stored or replayed, and imports nothing from Tether. It fails closed: unknown object types and
structures nested past MAX_DEPTH are replaced by REDACTED rather than shown.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import itertools
import re
from collections.abc import Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from uuid import UUID

REDACTED = "[redacted]"
MAX_DEPTH = 100  # deeper subtrees are replaced whole: no unbounded recursion, cycles included

# --- keys -----------------------------------------------------------------------------------------

# A key is cut into words at separators, camelCase and letter/digit boundaries: "X-Api-Key" ->
# x, api, key; "APIKey" -> api, key; "dbPassword2" -> db, password, 2.
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# Short words that are secret only as a whole word: "auth" is, "author"/"authority" are not.
_SECRET_WORDS = frozenset({"auth", "oauth", "pwd", "session"})
# Words that are secret on their own or as the end of a longer word ("dbpassword",
# "accesstoken"). "token" is singular on purpose: "max_tokens", "tokens_used" count tokens.
_SECRET_ENDINGS = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "secrets",
    "token",
    "apikey",
    "accesskey",
    "privatekey",
    "secretkey",
    "sessionid",
    "authorization",
    "cookie",
    "cookies",
    "credential",
    "credentials",
    "signature",
)


def is_secret_key(key: str) -> bool:
    """Whether a mapping key names a secret, so that its whole value must be hidden.

    The key is lowercased and cut into words (see _WORD). It is secret when one word, or two
    adjacent words joined ("api"+"key", "pass"+"word", "session"+"id"), equals auth, oauth, pwd
    or session, or ends with one of _SECRET_ENDINGS (password, secret, token, apikey, cookie,
    credential(s), signature, ...). So "Password", "db_password", "X-Api-Key", "api key",
    "refresh_token", "Authorization", "set-cookie", "aws_secret_access_key" and "session_id" are
    secret, while "max_tokens", "tokens_used", "author", "authority" and "key" are not. The rule
    leans to hiding: "token_count" or "session_count" are hidden too.
    """
    words = [w.lower() for w in _WORD.findall(key)]
    candidates = words + [a + b for a, b in itertools.pairwise(words)]
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_ENDINGS) for w in candidates)


# --- text -----------------------------------------------------------------------------------------

# Token shapes must not start inside a longer token ("task-..." holds "sk-"); underscores and
# dashes count as part of a token.
_START = r"(?<![A-Za-z0-9_-])"
_TOKEN_SHAPES = re.compile(
    _START
    + r"(?:"
    + r"|".join(
        [
            r"sk-[A-Za-z0-9_-]{16,}",  # OpenAI / Anthropic (sk-proj-..., sk-ant-...)
            r"eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+",  # JWT: header.payload.sig
            r"(?:AKIA|ASIA)[0-9A-Z]{16}",  # AWS access key id (long-term, temporary)
            r"gh[pousr]_[A-Za-z0-9]{36,}",  # GitHub tokens
            r"github_pat_[A-Za-z0-9_]{22,}",  # GitHub fine-grained token
            r"xox[baprs]-[A-Za-z0-9-]{10,}",  # Slack
            r"AIza[0-9A-Za-z_-]{35}",  # Google API key
            r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}",  # Stripe secret / restricted key
        ]
    )
    + r")"
)
# Only private keys: certificates and public keys are public. A BEGIN without its END (a
# truncated log line) hides everything after it.
_PEM_PRIVATE = re.compile(
    r"-----BEGIN ([A-Z0-9 ]{0,30}PRIVATE KEY[A-Z0-9 ]{0,30})-----(?:.*?-----END \1-----|.*\Z)",
    re.DOTALL,
)
# userinfo ends at the last "@" before the path, so a raw "@" inside the password is hidden too.
# The scheme is bounded: unbounded, "sk-sk-sk-..." retries from every word start (quadratic).
_URL_PASSWORD = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s:/?#@]*:)[^\s/?#]+@")
# Eight characters at least so prose ("the bearer of bad news") stays readable.
_BEARER = re.compile(r"\b(Bearer[ \t]+)[A-Za-z0-9._~+/-]{8,}=*", re.IGNORECASE)
_BASIC = re.compile(r"\b(Basic[ \t]+)([A-Za-z0-9+/]+={0,2})(?![A-Za-z0-9+/=])", re.IGNORECASE)
# "password=hunter2", "api_key: abc", "token='x'" in free text (logs, exception messages): the
# name is kept, the value hidden. The name must be a secret key (is_secret_key).
_ASSIGNED = re.compile(
    r"\b([A-Za-z][A-Za-z0-9_.-]{0,63})([ \t]*[=:][ \t]*)(['\"]?)"
    r"([^\s'\",;&=:]{1,512}+)(?![ \t]*[=:])\3"  # a value, not the next name of a pair
)


def _basic_credential(match: re.Match[str]) -> str:
    # "Basic" is an English word: hide only what decodes to RFC 7617's "user:password".
    try:
        decoded = base64.b64decode(match.group(2), validate=True)
    except (binascii.Error, ValueError):
        return match.group(0)
    return match.group(1) + REDACTED if b":" in decoded else match.group(0)


def redact_text(text: str) -> str:
    """Replace secret shapes inside a string by REDACTED, keeping the rest of it.

    Shapes: PEM private-key blocks (whole block), passwords in URLs (scheme://user:[redacted]@host),
    the credential after "Bearer " (8+ characters) or "Basic " (when it decodes to user:password),
    and provider keys: sk-... (OpenAI, Anthropic), JWTs (eyJ...eyJ...sig), AWS AKIA/ASIA ids,
    GitHub gh?_ and github_pat_, Slack xox?-, Google AIza..., Stripe sk_/rk_live/test_; and the
    value of a secret-named assignment in prose ("password=hunter2", "api_key: abc").
    """
    text = _PEM_PRIVATE.sub(REDACTED, text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + "@", text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    text = _BASIC.sub(_basic_credential, text)
    text = _ASSIGNED.sub(_assigned, text)
    return _TOKEN_SHAPES.sub(REDACTED, text)


_SCHEMES = frozenset({"bearer", "basic", "digest", "negotiate", "token"})


def _assigned(match: re.Match[str]) -> str:
    name, sep, quote, value = match.groups()
    if not is_secret_key(name) or value == REDACTED or value.lower() in _SCHEMES:
        return match.group(0)  # an HTTP auth scheme: the credential after it is handled above
    return f"{name}{sep}{quote}{REDACTED}{quote}"


# --- structures -----------------------------------------------------------------------------------

# Immutable values with no room for a secret: shown as they are.
_PLAIN = (bool, int, float, datetime, date, time, timedelta, Decimal, UUID, Enum)


def redact(value: object) -> object:
    """A redacted copy of a JSON-like value, for display.

    Values under secret keys (is_secret_key) become REDACTED whatever their type; every string
    elsewhere goes through redact_text. Dict keys are kept as they are; tuples and sets become
    lists; dataclass instances become dicts of their fields; None, numbers, booleans, dates,
    Decimal, UUID and enum members are kept. Anything else (bytes, arbitrary objects) and any
    subtree nested deeper than MAX_DEPTH becomes REDACTED: what cannot be inspected is not shown.
    """
    return _redact(value, 0)


def _redact(value: object, depth: int) -> object:
    if depth > MAX_DEPTH:
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    if value is None or isinstance(value, _PLAIN):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {
            key: REDACTED if is_secret_key(str(key)) else _redact(item, depth + 1)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [_redact(item, depth + 1) for item in value]
    return REDACTED


__all__ = ["MAX_DEPTH", "REDACTED", "is_secret_key", "redact", "redact_text"]

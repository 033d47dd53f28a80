"""Redaction: hide secrets in what people see (approval context shown to reviewers, logs, CLI),
and masking: hide them in an operation a reviewer approves while saying so (length, keyed
fingerprint) and showing in full what only sits under a secret's name.

It returns redacted or masked copies for display only; it never mutates its input, never
touches what is replayed, and imports nothing from Tether. It fails closed: unknown object types and
structures nested past MAX_DEPTH are replaced by REDACTED rather than shown.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import itertools
import json
import re
from collections.abc import Callable, Mapping
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
            r"tt_[A-Za-z0-9_-]{16,}",  # Tether's own user tokens (tether.users.TOKEN_PREFIX)
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


def _basic_credential(match: re.Match[str], hide: Callable[[str], str]) -> str:
    # "Basic" is an English word: hide only what decodes to RFC 7617's "user:password".
    try:
        decoded = base64.b64decode(match.group(2), validate=True)
    except (binascii.Error, ValueError):
        return match.group(0)
    return match.group(1) + hide(match.group(2)) if b":" in decoded else match.group(0)


def redact_text(text: str) -> str:
    """Replace secret shapes inside a string by REDACTED, keeping the rest of it.

    Shapes: PEM private-key blocks (whole block), passwords in URLs (scheme://user:[redacted]@host),
    the credential after "Bearer " (8+ characters) or "Basic " (when it decodes to user:password),
    and provider keys: sk-... (OpenAI, Anthropic), JWTs (eyJ...eyJ...sig), AWS AKIA/ASIA ids,
    GitHub gh?_ and github_pat_, Slack xox?-, Google AIza..., Stripe sk_/rk_live/test_, Tether's
    tt_ user tokens; and the value of a secret-named assignment in prose ("password=hunter2",
    "api_key: abc").
    """
    return _hide_text(text, lambda _: REDACTED)


def _hide_text(text: str, hide: Callable[[str], str]) -> str:
    """redact_text with `hide(secret)` as what replaces each secret found."""
    text = _PEM_PRIVATE.sub(lambda m: hide(m.group(0)), text)
    text = _URL_PASSWORD.sub(
        lambda m: m.group(1) + hide(m.group(0)[len(m.group(1)) : -1]) + "@", text
    )
    text = _BEARER.sub(lambda m: m.group(1) + hide(m.group(0)[len(m.group(1)) :]), text)
    text = _BASIC.sub(lambda m: _basic_credential(m, hide), text)
    text = _ASSIGNED.sub(lambda m: _assigned(m, hide), text)
    return _TOKEN_SHAPES.sub(lambda m: hide(m.group(0)), text)


_SCHEMES = frozenset({"bearer", "basic", "digest", "negotiate", "token"})


def _assigned(match: re.Match[str], hide: Callable[[str], str]) -> str:
    name, sep, quote, value = match.groups()
    if not is_secret_key(name) or value == REDACTED or value.lower() in _SCHEMES:
        return match.group(0)  # an HTTP auth scheme: the credential after it is handled above
    return f"{name}{sep}{quote}{hide(value)}{quote}"


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


# --- masking what a reviewer approves ------------------------------------------------------------

# A credential is one word. A value under a secret key with whitespace, control characters or
# what a shell reads as a command (";", "|", "&", "`", "<", ">", "$(", "${") is not a credential
# but something to look at: "; rm -rf /". Other punctuation ("$", "!", "(") is common in
# passwords, so it stays hidden; "$IFS" is a shell's space.
_NOT_A_SECRET = re.compile(r"[\s\x00-\x1f\x7f;|&`<>]|\$[({]|\$IFS")
# Within text, a credential's shape was matched already (a PEM block spans lines): only what a
# shell reads as a command makes it a thing to show.
_COMMAND = re.compile(r"[;|&`<>]|\$[({]|\$IFS")


def masked(secret: str, key: bytes) -> str:
    """What a reviewer sees instead of a secret: its length and a fingerprint keyed by `key` (the
    same secret shows the same fingerprint; without the key it confirms no guess)."""
    fp = hmac.new(key, b"mask\x00" + secret.encode(), hashlib.sha256).hexdigest()[:12]
    return f"[hidden secret, {len(secret)} chars, fp {fp}; it runs as given]"


def suspicious(value: str) -> str:
    """A value under a secret-named key that does not look like a secret: shown whole (escaped,
    so control characters are visible) with a warning, since it runs as given."""
    shown = json.dumps(value, ensure_ascii=True)
    return f"[WARNING: not a secret-like value, shown in full; it runs as given: {shown}]"


def mask(value: object, key: bytes) -> object:
    """A copy of an operation for the reviewer who approves it: like `redact`, but every hidden
    value says that it is hidden, its length and its keyed fingerprint (`masked`), and a value
    under a secret key that does not look like a credential (spaces, shell characters) is shown
    with a warning (`suspicious`) instead of being hidden: what is approved is visibly what
    runs. Non-string values under secret keys are masked as their JSON text."""
    return _mask(value, key, 0)


def _mask_secret(value: object, key: bytes, depth: int = 0) -> object:
    if isinstance(value, str):
        shown_whole = not value or _NOT_A_SECRET.search(value) is not None
        return suspicious(value) if shown_whole else masked(value, key)
    # A container under a secret key keeps its shape: each string in it is judged alone, so
    # {"credentials": {"cmd": "; rm -rf /"}} shows the command rather than one fingerprint.
    if depth > MAX_DEPTH:
        return REDACTED
    if isinstance(value, Mapping):
        return {k: _mask_secret(item, key, depth + 1) for k, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_mask_secret(item, key, depth + 1) for item in value]
    try:
        text = json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = repr(type(value))
    return masked(text, key)


def _mask(value: object, key: bytes, depth: int) -> object:
    if depth > MAX_DEPTH:
        return REDACTED
    if isinstance(value, str):
        # A secret-shaped piece of text that reads as a command is shown, not hidden.
        return _hide_text(
            value,
            lambda secret: suspicious(secret) if _COMMAND.search(secret) else masked(secret, key),
        )
    if value is None or isinstance(value, _PLAIN):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {
            k: _mask_secret(item, key) if is_secret_key(str(k)) else _mask(item, key, depth + 1)
            for k, item in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [_mask(item, key, depth + 1) for item in value]
    return REDACTED


__all__ = [
    "MAX_DEPTH",
    "REDACTED",
    "is_secret_key",
    "mask",
    "masked",
    "redact",
    "redact_text",
    "suspicious",
]

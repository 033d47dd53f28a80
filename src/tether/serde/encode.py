"""Values to JSON text: builtin special types as one-key `$` tags, dataclasses, models and
enums by their fields or value, NaN and infinity refused; the stored text (orjson's) and the
canonical text (the standard library's, sorted: digests and replay compare it, so it must never
change). It never rebuilds a value (serde.hints does).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
from collections import abc
from collections.abc import Callable
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from itertools import islice
from types import NoneType
from typing import Any
from uuid import UUID

import orjson

from tether.errors import SerializationError
from tether.serde.problem import Converter, Problem, at_path, describe

_PLAIN: frozenset[type] = frozenset({str, int, float, bool, NoneType})
SURROGATE = re.compile(r"[\ud800-\udfff]")
# No circular check: _encode walks every value first, so a cycle ends in RecursionError there.
_OPTS: dict[str, Any] = {"ensure_ascii": False, "check_circular": False, "allow_nan": False}


def _encoder(*, sort_keys: bool) -> Callable[[object], str]:
    """A compact JSON encoder: the standard library's C encoder called straight (about half
    the time of JSONEncoder.encode, which builds it anew on every call), or that method where
    there is no C encoder. Same output, same errors (TypeError, ValueError)."""
    options = json.JSONEncoder(**_OPTS, separators=(",", ":"), sort_keys=sort_keys)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return options.encode
    encode = make(None, options.default, json.encoder.encode_basestring, None, ":", ",",
                  sort_keys, False, False)  # fmt: skip

    def dumps(value: object) -> str:
        if isinstance(value, str):  # a top-level string: the C encoder wants a container
            return options.encode(value)
        return "".join(encode(value, 0))

    return dumps


_STANDARD = _encoder(sort_keys=False)
_CANONICAL = _encoder(sort_keys=True)


def stored_text(value: object) -> str:
    """Stored JSON text of what _encode made, by orjson: 1 MB of text in 0.1 ms, against 2.5
    for the standard library, whose text it is but for float formatting (1e-7 for 1e-07,
    0.00001 for 1e-05: the same float), so canonical text stays the standard library's.
    _encode has refused NaN and infinity, which orjson writes as null, and made plain dicts and
    lists of subclasses, whose storage orjson would read; where orjson refuses (an int over 64
    bits, nesting over 254 levels, a lone surrogate) the standard library writes the value."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return _STANDARD(value)


def plain_canonical(value: object) -> str:
    """Canonical JSON of a value made of JSON's own types only (dicts, lists and tuples, str,
    int, float, bool, None), without serde's tags; TypeError or ValueError for anything
    else (then use `canonical`)."""
    return _CANONICAL(value)


# Encoding: _encode returns plain JSON data, and the very same object when the value already is
# plain JSON, so the common case allocates nothing before the encoder runs.


def _encode(value: Any) -> object:
    t = type(value)
    if t in _PLAIN:
        return value if t is not float or value - value == 0 else _not_finite(value)
    if t is dict:
        return _encode_dict(value)
    if t is list:
        return _encode_seq(value)
    return (_ENCODERS.get(t) or _find_encoder(t))(value)


def _encode_dict(d: Any) -> object:
    out: dict[str, object] | None = None
    for key, item in d.items():
        if not isinstance(key, str):
            raise Problem(
                f"dict keys must be str, got {describe(key)} as a key; convert keys to str"
            )
        t = type(item)
        if t in _PLAIN and (t is not float or item - item == 0):
            continue
        try:
            new = _encode(item)
        except Problem as problem:
            problem.path.append(key)
            raise
        if new is not item:
            out = dict(d) if out is None else out
            out[key] = new
    result = d if out is None else out
    if len(result) == 1:
        for key in result:
            # A [key, value] pair, not a dict: decoding is bottom-up, so {"$tag": ..} would decode.
            if key.startswith("$"):
                return {"$dict": [key, result[key]]}
    return result


def _encode_seq(items: Any) -> object:
    out: list[object] | None = None
    for i, item in enumerate(items):
        t = type(item)
        if t in _PLAIN and (t is not float or item - item == 0):
            continue
        try:
            new = _encode(item)
        except Problem as problem:
            problem.path.append(i)
            raise
        if new is not item:
            out = list(items) if out is None else out
            out[i] = new
    return items if out is None else out


def _encode_set(items: Any) -> object:
    # Set order differs between processes; canonical order keeps stored text and digests stable.
    return {"$set": sorted((_encode(item) for item in items), key=_CANONICAL)}


def _not_finite(value: float) -> object:  # every value is walked: orjson would write null
    raise Problem(f"{value!r} is not a number JSON has; store None or a string instead")


def _finite(value: float) -> object:
    # A float subclass: its own value read without running its code (math.isfinite reads the
    # C double), written as a plain float so the encoders see JSON's own type.
    return float.__float__(value) if math.isfinite(value) else _not_finite(value)


def _as_is(value: Any) -> object:
    return value


def _unsupported(value: Any) -> object:
    cls = type(value)
    raise Problem(
        f"{cls.__module__}.{cls.__qualname__} is not JSON-serializable; use a dataclass, a "
        "pydantic model, an Enum or JSON types (dict, list, str, int, float, bool, None)"
    )


def _b64(value: bytes | bytearray) -> object:
    return {"$bytes": base64.b64encode(value).decode("ascii")}


_BASE_ENCODERS: tuple[tuple[type, Converter], ...] = (
    (bytes, _b64),
    (bytearray, _b64),
    (datetime, lambda v: {"$datetime": v.isoformat()}),
    (date, lambda v: {"$date": v.isoformat()}),
    (time, lambda v: {"$time": v.isoformat()}),
    (timedelta, lambda v: {"$timedelta": [v.days, v.seconds, v.microseconds]}),
    (UUID, lambda v: {"$uuid": str(v)}),
    (Decimal, lambda v: {"$decimal": str(v)}),
    (tuple, lambda v: {"$tuple": _encode_seq(v)}),
    (set, _encode_set),
    (frozenset, _encode_set),
)
_ENCODERS: dict[type, Converter] = dict(_BASE_ENCODERS)  # grows a cached entry per new type


def _find_encoder(t: type) -> Converter:
    encoder: Converter
    if issubclass(t, Enum):
        encoder = lambda v: _encode(v.value)  # noqa: E731
    elif dataclasses.is_dataclass(t):
        names = tuple(f.name for f in dataclasses.fields(t))
        encoder = lambda v: _encode_dict({n: getattr(v, n) for n in names})  # noqa: E731
    elif callable(getattr(t, "model_dump", None)):
        encoder = lambda v: _encode(v.model_dump(mode="json"))  # noqa: E731
    elif issubclass(t, dict | abc.Mapping):
        # A copy as a plain dict from the items the subclass shows (MultiDict's first values):
        # the encoders must write what was walked, and orjson reads a subclass's storage.
        encoder = lambda v: _encode_dict(dict(v.items()))  # noqa: E731
    elif issubclass(t, list):
        encoder = lambda v: _encode_seq(list(v))  # noqa: E731  # the same, by its __iter__
    elif issubclass(t, float):
        encoder = _finite  # written as its base value, once it is one JSON has
    elif issubclass(t, str | int):
        encoder = _as_is  # JSON writes these subclasses as their base value
    else:
        encoder = next((enc for base, enc in _BASE_ENCODERS if issubclass(t, base)), _unsupported)
    _ENCODERS[t] = encoder
    return encoder


_FLOOR_ITEMS = 64  # items of a container that size_floor looks at
_FLOOR_TYPES = (dict, list, tuple, bytes, bytearray)


def size_floor(value: Any, depth: int = 3) -> int:
    """A lower bound of the bytes of value's JSON text: its strings and bytes, down to `depth`
    levels and the first _FLOOR_ITEMS items of each container (microseconds for a
    usual value). Over the limit, the value cannot fit and is refused before it is encoded,
    so a huge payload is never copied (encoding it would make one to four copies)."""
    t = type(value)
    if t is str:
        return len(value) + 2  # at least a byte a character, and the quotes
    if t is bytes or t is bytearray:
        return (len(value) + 2) // 3 * 4 + 13  # base64 in {"$bytes":"..."}
    if depth and (t is dict or t is list or t is tuple):
        total = 0
        items = value.values() if t is dict else value
        for item in islice(items, _FLOOR_ITEMS):
            if type(item) is str:
                total += len(item) + 2
            elif type(item) in _FLOOR_TYPES:
                total += size_floor(item, depth - 1)
        return total
    return 0


def to_text(value: object, encode: Callable[[object], str], what: str) -> str:
    try:
        return encode(_encode(value))
    except Problem as problem:
        where = f" at {at_path(problem.path)}" if problem.path else ""
        raise SerializationError(f"cannot store {what}{where}: {problem.message}") from None
    except ValueError as exc:  # an int too long to print, a failed model_dump
        nan = "float" in str(exc)
        advice = "; JSON has no NaN or infinity: store None or a string" if nan else ""
        raise SerializationError(f"cannot store {what}: {exc}{advice}") from None
    except RecursionError:
        raise SerializationError(f"cannot store {what}: it nests too deep or is cyclic") from None


def canonical(value: object) -> str:
    """Canonical JSON (sorted keys, no whitespace) for digests: equal values give equal text."""
    return to_text(value, _CANONICAL, "value")

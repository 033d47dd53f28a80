"""Serialization of workflow arguments, step results and errors as JSON text for the database.

Stored text is data, never code: nothing here unpickles, imports a module or calls a class that
stored data names. Special builtin types travel as one-key ``$``-tagged objects; richer types
(dataclasses, pydantic models, enums) are rebuilt only from type hints the caller supplies.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import types
import typing
from collections import abc
from collections.abc import Callable, Iterable
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from itertools import islice, repeat
from typing import Any, Literal, Union, get_args, get_origin
from uuid import UUID

from tether.errors import PayloadTooLarge, SerializationError

# Errors travel as JSON too; the engine imports both halves from here.
from tether.serde_errors import encode_error, rebuild_error

DEFAULT_MAX_PAYLOAD = 10 * 1024 * 1024  # bytes of encoded UTF-8 JSON

Converter = Callable[[Any], object]
_NoneType = type(None)
_PLAIN: frozenset[type] = frozenset({str, int, float, bool, _NoneType})
_SURROGATE = re.compile(r"[\ud800-\udfff]")
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


_DUMPS = _encoder(sort_keys=False)
_CANONICAL = _encoder(sort_keys=True)


def plain_canonical(value: object) -> str:
    """Canonical JSON of a value made of JSON's own types only (dicts, lists and tuples, str,
    int, float, bool, None), without serde's tags; TypeError or ValueError for anything
    else (then use `canonical`)."""
    return _CANONICAL(value)


class _Problem(Exception):
    """Why a value cannot be encoded or rebuilt; containers add the path as it propagates."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[object] = []


def _where(path: list[object]) -> str:
    parts = (
        f"[{p}]" if isinstance(p, int) else f".{p}" if str(p).isidentifier() else f"[{p!r}]"
        for p in reversed(path)
    )
    return "$" + "".join(parts)


def _desc(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def _hint_name(hint: object) -> str:
    if isinstance(hint, type):
        return hint.__qualname__
    return repr(hint).replace("typing.", "").replace("collections.abc.", "")


def _expected(name: str, value: object, why: str = "") -> _Problem:
    return _Problem(f"expected {name}, got {_desc(value)}{f' ({why})' if why else ''}")


# Encoding: _encode returns plain JSON data, and the very same object when the value already is
# plain JSON, so the common case allocates nothing before json's C encoder runs.


def _encode(value: Any) -> object:
    t = type(value)
    if t in _PLAIN:
        return value
    if t is dict:
        return _encode_dict(value)
    if t is list:
        return _encode_seq(value)
    return (_ENCODERS.get(t) or _find_encoder(t))(value)


def _encode_dict(d: Any) -> object:
    out: dict[str, object] | None = None
    for key, item in d.items():
        if not isinstance(key, str):
            raise _Problem(f"dict keys must be str, got {_desc(key)} as a key; convert keys to str")
        if type(item) in _PLAIN:
            continue
        try:
            new = _encode(item)
        except _Problem as problem:
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
        if type(item) in _PLAIN:
            continue
        try:
            new = _encode(item)
        except _Problem as problem:
            problem.path.append(i)
            raise
        if new is not item:
            out = list(items) if out is None else out
            out[i] = new
    return items if out is None else out


def _encode_set(items: Any) -> object:
    # Set order differs between processes; canonical order keeps stored text and digests stable.
    return {"$set": sorted((_encode(item) for item in items), key=_CANONICAL)}


def _unsupported(value: Any) -> object:
    cls = type(value)
    raise _Problem(
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
    elif issubclass(t, dict | list):
        encoder = _encode_dict if issubclass(t, dict) else _encode_seq
    elif issubclass(t, abc.Mapping):
        encoder = lambda v: _encode_dict(dict(v))  # noqa: E731
    elif issubclass(t, str | int | float):
        encoder = _identity  # json writes these subclasses as their base value
    else:
        encoder = next((enc for base, enc in _BASE_ENCODERS if issubclass(t, base)), _unsupported)
    _ENCODERS[t] = encoder
    return encoder


_FLOOR_ITEMS = 64  # items of a container that _size_floor looks at
_FLOOR_TYPES = (dict, list, tuple, bytes, bytearray)


def _size_floor(value: Any, depth: int = 3) -> int:
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
                total += _size_floor(item, depth - 1)
        return total
    return 0


def _to_text(value: object, encode: Callable[[object], str], what: str) -> str:
    try:
        return encode(_encode(value))
    except _Problem as problem:
        where = f" at {_where(problem.path)}" if problem.path else ""
        raise SerializationError(f"cannot store {what}{where}: {problem.message}") from None
    except ValueError as exc:  # NaN or infinity, an int too long to print, a failed model_dump
        advice = (
            "; JSON has no NaN or infinity, store None or a string" if "float" in str(exc) else ""
        )
        raise SerializationError(f"cannot store {what}: {exc}{advice}") from None
    except RecursionError:
        raise SerializationError(f"cannot store {what}: it nests too deep or is cyclic") from None


def canonical(value: object) -> str:
    """Canonical JSON (sorted keys, no whitespace) for digests: equal values give equal text."""
    return _to_text(value, _CANONICAL, "value")


# Decoding: the object hook turns tags back into builtin types, whatever the hint.


def _as(cls: type, value: object) -> Any:
    if not isinstance(value, cls):
        raise TypeError(f"expected {cls.__name__}")
    return value


def _freeze(item: object) -> object:
    # Only frozensets can sit in a set, but they decode as sets (possibly inside tuples).
    if isinstance(item, set):
        return frozenset(item)
    return tuple(map(_freeze, item)) if type(item) is tuple else item


def _decode_set(raw: object) -> set[object]:
    items = _as(list, raw)
    try:
        return set(items)
    except TypeError:
        return set(map(_freeze, items))


_DECODERS: dict[str, Callable[[Any], object]] = {
    "$bytes": lambda v: base64.b64decode(_as(str, v), validate=True),
    "$datetime": lambda v: datetime.fromisoformat(_as(str, v)),
    "$date": lambda v: date.fromisoformat(_as(str, v)),
    "$time": lambda v: time.fromisoformat(_as(str, v)),
    "$timedelta": lambda v: timedelta(*_as(list, v)),  # [days, seconds, microseconds]
    "$uuid": lambda v: UUID(_as(str, v)),
    "$decimal": lambda v: Decimal(_as(str, v)),
    "$tuple": lambda v: tuple(_as(list, v)),
    "$set": _decode_set,
    "$dict": lambda v: dict([_as(list, v)]),  # [key, value]
}


def _decode_tag(d: dict[str, Any]) -> object:
    if len(d) == 1:
        for key, raw in d.items():
            decode = _DECODERS.get(key)  # an unknown tag stays a dict: dumps never writes one
            if decode is not None:
                try:
                    return decode(raw)
                except Exception as exc:
                    raise _Problem(f"malformed {key} value {_desc(raw)}: {exc}") from None
    return d


_PARSE_PLAIN = json.JSONDecoder().decode
_PARSE_TAGGED = json.JSONDecoder(object_hook=_decode_tag).decode

# Rebuilding by hint: one converter function is built per hint and cached.


def _identity(value: Any) -> object:
    return value


def _exact(cls: type) -> Converter:
    def convert(value: Any) -> object:
        if type(value) is cls:
            return value
        if cls is float and type(value) is int and abs(value) < 2**1023:
            return float(value)
        raise _expected(cls.__name__, value)

    return convert


def _parsed(cls: type, parse: Callable[[Any], object], raw: tuple[type, ...] = ()) -> Converter:
    def convert(value: Any) -> object:
        if isinstance(value, cls):
            return value
        if isinstance(value, raw) and not isinstance(value, bool):
            try:
                return parse(value)
            except (ValueError, ArithmeticError) as exc:
                raise _expected(cls.__name__, value, str(exc)) from None
        raise _expected(cls.__name__, value)

    return convert


_SCALARS: dict[type, Converter] = {
    **{cls: _exact(cls) for cls in (int, float, bool, _NoneType)},
    str: _parsed(str, str),
    bytes: _parsed(bytes, bytes, (bytearray,)),
    bytearray: _parsed(bytearray, bytearray, (bytes,)),
    datetime: _parsed(datetime, datetime.fromisoformat, (str,)),
    date: _parsed(date, date.fromisoformat, (str,)),
    time: _parsed(time, time.fromisoformat, (str,)),
    timedelta: _parsed(timedelta, timedelta),
    UUID: _parsed(UUID, UUID, (str,)),
    Decimal: _parsed(Decimal, Decimal, (str, int)),
}
# None: an abstract Sequence keeps what was stored, tuple or list.
_COLLECTIONS: dict[object, Callable[[list[object]], object] | None] = {
    list: _identity, abc.MutableSequence: _identity, abc.Sequence: None, tuple: tuple,
    set: set, abc.MutableSet: set, frozenset: frozenset, abc.Set: frozenset,
}  # fmt: skip
_MAPPINGS = (dict, abc.Mapping, abc.MutableMapping)


def _each(pairs: Iterable[tuple[Converter, object]]) -> list[object]:
    out = []
    for i, (convert, item) in enumerate(pairs):
        try:
            out.append(convert(item))
        except _Problem as problem:
            problem.path.append(i)
            raise
    return out


def _collection(name: str, args: tuple[Any, ...], make: Any) -> Converter:
    fixed = make is tuple and bool(args) and args[-1] is not Ellipsis
    items = [_converter(a) for a in args] if fixed else [_converter(args[0] if args else Any)]
    accept = (list, tuple) if make in (_identity, None, tuple) else (list, tuple, set, frozenset)

    def convert(value: Any) -> object:
        if not isinstance(value, accept) or (fixed and len(value) != len(items)):
            raise _expected(name, value)
        out = _each(zip(items, value) if fixed else zip(repeat(items[0]), value))  # noqa: B905
        if make is None:
            return tuple(out) if type(value) is tuple else out
        try:
            return make(out)
        except TypeError as exc:  # unhashable items for a set
            raise _expected(name, value, str(exc)) from None

    return convert


def _mapping(name: str, args: tuple[Any, ...]) -> Converter:
    key, val = (_converter(args[0]), _converter(args[1])) if args else (_identity, _identity)

    def convert(value: Any) -> object:
        if type(value) is not dict:
            raise _expected(name, value)
        out = {}
        for k, v in value.items():
            try:
                out[key(k)] = val(v)
            except _Problem as problem:
                problem.path.append(k)
                raise
        return out

    return convert


def _union(name: str, args: tuple[Any, ...]) -> Converter:
    if len(args) == 2 and _NoneType in args:
        inner = _converter(args[0] if args[1] is _NoneType else args[1])
        return lambda value: None if value is None else inner(value)
    members = [_converter(a) for a in args]
    # A value that has exactly a member's scalar type is kept, whatever the member order.
    exact = tuple(a for a in args if isinstance(a, type) and a in _SCALARS)

    def convert(value: Any) -> object:
        if type(value) in exact:
            return value
        for member in members:
            try:
                return member(value)
            except _Problem:
                pass
        raise _expected(name, value)

    return convert


def _literal(name: str, args: tuple[Any, ...]) -> Converter:
    def convert(value: Any) -> object:
        for allowed in args:
            plain = allowed.value if isinstance(allowed, Enum) else allowed
            if type(plain) is type(value) and plain == value:  # so that True is not 1
                return allowed
        raise _expected(name, value)

    return convert


def _class(cls: Any) -> Converter:
    """Enums by value, pydantic models by model_validate, dataclasses field by field; any other
    class only if the decoded value already is one (e.g. numbers.Number)."""
    plan: tuple[dict[str, Converter], set[str], set[str]] | None = None
    validate = getattr(cls, "model_validate", None)
    make = cls if issubclass(cls, Enum) else validate if callable(validate) else None
    is_dataclass = dataclasses.is_dataclass(cls)
    try:
        isinstance(None, cls)
    except TypeError:  # e.g. a Protocol that is not runtime_checkable
        raise SerializationError(f"cannot rebuild values for the type hint {cls!r}") from None

    def convert(value: Any) -> object:
        nonlocal plan
        if isinstance(value, cls):
            return value
        if make is not None:
            try:
                return make(value)
            except (ValueError, TypeError) as exc:
                raise _expected(cls.__qualname__, value, str(exc)) from exc
        if not is_dataclass:
            raise _expected(cls.__qualname__, value, "it is not an enum, dataclass or model")
        if type(value) is not dict:
            raise _expected(f"an object for {cls.__qualname__}", value)
        if plan is None:  # on first use, so that a dataclass can refer to itself
            plan = _dataclass_plan(cls)
        fields, required, skipped = plan
        kwargs = {}
        for key, item in value.items():
            if key not in fields:
                if key in skipped:
                    continue
                raise _Problem(f"{cls.__qualname__} has no field {key!r}")
            try:
                kwargs[key] = fields[key](item)
            except _Problem as problem:
                problem.path.append(key)
                raise
        if not kwargs.keys() >= required:
            raise _Problem(f"{cls.__qualname__} misses fields {sorted(required - kwargs.keys())}")
        try:
            return cls(**kwargs)
        except Exception as exc:
            raise _Problem(f"{cls.__qualname__}(...) raised {type(exc).__name__}: {exc}") from exc

    return convert


def _dataclass_plan(cls: type) -> tuple[dict[str, Converter], set[str], set[str]]:
    try:
        hints = typing.get_type_hints(cls)
    except Exception as exc:
        raise SerializationError(
            f"cannot resolve the type hints of {cls.__qualname__} ({exc}); define it and the "
            "types of its fields at module level"
        ) from exc
    fields: dict[str, Converter] = {}
    required: set[str] = set()
    skipped: set[str] = set()  # init=False fields are stored for readers but set by the class
    for f in dataclasses.fields(cls):
        if not f.init:
            skipped.add(f.name)
            continue
        fields[f.name] = _converter(hints.get(f.name, Any))
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.add(f.name)
    return fields, required, skipped


_CONVERTERS: dict[object, Converter] = {}


def _converter(hint: object) -> Converter:
    try:
        return _CONVERTERS[hint]
    except KeyError:
        converter = _CONVERTERS[hint] = _build(hint)
        return converter
    except TypeError:  # an unhashable hint (Annotated with a list in it): built every time
        return _build(hint)


def _build(hint: Any) -> Converter:
    # None means "no hint" (a missing annotation); NoneType is the hint for the value None.
    if hint is Any or hint is object or hint is None or isinstance(hint, typing.TypeVar):
        return _identity
    if isinstance(hint, str | typing.ForwardRef):
        raise SerializationError(f"type hint {hint!r} is a string; resolve it first")
    name, origin, args = _hint_name(hint), get_origin(hint), get_args(hint)
    if (origin is None and hint in _COLLECTIONS) or hint in _MAPPINGS:
        origin = hint
    if origin is typing.Annotated:
        return _converter(args[0])
    if origin is Union or origin is types.UnionType:
        return _union(name, args)
    if origin is Literal:
        return _literal(name, args)
    if origin in _COLLECTIONS:
        return _collection(name, args, _COLLECTIONS[origin])
    if origin in _MAPPINGS:
        return _mapping(name, args)
    if hasattr(hint, "__supertype__"):  # typing.NewType
        return _converter(hint.__supertype__)
    if isinstance(origin, type) and dataclasses.is_dataclass(origin):  # a generic dataclass
        return _class(origin)
    if hint in _SCALARS:
        return _SCALARS[hint]
    if not isinstance(hint, type) or origin is not None:
        raise SerializationError(f"cannot rebuild values for the type hint {name}")
    return _class(hint)


class Serde:
    """Turns values into JSON text for storage and back, rebuilding them from type hints."""

    def __init__(self, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.max_payload = max_payload

    def dumps(self, value: object, *, what: str = "value") -> str:
        """JSON text for value, or SerializationError / PayloadTooLarge (before encoding when
        the value's strings and bytes alone are over the limit)."""
        limit = self.max_payload
        floor = _size_floor(value)
        if floor > limit:
            raise _too_large(what, f"at least {floor}", limit)
        text = _to_text(value, _DUMPS, what)
        size = len(text)  # exact for ASCII (an O(1) test), else a bound
        bound = "" if text.isascii() or size <= limit else "at least "
        if not text.isascii() and size <= limit:
            # A character takes at most 4 bytes: encode (a full copy) only when that could matter.
            if _SURROGATE.search(text):
                raise SerializationError(
                    f"cannot store {what}: it holds a lone surrogate character, which UTF-8 (and "
                    "so the database) cannot hold; clean the text, e.g. with errors='replace'"
                )
            size = len(text.encode("utf-8")) if size * 4 > limit else size
        if size > limit:
            raise _too_large(what, f"{bound}{size}", limit)
        return text

    def loads(self, text: str, hint: object = Any, *, what: str = "value") -> object:
        """Parse text made by dumps and rebuild it as hint (Any: JSON and the tagged builtins)."""
        try:
            # '"$' is in the text of every tagged value; without it the object hook is pure cost.
            value = _PARSE_TAGGED(text) if '"$' in text else _PARSE_PLAIN(text)
        except ValueError as exc:  # JSONDecodeError, or an int too long to parse
            raise SerializationError(
                f"cannot load {what}: the stored text is not valid JSON ({exc}); it was not "
                "written by Tether or was changed in the database"
            ) from None
        except _Problem as problem:
            raise SerializationError(f"cannot load {what}: {problem.message}") from None
        except RecursionError:
            raise SerializationError(f"cannot load {what}: it nests too deep") from None
        if hint is Any or hint is object or hint is None:
            return value
        return self.convert(value, hint, what=what)

    def convert(self, value: object, hint: object, *, what: str = "value") -> object:
        """Rebuild an already decoded value (what loads returns with no hint) as hint."""
        try:
            return _converter(hint)(value)
        except _Problem as problem:
            raise SerializationError(
                f"cannot load {what} as {_hint_name(hint)}: {problem.message} at "
                f"{_where(problem.path)}; the stored data does not fit the type hint (did the "
                "code change since it was stored?)"
            ) from problem.__cause__
        except RecursionError:
            raise SerializationError(f"cannot load {what}: it nests too deep") from None


def _too_large(what: str, size: str, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"{what} is {size} bytes of JSON, over the payload limit of {limit} bytes; store the "
        "data elsewhere (a file, object storage, a table) and pass a reference (a path, URL or "
        "id) instead"
    )


__all__ = ["DEFAULT_MAX_PAYLOAD", "Serde", "canonical", "encode_error", "plain_canonical",
           "rebuild_error"]  # fmt: skip

"""JSON text back to values: the `$` tags to builtin types whatever the hint, then a
converter built once per type hint (dataclasses, pydantic models, enums, containers, unions,
literals) checks and rebuilds what was stored. It calls only classes the hints name.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import types
import typing
from collections import abc
from collections.abc import Callable, Iterable
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from itertools import repeat
from types import NoneType
from typing import Any, Literal, Union, get_args, get_origin
from uuid import UUID

from tether.errors import SerializationError
from tether.serde.problem import Converter, Problem, describe, expected, hint_name

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
                    raise Problem(f"malformed {key} value {describe(raw)}: {exc}") from None
    return d


PARSE_PLAIN = json.JSONDecoder().decode
PARSE_TAGGED = json.JSONDecoder(object_hook=_decode_tag).decode

# Rebuilding by hint: one converter function is built per hint and cached.


def _identity(value: Any) -> object:
    return value


def _exact(cls: type) -> Converter:
    def convert(value: Any) -> object:
        if type(value) is cls:
            return value
        if cls is float and type(value) is int and abs(value) < 2**1023:
            return float(value)
        raise expected(cls.__name__, value)

    return convert


def _parsed(cls: type, parse: Callable[[Any], object], raw: tuple[type, ...] = ()) -> Converter:
    def convert(value: Any) -> object:
        if isinstance(value, cls):
            return value
        if isinstance(value, raw) and not isinstance(value, bool):
            try:
                return parse(value)
            except (ValueError, ArithmeticError) as exc:
                raise expected(cls.__name__, value, str(exc)) from None
        raise expected(cls.__name__, value)

    return convert


_SCALARS: dict[type, Converter] = {
    **{cls: _exact(cls) for cls in (int, float, bool, NoneType)},
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
        except Problem as problem:
            problem.path.append(i)
            raise
    return out


def _collection(name: str, args: tuple[Any, ...], make: Any) -> Converter:
    fixed = make is tuple and bool(args) and args[-1] is not Ellipsis
    items = [converter(a) for a in args] if fixed else [converter(args[0] if args else Any)]
    accept = (list, tuple) if make in (_identity, None, tuple) else (list, tuple, set, frozenset)

    def convert(value: Any) -> object:
        if not isinstance(value, accept) or (fixed and len(value) != len(items)):
            raise expected(name, value)
        out = _each(zip(items, value) if fixed else zip(repeat(items[0]), value))  # noqa: B905
        if make is None:
            return tuple(out) if type(value) is tuple else out
        try:
            return make(out)
        except TypeError as exc:  # unhashable items for a set
            raise expected(name, value, str(exc)) from None

    return convert


def _mapping(name: str, args: tuple[Any, ...]) -> Converter:
    key, val = (converter(args[0]), converter(args[1])) if args else (_identity, _identity)

    def convert(value: Any) -> object:
        if type(value) is not dict:
            raise expected(name, value)
        out = {}
        for k, v in value.items():
            try:
                out[key(k)] = val(v)
            except Problem as problem:
                problem.path.append(k)
                raise
        return out

    return convert


def _union(name: str, args: tuple[Any, ...]) -> Converter:
    if len(args) == 2 and NoneType in args:
        inner = converter(args[0] if args[1] is NoneType else args[1])
        return lambda value: None if value is None else inner(value)
    members = [converter(a) for a in args]
    # A value that has exactly a member's scalar type is kept, whatever the member order.
    exact = tuple(a for a in args if isinstance(a, type) and a in _SCALARS)

    def convert(value: Any) -> object:
        if type(value) in exact:
            return value
        for member in members:
            try:
                return member(value)
            except Problem:
                pass
        raise expected(name, value)

    return convert


def _literal(name: str, args: tuple[Any, ...]) -> Converter:
    def convert(value: Any) -> object:
        for allowed in args:
            plain = allowed.value if isinstance(allowed, Enum) else allowed
            if type(plain) is type(value) and plain == value:  # so that True is not 1
                return allowed
        raise expected(name, value)

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
                raise expected(cls.__qualname__, value, str(exc)) from exc
        if not is_dataclass:
            raise expected(cls.__qualname__, value, "it is not an enum, dataclass or model")
        if type(value) is not dict:
            raise expected(f"an object for {cls.__qualname__}", value)
        if plan is None:  # on first use, so that a dataclass can refer to itself
            plan = _dataclass_plan(cls)
        fields, required, skipped = plan
        kwargs = {}
        for key, item in value.items():
            if key not in fields:
                if key in skipped:
                    continue
                raise Problem(f"{cls.__qualname__} has no field {key!r}")
            try:
                kwargs[key] = fields[key](item)
            except Problem as problem:
                problem.path.append(key)
                raise
        if not kwargs.keys() >= required:
            raise Problem(f"{cls.__qualname__} misses fields {sorted(required - kwargs.keys())}")
        try:
            return cls(**kwargs)
        except Exception as exc:
            raise Problem(f"{cls.__qualname__}(...) raised {type(exc).__name__}: {exc}") from exc

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
        fields[f.name] = converter(hints.get(f.name, Any))
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.add(f.name)
    return fields, required, skipped


_CONVERTERS: dict[object, Converter] = {}


def converter(hint: object) -> Converter:
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
    name, origin, args = hint_name(hint), get_origin(hint), get_args(hint)
    if (origin is None and hint in _COLLECTIONS) or hint in _MAPPINGS:
        origin = hint
    if origin is typing.Annotated:
        return converter(args[0])
    if origin is Union or origin is types.UnionType:
        return _union(name, args)
    if origin is Literal:
        return _literal(name, args)
    if origin in _COLLECTIONS:
        return _collection(name, args, _COLLECTIONS[origin])
    if origin in _MAPPINGS:
        return _mapping(name, args)
    if hasattr(hint, "__supertype__"):  # typing.NewType
        return converter(hint.__supertype__)
    if isinstance(origin, type) and dataclasses.is_dataclass(origin):  # a generic dataclass
        return _class(origin)
    if hint in _SCALARS:
        return _SCALARS[hint]
    if not isinstance(hint, type) or origin is not None:
        raise SerializationError(f"cannot rebuild values for the type hint {name}")
    return _class(hint)

"""JSON schemas of tool parameters, made from a function's signature and type hints, as model
APIs want them: {"type": "object", "properties": ..., "required": [...]}.

Covers what tool functions take: str, int, float, bool, None, lists, tuples, dicts, Literal,
enums, Optional and unions, dataclasses, TypedDicts and pydantic models (when pydantic is
installed). Pure: it inspects types and never calls the function.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime
from typing import Any, Literal, get_args, get_origin

from tether.core.workflow import type_hints
from tether.errors import ConfigurationError

_SCALARS: dict[object, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    datetime: {"type": "string", "format": "date-time"},
    date: {"type": "string", "format": "date"},
}


def parameters_schema(fn: Callable[..., object]) -> dict[str, Any]:
    """The schema of `fn`'s parameters (positional-or-keyword and keyword-only ones)."""
    hints = type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(
                f"tool {fn.__name__!r}: *args and **kwargs cannot be described to a model; "
                f"name each parameter"
            )
        schema = dict(type_schema(hints.get(name, Any), f"{fn.__name__}({name})"))
        if param.default is inspect.Parameter.empty:
            required.append(name)
        elif _plain(param.default):
            schema["default"] = param.default
        properties[name] = schema
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}  # fmt: skip


def _plain(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def type_schema(hint: Any, where: str) -> dict[str, Any]:
    if hint is Any or hint is object:
        return {}
    if hint in _SCALARS:
        return dict(_SCALARS[hint])
    origin = get_origin(hint)
    args = get_args(hint)
    if origin is typing.Annotated:
        return type_schema(args[0], where)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        options = [type_schema(a, where) for a in args]
        return {"anyOf": options}
    if origin in (list, set, frozenset, Sequence) or hint in (list, set, frozenset):
        item = type_schema(args[0], where) if args else {}
        return {"type": "array", "items": item}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": type_schema(args[0], where)}
        return {"type": "array", "prefixItems": [type_schema(a, where) for a in args],
                "minItems": len(args), "maxItems": len(args)}  # fmt: skip
    if origin in (dict, Mapping) or hint is dict:
        value = type_schema(args[1], where) if len(args) == 2 else {}
        return {"type": "object", "additionalProperties": value}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": [m.value for m in hint]}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _object(hint, {f.name: f for f in dataclasses.fields(hint)}, where)
    if isinstance(hint, type) and typing.is_typeddict(hint):
        return _object(hint, None, where)
    model_schema = getattr(hint, "model_json_schema", None)  # a pydantic model
    if callable(model_schema):
        return dict(model_schema())
    raise ConfigurationError(
        f"tool parameter {where}: cannot describe {hint!r} to a model; use str, int, float, "
        f"bool, lists, dicts, Literal, enums, dataclasses, TypedDicts or pydantic models"
    )


def _object(
    cls: type, fields: dict[str, dataclasses.Field[Any]] | None, where: str
) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties = {name: type_schema(h, f"{where}.{name}") for name, h in hints.items()}
    if fields is None:  # a TypedDict
        required = sorted(getattr(cls, "__required_keys__", hints))
    else:
        required = [n for n, f in fields.items() if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]  # fmt: skip
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}  # fmt: skip

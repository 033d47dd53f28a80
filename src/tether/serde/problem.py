"""Why a value cannot be stored or rebuilt: the error serde's halves raise inside, with the path
to the part at fault, and how a value and a type hint are named in its message.

It knows nothing of JSON; the public errors (SerializationError) are made from it by the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Converter = Callable[[Any], object]


class Problem(Exception):
    """Why a value cannot be encoded or rebuilt; containers add the path as it propagates."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[object] = []


def at_path(path: list[object]) -> str:
    parts = (
        f"[{p}]" if isinstance(p, int) else f".{p}" if str(p).isidentifier() else f"[{p!r}]"
        for p in reversed(path)
    )
    return "$" + "".join(parts)


def describe(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def hint_name(hint: object) -> str:
    if isinstance(hint, type):
        return hint.__qualname__
    return repr(hint).replace("typing.", "").replace("collections.abc.", "")


def expected(name: str, value: object, why: str = "") -> Problem:
    return Problem(f"expected {name}, got {describe(value)}{f' ({why})' if why else ''}")

"""Serialization of workflow arguments, step results and errors as JSON text for the database.

Stored text is data, never code: nothing here unpickles, imports a module or calls a class that
stored data names. Special builtin types travel as one-key ``$``-tagged objects; richer types
(dataclasses, pydantic models, enums) are rebuilt only from type hints the caller supplies.
`Serde` is the one door: encode (serde.encode), size limits, parse and rebuild (serde.hints).
"""

from __future__ import annotations

from typing import Any

from tether.errors import PayloadTooLarge, SerializationError
from tether.serde.encode import (
    SURROGATE,
    canonical,
    plain_canonical,
    size_floor,
    stored_text,
    to_text,
)

# Errors travel as JSON too; the engine imports both halves from here.
from tether.serde.errors import encode_error, rebuild_error
from tether.serde.hints import PARSE_PLAIN, PARSE_TAGGED, converter
from tether.serde.problem import Problem, at_path, hint_name

DEFAULT_MAX_PAYLOAD = 10 * 1024 * 1024  # bytes of encoded UTF-8 JSON


class Serde:
    """Turns values into JSON text for storage and back, rebuilding them from type hints."""

    def __init__(self, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.max_payload = max_payload

    def dumps(self, value: object, *, what: str = "value") -> str:
        """JSON text for value, or SerializationError / PayloadTooLarge (before encoding when
        the value's strings and bytes alone are over the limit)."""
        limit = self.max_payload
        floor = size_floor(value)
        if floor > limit:
            raise _too_large(what, f"at least {floor}", limit)
        text = to_text(value, stored_text, what)
        size = len(text)  # exact for ASCII (an O(1) test), else a bound
        bound = "" if text.isascii() or size <= limit else "at least "
        if not text.isascii() and size <= limit:
            # A character takes at most 4 bytes: encode (a full copy) only when that could matter.
            if SURROGATE.search(text):
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
            value = PARSE_TAGGED(text) if '"$' in text else PARSE_PLAIN(text)
        except ValueError as exc:  # JSONDecodeError, or an int too long to parse
            raise SerializationError(
                f"cannot load {what}: the stored text is not valid JSON ({exc}); it was not "
                "written by Tether or was changed in the database"
            ) from None
        except Problem as problem:
            raise SerializationError(f"cannot load {what}: {problem.message}") from None
        except RecursionError:
            raise SerializationError(f"cannot load {what}: it nests too deep") from None
        if hint is Any or hint is object or hint is None:
            return value
        return self.convert(value, hint, what=what)

    def convert(self, value: object, hint: object, *, what: str = "value") -> object:
        """Rebuild an already decoded value (what loads returns with no hint) as hint."""
        try:
            return converter(hint)(value)
        except Problem as problem:
            raise SerializationError(
                f"cannot load {what} as {hint_name(hint)}: {problem.message} at "
                f"{at_path(problem.path)}; the stored data does not fit the type hint (did the "
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

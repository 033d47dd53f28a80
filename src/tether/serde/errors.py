"""The stored form of errors: what a failed step or run records, and how replay raises it again.

Stored text is data, never code: rebuilding looks classes up only among builtins and modules
already imported, and never runs an __init__. It imports nothing of Tether but its errors.
"""

from __future__ import annotations

import builtins
import sys
import traceback

from tether.errors import StepFailed


def encode_error(exc: BaseException) -> dict[str, str]:
    """The stored form of an error: its type name, message and formatted traceback."""
    cls = type(exc)
    name = cls.__qualname__
    if cls.__module__ != "builtins":
        name = f"{cls.__module__}.{name}"
    try:
        message = str(exc)
    except Exception:
        message = f"<{name} with an unprintable message>"
    return {"type": name, "message": message, "traceback": "".join(traceback.format_exception(exc))}


def _lookup(name: str) -> object:
    parts = name.split(".")
    if len(parts) == 1:
        return vars(builtins).get(name)
    for i in range(len(parts) - 1, 0, -1):
        obj: object = sys.modules.get(".".join(parts[:i]))
        if obj is not None:
            for attr in parts[i:]:
                try:  # vars(), not getattr(): a module __getattr__ (PEP 562) may import lazily
                    obj = vars(obj).get(attr)
                except TypeError:
                    return None
            return obj
    return None


def rebuild_error(error: dict[str, str]) -> Exception:
    """The recorded error, to raise on replay; StepFailed when its class is not loaded.

    The class is only looked up in builtins and already imported modules, and made with
    __new__, so stored data can neither import a module nor run an __init__.
    """
    name, message = error.get("type", ""), error.get("message", "")
    exc: Exception | None = None
    cls = _lookup(name)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            exc = cls.__new__(cls)
            exc.args = (message,)
            str(exc)  # a __str__ that needs attributes set by __init__ would fail on every print
        except Exception:
            exc = None
    if exc is None:
        exc = StepFailed(f"{name or 'unknown error'}: {message}", error_type=name)
    if tb := error.get("traceback"):
        exc.add_note("recorded traceback:\n" + tb)
    return exc

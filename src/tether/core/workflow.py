"""A registered workflow: the decorated async function, its name, its hints and its timeout; and
a workflow known by name only (Named), for a process that starts runs without the code.

Turns call arguments into the stored JSON and back (by the function's type hints), and refuses
at start what the worker could not take back. It does not execute runs: the runner does.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Generic, ParamSpec, TypeVar

from tether.errors import ArgumentsRefused, ConfigurationError, SerializationError
from tether.serde import Serde

P = ParamSpec("P")
R = TypeVar("R")


def type_hints(fn: Callable[..., object]) -> dict[str, object]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: fall back to untyped JSON
        return {}


class Named:
    """A workflow this process knows by name only (it lacks the code): its runs' arguments are
    stored as given, and the worker that has the code checks them when it decodes them."""

    def __init__(
        self, name: str, *, queue: str | None = None, timeout: timedelta | None = None
    ) -> None:
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ConfigurationError(f"a workflow name is a non-empty str, not {name!r}")
        if queue is not None and (not isinstance(queue, str) or not queue or len(queue) > 128):
            raise ConfigurationError(f"a queue name must be a non-empty str, not {queue!r}")
        self.name = name
        self.queue = queue
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"<tether workflow {self.name!r} (by name)>"

    def encode_args(self, serde: Serde, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return serde.dumps({"args": list(args), "kwargs": kwargs}, what=f"arguments of {self.name}")


class Workflow(Generic[P, R]):
    """A workflow registered with an App. Start it with `await app.start(workflow, ...)`."""

    def __init__(
        self,
        fn: Callable[P, Awaitable[R]],
        *,
        name: str,
        timeout: timedelta | None,
        queue: str | None = None,
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise ConfigurationError(
                f"@app.workflow() needs an `async def` function; {fn.__qualname__} is not one"
            )
        if timeout is not None and (not isinstance(timeout, timedelta) or timeout <= timedelta(0)):
            raise ConfigurationError(
                f"workflow timeout must be a positive timedelta, not {timeout!r}"
            )
        if queue is not None and (not isinstance(queue, str) or not queue or len(queue) > 128):
            raise ConfigurationError(f"a queue name must be a non-empty str, not {queue!r}")
        self.fn = fn
        self.name = name
        self.timeout = timeout
        self.queue = queue
        self.signature = inspect.signature(fn)
        hints = type_hints(fn)
        self.return_hint: object = hints.pop("return", Any)
        self.param_hints = hints
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<tether workflow {self.name!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R]:
        """Inside a workflow, `await workflow(...)` runs it as a child run and waits for it."""
        from tether.core.context import _RUN, _STEP
        from tether.core.start import call_child

        if _RUN.get() is None or _STEP.get() is not None:
            raise ConfigurationError(
                f"workflow {self.name!r} is not called directly outside a workflow: start a "
                f"run with `await app.start({self.name}, ...)`"
            )
        return call_child(self, args, kwargs)

    def encode_args(self, serde: Serde, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise ConfigurationError(
                f"arguments do not fit workflow {self.name}{self.signature}: {exc}"
            ) from None
        text = serde.dumps({"args": list(args), "kwargs": kwargs},
                           what=f"arguments of {self.name}")  # fmt: skip
        if self.param_hints:
            # What the worker will do with them, done here: a value its hints refuse is an
            # error for the caller now, not a dead run later.
            try:
                self.decode_args(serde, text)
            except ArgumentsRefused as exc:
                raise ConfigurationError(
                    f"arguments do not fit workflow {self.name}{self.signature}: {exc}"
                ) from None
        return text

    def decode_args(self, serde: Serde, text: str) -> tuple[list[Any], dict[str, Any]]:
        """The stored arguments, rebuilt by the hints; ArgumentsRefused if they do not fit."""
        try:
            raw = serde.loads(text, what=f"arguments of {self.name}")
        except SerializationError as exc:
            raise ArgumentsRefused(str(exc)) from None
        if (not isinstance(raw, dict) or not isinstance(raw.get("args"), list)
                or not isinstance(raw.get("kwargs", {}), dict)):  # fmt: skip
            raise ArgumentsRefused(f"stored arguments of {self.name} are malformed: {text[:200]}")
        try:
            bound = self.signature.bind(*raw["args"], **raw.get("kwargs", {}))
        except TypeError as exc:
            raise ArgumentsRefused(f"{exc} (given {_shape(raw)})") from None
        for key, value in list(bound.arguments.items()):
            hint = self.param_hints.get(key)
            param = self.signature.parameters[key]
            if hint is None or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            try:
                bound.arguments[key] = serde.convert(
                    value, hint, what=f"argument {key!r} of {self.name}"
                )
            except SerializationError as exc:
                raise ArgumentsRefused(str(exc)) from None
        return list(bound.args), dict(bound.kwargs)


def _shape(raw: dict[str, Any]) -> str:
    keys = sorted(str(k) for k in raw.get("kwargs", {}))
    return f"{len(raw['args'])} positional, keywords {keys}"

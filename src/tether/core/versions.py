"""Application versions (docs/versions.md): the digest of the registered workflows' code that a
worker declares by default, moving a run to another version, and the versions in use.

A run is pinned to a version by its first claim; the store's claims keep to it. This module
computes and asks: it never claims or executes runs, nor talks SQL.
"""

from __future__ import annotations

import hashlib
import inspect
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tether.core.engine import Engine
from tether.core.step import Step
from tether.errors import ConfigurationError
from tether.store.port import RunRecord

MAX_VERSION = 200  # characters: a version is a label people type


def check_version(version: object) -> str:
    """A version as given by a user: a non-empty str of printable characters, no spaces."""
    if (
        not isinstance(version, str)
        or not version
        or len(version) > MAX_VERSION
        or not version.isprintable()
        or any(c.isspace() for c in version)
    ):
        raise ConfigurationError(
            f"a version is a non-empty str of up to {MAX_VERSION} printable characters "
            f"without spaces (e.g. '2026.12.1' or a git commit), not {version!r}"
        )
    return version


def code_version(workflows: Mapping[str, Any]) -> str:
    """The default version: a digest of each workflow's and each step it names' qualified name
    and source (or bytecode where the source is not available). The same code gives the same
    digest in every process and on every machine; any change to it gives another."""
    digest = hashlib.sha256()
    steps: dict[str, Any] = {}
    for name in sorted(workflows):
        fn = getattr(workflows[name], "fn", None)
        if fn is None:  # known by name only: no code here
            continue
        _add(digest, "workflow", name, fn)
        for step in _steps_named(fn):
            steps.setdefault(step.name, step.fn)
    for name in sorted(steps):
        _add(digest, "step", name, steps[name])
    return digest.hexdigest()[:16]


def declared_version(engine: Engine) -> str:
    """The version a worker of this engine declares: settings.version, or the code's digest."""
    declared = engine.settings.version
    return code_version(engine.workflows) if declared is None else check_version(declared)


def _add(digest: Any, kind: str, name: str, fn: Any) -> None:
    fn = inspect.unwrap(fn)
    qualified = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):  # defined in a REPL or by exec: its bytecode stands for it
        code = getattr(fn, "__code__", None)
        text = _code_text(code) if isinstance(code, types.CodeType) else repr(fn)
    for part in (kind, name, qualified, text):
        digest.update(part.encode())
        digest.update(b"\0")


def _code_text(code: types.CodeType) -> str:
    """A code object as text that does not depend on the process (no addresses, no set order)."""

    def const(value: object) -> str:
        if isinstance(value, types.CodeType):
            return _code_text(value)
        if isinstance(value, frozenset):  # its order follows the process's hash seed
            return "frozenset(" + ",".join(sorted(const(v) for v in value)) + ")"
        if isinstance(value, tuple):
            return "(" + ",".join(const(v) for v in value) + ")"
        return repr(value)

    parts = (code.co_qualname, code.co_code.hex(), ",".join(code.co_names),
             ",".join(code.co_varnames), ",".join(const(c) for c in code.co_consts))  # fmt: skip
    return "|".join(parts)


def _steps_named(fn: Any) -> Iterable[Step[..., Any]]:
    """The steps a workflow function names among its module's globals (its nested functions'
    names too)."""
    fn = inspect.unwrap(fn)
    code, scope = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    pending = [code] if isinstance(code, types.CodeType) else []
    while pending:
        code = pending.pop()
        for name in code.co_names:
            found = scope.get(name)
            if isinstance(found, Step):
                yield found
        pending.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


@dataclass(frozen=True, slots=True)
class VersionStatus:
    """A version in use: its unfinished runs and its live workers (their ids)."""

    version: str | None  # None: runs not pinned yet, or workers that declare no version
    runs: int
    workers: tuple[str, ...]


async def version_status(engine: Engine) -> list[VersionStatus]:
    """The versions that have unfinished runs or live workers (a heartbeat within a lease
    duration), in version order, the unpinned first."""
    counts = await engine.store.version_counts()
    since = engine.clock.now() - engine.settings.lease_duration
    live: dict[str | None, list[str]] = {}
    for worker in await engine.store.list_workers():
        if worker.heartbeat_at >= since:
            live.setdefault(worker.version, []).append(worker.id)
    names = sorted(set(counts) | set(live), key=lambda v: (v is not None, v or ""))
    return [VersionStatus(v, counts.get(v, 0), tuple(sorted(live.get(v, ())))) for v in names]


async def move_version(engine: Engine, run_id: str, version: str | None) -> RunRecord:
    """Pin the unfinished run `run_id` to `version` (None: its next claim pins it): from its
    next claim on only workers of that version execute it. An execution in flight goes on
    where it is. A finished run is returned unchanged; RunNotFound for an unknown id."""
    if version is not None:
        check_version(version)
    record = await engine.store.move_version(run_id, version, engine.clock.now())
    if engine.worker is not None:
        engine.worker.notify()
    return record


class VersionsMixin:
    """App.move_version, for tether.App to inherit."""

    engine: Engine

    if TYPE_CHECKING:

        async def open(self) -> None: ...

    async def move_version(self, run_id: str, version: str | None) -> RunRecord:
        """Pin the unfinished run `run_id` to `version` (None: its next claim pins it): from
        its next claim on only workers of that version execute it; an execution in flight
        goes on. A finished run is returned unchanged; RunNotFound for an unknown id."""
        await self.open()
        return await move_version(self.engine, run_id, version)

"""The statements of a checkpointer operation, and the one loop that runs them.

An operation (`ops.py`) is a generator: it yields `Query` values and is sent their results, so a
single implementation of each operation serves SQLite and PostgreSQL, sync and async callers. A
database (`sqlite.py`, `postgres.py`) only executes what it is given: `drive` and `adrive` feed
an operation its results. The SQL itself lives in `sql/<dialect>/`, one named query per
statement; a query's `{where}` is filled with named fragments joined by AND.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

T = TypeVar("T")
Q = TypeVar("Q")
Row = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Query:
    """One statement: a named query, its parameters (a list of them when `many`), and the
    named fragments that make its WHERE clause."""

    name: str
    params: Mapping[str, Any] | Sequence[Mapping[str, Any]]
    many: bool = False
    where: tuple[str, ...] = ()


# An operation yields queries and gets back, for each: its rows (a SELECT or RETURNING), the
# number of rows it changed (other statements), or None (`many`).
Op = Generator[Query, Any, T]


def select(
    name: str, where: tuple[str, ...] = (), **params: Any
) -> Generator[Query, Any, list[Row]]:
    rows: list[Row] = yield Query(name, params, where=where)
    return rows


def execute(name: str, **params: Any) -> Generator[Query, Any, int]:
    count: int = yield Query(name, params)
    return count


def execute_many(name: str, rows: Sequence[Mapping[str, Any]]) -> Generator[Query, Any, None]:
    if len(rows) == 1:
        yield Query(name, rows[0])
    elif rows:
        yield Query(name, rows, many=True)


def drive(op: Generator[Q, Any, T], run: Callable[[Q], Any], first: Q | None = None) -> T:
    """Run `op` to its end, executing each query with `run`; `first` is the query a caller
    already took from it (see `prime`)."""
    try:
        query = next(op) if first is None else first
        while True:
            query = op.send(run(query))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        op.close()


async def adrive(op: Generator[Q, Any, T], run: Callable[[Q], Awaitable[Any]]) -> T:
    """`drive` for a database with an async driver. The operation's own work between queries
    (encoding and decoding values) runs in a thread, so large values never stall the loop."""
    try:
        done, step = await asyncio.to_thread(_advance, op, None, True)
        while not done:
            done, step = await asyncio.to_thread(_advance, op, await run(step), False)
        return step  # type: ignore[no-any-return]
    finally:
        op.close()


def _advance(op: Generator[Q, Any, T], value: Any, first: bool) -> tuple[bool, Any]:
    """(False, the next query) or (True, the result): a StopIteration cannot cross a thread."""
    try:
        return False, next(op) if first else op.send(value)
    except StopIteration as stop:
        return True, stop.value


def prime(op: Op[T]) -> tuple[Query | None, T | None]:
    """Run `op` up to its first query in the caller's thread (where it encodes its values):
    (that query, None), or (None, its result) when it needs no database at all."""
    try:
        return next(op), None
    except StopIteration as stop:
        return None, stop.value


class Queries:
    """The named queries and migrations of one dialect, loaded from `sql/<dialect>/`."""

    def __init__(self, dialect: str) -> None:
        folder = resources.files(__package__) / "sql" / dialect
        self.named: dict[str, str] = {}
        name = None
        for line in (folder / "queries.sql").read_text().splitlines():
            if line.startswith("-- name:"):
                name = line.split(":", 1)[1].strip()
                self.named[name] = ""
            elif name is not None and not line.startswith("--"):
                self.named[name] += line + "\n"
        self.named = {k: v.strip().rstrip(";") for k, v in self.named.items()}
        self.migrations: list[tuple[int, str]] = sorted(
            (int(f.name.split("_", 1)[0]), f.read_text())
            for f in folder.iterdir()
            if f.name[:4].isdigit() and f.name.endswith(".sql")
        )
        self._composed: dict[tuple[str, tuple[str, ...]], str] = {}

    def sql(self, query: Query) -> str:
        key = (query.name, query.where)
        text = self._composed.get(key)
        if text is None:
            where = " AND ".join(f"({self.named[w]})" for w in query.where) or "1 = 1"
            text = self.named[query.name].replace("{where}", where)
            self._composed[key] = text
        return text

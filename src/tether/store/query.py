"""The statements of a store operation, and the loops that run them.

An operation (`store/ops/`, `integrations/langgraph/ops.py`) is a generator: it yields `Query`
values and is sent their results, so one implementation of each operation serves SQLite and
PostgreSQL, sync and async callers. A driver only executes what it is given: `drive` and
`adrive` feed an operation its results. The SQL lives in `sql/<dialect>/`, one named query per
statement; `check_schema` judges a database's applied migrations against the code's. This
module knows no database driver and nothing of runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

from tether.errors import ConfigurationError

T = TypeVar("T")
Q = TypeVar("Q")
Row = tuple[Any, ...]
# A query's parameters: by name, or (the hot path's upsert, which SQLite binds faster so) by
# position; lists where the query takes an array (PostgreSQL's ANY, SQLite's json_each).
Params = Mapping[str, Any] | Sequence[Any]


class Conflict(Exception):
    """A guarded statement broke a unique constraint: the driver throws this into the
    operation (which decides what it means), with the transaction still usable."""


@dataclass(frozen=True, slots=True)
class Query:
    """One statement: a named query, its parameters (a list of them when `many`), and the
    named fragments that make its WHERE clause. A `guard`ed one may break a unique constraint
    (Conflict) without spoiling its transaction. An operation's first query may be `alone`: it
    does the whole operation or changes nothing, so a driver may commit it on its own before
    running the rest (PostgreSQL: one round trip instead of a transaction's three)."""

    name: str
    params: Params | Sequence[Params]
    many: bool = False
    where: tuple[str, ...] = ()
    guard: bool = False
    alone: bool = False


# An operation yields queries and gets back, for each: its rows (a SELECT or RETURNING), the
# number of rows it changed (other statements), or None (`many`). A dialect's query may be
# empty where that dialect needs no statement (SQLite's row locks: its write lock serializes
# every writer): its result is no rows.
Op = Generator[Query, Any, T]


# The helpers take the query's name positionally: a parameter may be called `name` too.


def select(
    name: str, where: tuple[str, ...] = (), /, **params: Any
) -> Generator[Query, Any, list[Row]]:
    rows: list[Row] = yield Query(name, params, where=where)
    return rows


def one(name: str, /, **params: Any) -> Generator[Query, Any, Row | None]:
    """The first row of a query, or None."""
    rows: list[Row] = yield Query(name, params)
    return rows[0] if rows else None


def execute(name: str, /, **params: Any) -> Generator[Query, Any, int]:
    count: int = yield Query(name, params)
    return count


def execute_many(name: str, rows: Sequence[Mapping[str, Any]]) -> Generator[Query, Any, None]:
    if len(rows) == 1:
        yield Query(name, rows[0])
    elif rows:
        yield Query(name, rows, many=True)


def drive(op: Generator[Q, Any, T], run: Callable[[Q], Any], first: Q | None = None) -> T:
    """Run `op` to its end, executing each query with `run`; `first` is the query a caller
    already took from it (see `prime`). A Conflict that `run` raises is thrown into `op`."""
    try:
        query = next(op) if first is None else first
        while True:
            try:
                result = run(query)
            except Conflict as conflict:
                query = op.throw(conflict)
            else:
                query = op.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        op.close()


async def adrive(
    op: Generator[Q, Any, T],
    run: Callable[[Q], Awaitable[Any]],
    *,
    threads: bool = False,
    first: Q | None = None,
) -> T:
    """`drive` for a database with an async driver. With `threads`, the operation's own work
    between queries (encoding and decoding large values) runs in a thread, so it never stalls
    the loop; without, on the loop (the store's operations, whose values come encoded), and
    `first` is the query a caller already took from it."""
    if not threads:
        try:
            query = next(op) if first is None else first
            while True:
                try:
                    result = await run(query)
                except Conflict as conflict:
                    query = op.throw(conflict)
                else:
                    query = op.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            op.close()
    assert first is None, "an operation driven in threads starts there"
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
    """The named queries and migrations of one dialect, loaded from `sql/<dialect>/` of a
    package: every `*.sql` file not named like a migration (`0001_init.sql`) holds queries,
    each after a `-- name: NAME` line; `{key}` in a query is replaced by `fill[key]`."""

    def __init__(self, package: str, dialect: str, fill: Mapping[str, str] | None = None) -> None:
        folder = resources.files(package) / "sql" / dialect
        self.dialect = dialect
        named: dict[str, str] = {}
        files = [f for f in folder.iterdir() if f.name.endswith(".sql")]
        for file in sorted(files, key=lambda f: f.name):
            if file.name[:4].isdigit():
                continue
            name = None
            for line in file.read_text().splitlines():
                if line.startswith("-- name:"):
                    name = line.split(":", 1)[1].strip()
                    if name in named:
                        raise ValueError(f"two queries are named {name!r} in sql/{dialect}/")
                    named[name] = ""
                elif name is not None and not line.startswith("--"):
                    named[name] += line + "\n"
        for key, value in (fill or {}).items():
            named = {k: v.replace("{" + key + "}", value) for k, v in named.items()}
        self.named = {k: v.strip().rstrip(";").strip() for k, v in named.items()}
        self.migrations: list[tuple[int, str]] = sorted(
            (int(f.name.split("_", 1)[0]), f.read_text()) for f in files if f.name[:4].isdigit()
        )
        self._composed: dict[tuple[str, tuple[str, ...]], str] = {}

    def sql(self, query: Query) -> str:
        key = (query.name, query.where)
        text = self._composed.get(key)
        if text is None:
            try:
                text = self.named[query.name]
            except KeyError:
                raise KeyError(f"sql/{self.dialect}/ has no query named {query.name!r}") from None
            if query.where:
                where = " AND ".join(f"({self.named[w]})" for w in query.where)
                text = text.replace("{where}", where)
            else:
                text = text.replace("{where}", "1 = 1")
            self._composed[key] = text
        return text


def check_schema(done: set[int], known: set[int], where: str, *, migrate: bool) -> None:
    """Refuse a schema this code cannot use: versions it does not know (a newer Tether made
    them), or, when not migrating, versions it needs that were never applied."""
    newer = sorted(done - known)
    if newer:
        raise ConfigurationError(
            f"the database {where} has schema migrations {newer} that this Tether does not "
            f"know (it knows up to {max(known)}): a newer Tether migrated it; upgrade Tether "
            f"in this process to the version the others run"
        )
    missing = sorted(known - done)
    if missing and not migrate:
        raise ConfigurationError(
            f"the database {where} lacks schema migrations {missing} of this Tether, and the "
            f"URL says migrate=false: run `tether migrate -d URL` (with a role that may change "
            f"the schema), then start again"
        )

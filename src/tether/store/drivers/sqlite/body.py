"""The connection a transaction step's body gets on SQLite, guarded: its statements run in the
store's transaction (a savepoint when the batch is shared) and it refuses what would end or
change that transaction. An SQL error of the body fails that operation only; a failure of the
database (disk full, I/O) the batch, as for any operation. It knows nothing of runs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

from tether.errors import PermanentError
from tether.store.drivers.guard import REFUSAL, Refusing, refused_statement
from tether.store.port.outbox import TransactionBody, TransactionOutcome

# Errors after which the database, not the body's SQL, is at fault: the batch fails whole.
_FATAL = frozenset(
    {sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOMEM,
     sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED,
     sqlite3.SQLITE_INTERRUPT, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PROTOCOL}
)  # fmt: skip


class BodyFailed(Exception):
    """Carries what a transaction body raised out of the group commit, so that an SQL error
    of the body's own is that operation's outcome rather than a failure of the whole batch."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class GuardedCursor:
    """A cursor of a transaction body's connection (see GuardedConnection)."""

    def __init__(self, owner: GuardedConnection, cursor: sqlite3.Cursor) -> None:
        self._owner, self._cursor = owner, cursor

    def execute(self, sql: str, parameters: Any = ()) -> GuardedCursor:
        self._owner.check(sql)
        self._cursor.execute(sql, parameters)
        return self

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any]) -> GuardedCursor:
        self._owner.check(sql)
        self._cursor.executemany(sql, seq_of_parameters)
        return self

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    def fetchmany(self, size: int | None = None) -> list[Any]:
        return self._cursor.fetchmany(self._cursor.arraysize if size is None else size)

    def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor)

    def close(self) -> None:
        self._cursor.close()

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def lastrowid(self) -> int | None:
        return self._cursor.lastrowid

    @property
    def description(self) -> Any:
        return self._cursor.description

    @property
    def arraysize(self) -> int:
        return self._cursor.arraysize


class GuardedConnection(Refusing):
    """The connection an @app.transaction() body gets on SQLite: Tether's own connection,
    inside the transaction that also writes the step's checkpoint. It runs statements
    (execute, executemany, cursor) and refuses what would end or change that transaction:
    commit(), rollback(), close(), executescript() and BEGIN, COMMIT, SAVEPOINT... statements.
    It works only while the body runs. `row_factory` applies to its cursors."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn: sqlite3.Connection | None = conn
        self.row_factory: Any = None

    def check(self, sql: str) -> None:
        conn = self._conn
        if conn is None:
            raise PermanentError(
                "this connection belonged to a transaction step that has ended; use the "
                "connection only inside the body it was passed to"
            )
        if not isinstance(sql, str):
            raise TypeError(f"SQL must be a str, not {type(sql).__name__}")
        why = refused_statement(sql)
        if why is not None:
            raise PermanentError(why)
        if not conn.in_transaction:  # SQLite rolled it back (disk full...): stop here
            raise sqlite3.OperationalError("the transaction was rolled back by SQLite")

    def cursor(self) -> GuardedCursor:
        self.check("SELECT 1")
        return self._cursor()

    def _cursor(self) -> GuardedCursor:
        assert self._conn is not None
        cursor = self._conn.cursor()
        if self.row_factory is not None:
            cursor.row_factory = self.row_factory
        return GuardedCursor(self, cursor)

    def execute(self, sql: str, parameters: Any = ()) -> GuardedCursor:
        self.check(sql)
        cursor = self._cursor()
        cursor._cursor.execute(sql, parameters)
        return cursor

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any]) -> GuardedCursor:
        self.check(sql)
        cursor = self._cursor()
        cursor._cursor.executemany(sql, seq_of_parameters)
        return cursor

    def executescript(self, script: str) -> None:
        raise PermanentError(f"executescript() (which commits first) is not allowed {REFUSAL}")

    @property
    def in_transaction(self) -> bool:
        return self._conn is not None and self._conn.in_transaction

    @property
    def total_changes(self) -> int:
        return 0 if self._conn is None else self._conn.total_changes

    def release(self) -> None:
        """The body has ended: the connection is Tether's again."""
        self._conn = None


def fatal(exc: sqlite3.Error, conn: sqlite3.Connection) -> bool:
    """Whether an SQLite error met by a body is the database's (the batch must fail) rather
    than the body's own SQL's."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return code in _FATAL or not conn.in_transaction


def run_body(
    c: sqlite3.Connection, body: TransactionBody, *, keep_sqlite_errors: bool
) -> TransactionOutcome:
    """Call `body` with a guarded connection on `c` (inside its transaction). What the body
    raises comes out as BodyFailed, except an SQLite failure of the database itself, which
    comes out as it is (with keep_sqlite_errors, a store without a group commit to protect
    gets every error as it is)."""
    guard = GuardedConnection(c)
    try:
        outcome = body(guard)
    except sqlite3.Error as exc:
        if not keep_sqlite_errors and fatal(exc, c):
            raise
        raise BodyFailed(exc) from exc
    except Exception as exc:
        raise BodyFailed(exc) from exc
    finally:
        guard.release()
    if not c.in_transaction:
        raise sqlite3.OperationalError(
            "the transaction of a transaction step ended inside its body; nothing was kept"
        )
    return outcome

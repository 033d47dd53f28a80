"""What a transaction step's body may not run on the connection it gets: statements that would
end or change the store's transaction. Both drivers' guarded connections refuse them.
"""

from __future__ import annotations

import functools
import re

from tether.errors import PermanentError

# Statements that would end, split or reconfigure the transaction Tether runs the body in.
_REFUSED = frozenset(
    {"BEGIN", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE", "START", "VACUUM",
     "ATTACH", "DETACH", "SET", "RESET", "DISCARD"}
)  # fmt: skip

# Pragmas that take an argument and only read (others with one change the connection).
_READ_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo",
     "foreign_key_list", "foreign_key_check", "integrity_check", "quick_check"}
)  # fmt: skip

_COMMENTS = re.compile(r"\s*(?:--[^\n]*(?:\n|$)|/\*.*?\*/)", re.DOTALL)

_WORD = re.compile(r"\s*([A-Za-z]+)")

REFUSAL = (
    "inside an @app.transaction() body, the body runs in Tether's transaction, which commits "
    "its writes together with the step's checkpoint: return from the body to commit, raise to "
    "roll back"
)


@functools.lru_cache(maxsize=1024)  # bodies run the same few statements again and again
def refused_statement(sql: str) -> str | None:
    """Why a transaction body may not run `sql` (its first keyword ends or changes the
    transaction), or None when it may."""
    text = sql
    while True:
        found = _COMMENTS.match(text)
        if found is None or not found.group(0):
            break
        text = text[found.end() :]
    word = _WORD.match(text)
    if word is None:
        return None
    keyword = word.group(1).upper()
    rest = text[word.end() :].lstrip().upper()
    if keyword == "SET" and rest.startswith("CONSTRAINTS"):
        return None  # deferring constraint checks stays inside the transaction
    if keyword == "PRAGMA" and "=" not in rest:
        name = rest.split("(", 1)[0].strip().lower().rsplit(".", 1)[-1]
        if "(" not in rest or name in _READ_PRAGMAS:
            return None  # reading a pragma
    if (
        keyword in _REFUSED
        or keyword == "PRAGMA"
        or (keyword == "PREPARE" and rest.startswith("TRANSACTION"))
    ):
        return f"{keyword} is not allowed {REFUSAL}"
    return None


class Refusing:
    """What the guarded connections of both drivers refuse alike: ending the transaction the
    body runs in, or the connection under it."""

    def commit(self) -> None:
        raise PermanentError(f"commit() is not allowed {REFUSAL}")

    def rollback(self) -> None:
        raise PermanentError(f"rollback() is not allowed {REFUSAL}")

    def close(self) -> None:
        raise PermanentError(f"close() is not allowed {REFUSAL}")

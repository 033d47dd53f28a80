"""Log records that say where they come from (the run, its workflow and the step attempt) and
that cannot lie about it: SafeFormatter writes one record as one line, whatever a title, a run
id or an argument holds (control characters shown as escapes, a newline as `\\n`), and hides
secret shapes (tether.redact.redact_text) in everything it writes.

RunContextFilter reads Tether's context variables, so it works for any logger, Tether's or the
user's, in workflow code, in async steps and in sync steps (their threads carry the context).
A handler filter sees every record the handler emits, whichever logger made it; that is why
the filter goes on the handler, not on a logger.

JsonFormatter writes the same record as one line of JSON for log shippers (`install_logging(
format="json")`, TETHER_LOG_FORMAT=json in `tether worker` and `tether serve`). Its values are
what the record said, so a JSON parser gives the original text back, except secrets: they are
redacted in each string value, never in the JSON text as a whole (that could break its quoting).
Every character that is not printable (line breaks of any kind, escape sequences, bidi and
zero-width characters) is written as a JSON escape, so one record is one line.

None of them may change a record other handlers see, and no formatter may raise: an odd record
is written as well as it can be, never dropped.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from collections.abc import Mapping
from datetime import UTC, date, datetime, time
from typing import IO, Literal, get_args

from tether.core.context import ambient
from tether.errors import ConfigurationError
from tether.redact import MAX_DEPTH, REDACTED, is_secret_key, redact_text
from tether.text import visible

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [run=%(run_id)s step=%(step)s] %(message)s"
LogFormat = Literal["text", "json"]


class RunContextFilter(logging.Filter):
    """Adds `run_id`, `workflow` and `step` (the checkpoint name, `fetch#2`) to each record:
    empty strings outside a run or a step. Attributes a record already has (from `extra=`, or
    an earlier handler) are kept. It never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "run_id"):
            run, step = ambient()
            if run is not None:
                record.run_id, record.workflow = run.run_id, run.workflow
            else:
                record.run_id = step.run_id if step is not None else ""
                record.workflow = ""
            record.step = step.name if step is not None else ""
        return True


class SafeFormatter(logging.Formatter):
    """A Formatter that neither forges lines nor leaks secrets. Every string field of the record
    (the message with its arguments, the logger name, run id, workflow, step, extras) is shown
    with control, bidi and zero-width characters escaped, so a record is one line. A traceback
    keeps its lines, each indented, so no line of it starts where a record would. Last, secret
    shapes (keys, tokens, passwords in URLs) in the whole text are redacted."""

    def format(self, record: logging.LogRecord) -> str:
        safe = logging.makeLogRecord(dict(record.__dict__))  # other handlers keep the original
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # args that do not fit msg: say so, still one line
            message = f"{record.msg!r} % {record.args!r}"
        safe.msg, safe.args = message, None
        for key, value in list(vars(safe).items()):
            if isinstance(value, str) and key not in ("exc_text", "stack_info"):
                setattr(safe, key, visible(value, newlines=False))
        if record.exc_info and not record.exc_text:
            safe.exc_text = self.formatException(record.exc_info)
        safe.exc_info = None  # formatted once above, from the original record
        for key in ("exc_text", "stack_info"):
            text = getattr(safe, key, None)
            if text:
                lines = visible(text, newlines=True).replace("\r", "\\r").split("\n")
                setattr(safe, key, "\n".join(lines[:1] + ["  " + line for line in lines[1:]]))
        return redact_text(super().format(safe))


# The attributes every LogRecord has (taskName since Python 3.12, message and asctime once a
# Formatter ran), and the three of RunContextFilter: any other attribute came from `extra=`.
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {
    "taskName",
    "message",
    "asctime",
    "run_id",
    "workflow",
    "step",
}
# JsonFormatter's own fields. An extra of one of these names must not replace it (a caller's
# `extra={"level": "CRITICAL"}` would forge the level): it is written as `extra.<name>`.
_FIELDS = ("time", "level", "logger", "message", "run_id", "workflow", "step", "exception", "stack")
# Characters json.dumps(ensure_ascii=False) may leave raw. Outside string literals its output is
# printable ASCII, so each of these is inside a string, where a \u escape means the same.
_NOT_PLAIN_ASCII = re.compile(r"[^\x20-\x7e]+")
_COMPACT = (",", ":")  # no spaces: a log line is read by a parser first
_BIG_INT_BITS = 12_000  # about 3,600 digits: Python refuses to write an int of more than 4,300


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON: `time` (UTC, `2026-05-02T10:14:03.214Z`), `level`,
    `logger`, `message` (with its arguments), `run_id`, `workflow` and `step` (always there,
    empty strings outside a run or step, as in the text format), then the record's extras
    (`extra=`; one named like a field is written as `extra.<name>`, it cannot replace the field),
    then `exception` (the traceback) and `stack` (stack_info) when the record has them.

    Every string value goes through redact_text, and values under secret-named extras
    (is_secret_key: `password`, `api_key`) are hidden whole. An extra JSON cannot hold is written
    as text: str(), else repr(); dates in ISO 8601; NaN and infinities as "nan", "inf"; sets
    and tuples as lists; nesting past MAX_DEPTH, and cycles, as REDACTED. The fmt, datefmt and
    style of logging.Formatter are ignored. The record is not changed (logging.Formatter caches
    `message`, `asctime` and `exc_text` on it; this formatter does not)."""

    def format(self, record: logging.LogRecord) -> str:
        try:
            line = json.dumps(self._fields(record), ensure_ascii=False, separators=_COMPACT)
        except Exception as error:  # a record odder than _fields foresees: say so, on one line
            line = json.dumps(
                {
                    "time": _utc(getattr(record, "created", None)),
                    "level": "ERROR",
                    "logger": __name__,
                    "message": f"a log record could not be written: {type(error).__name__}",
                    "run_id": "",
                    "workflow": "",
                    "step": "",
                },
                separators=_COMPACT,
            )
        return _NOT_PLAIN_ASCII.sub(_escape_unprintable, line)

    def _fields(self, record: logging.LogRecord) -> dict[str, object]:
        fields: dict[str, object] = {
            "time": _utc(record.created),
            "level": _text(record.levelname),
            "logger": _text(record.name),
            "message": _text(_message(record)),
            "run_id": _text(getattr(record, "run_id", "")),
            "workflow": _text(getattr(record, "workflow", "")),
            "step": _text(getattr(record, "step", "")),
        }
        for key, value in vars(record).items():
            if key in _RECORD_ATTRIBUTES:
                continue
            name = _text(key)
            secret = is_secret_key(name)
            fields[f"extra.{name}" if name in _FIELDS else name] = (
                REDACTED if secret else _jsonable(value, 0, frozenset())
            )
        exception = record.exc_text or (self._traceback(record) if record.exc_info else None)
        if exception:
            fields["exception"] = _text(exception)
        if record.stack_info:
            fields["stack"] = _text(self.formatStack(record.stack_info))
        return fields

    def _traceback(self, record: logging.LogRecord) -> str:
        try:
            return self.formatException(record.exc_info)  # type: ignore[arg-type]  # not None
        except Exception:  # exc_info made by hand, not a (type, value, traceback) triple
            return _str(record.exc_info)


def _utc(created: object) -> str:
    """ISO 8601 in UTC, to the millisecond: `2026-05-02T10:14:03.214Z`."""
    try:
        moment = datetime.fromtimestamp(created, UTC)  # type: ignore[arg-type]  # checked here
    except (TypeError, ValueError, OverflowError, OSError):  # a record made by hand
        return _text(created)
    return moment.isoformat(timespec="milliseconds").removesuffix("+00:00") + "Z"


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # args that do not fit msg (or a msg whose str() fails): say what was given
        return f"{_repr(record.msg)} % {_repr(record.args)}"


def _str(value: object) -> str:
    """str(value), else repr(value), else a placeholder: never raises."""
    try:
        return str(value)
    except Exception:
        return _repr(value)


def _repr(value: object) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<unprintable {type(value).__qualname__}>"


def _text(value: object) -> str:
    return redact_text(value if isinstance(value, str) else _str(value))


def _jsonable(value: object, depth: int, within: frozenset[int]) -> object:
    """`value` as something json.dumps writes as valid JSON, its strings redacted. `within`
    holds the ids of the containers around it, so that a cycle ends."""
    if isinstance(value, str):
        return redact_text(value)
    if value is None or isinstance(value, bool):
        return value
    try:
        return _jsonable_inside(value, depth, within)
    except Exception:  # an odd value (a container whose iteration fails, ...): as str() says
        return _text(value)


def _jsonable_inside(value: object, depth: int, within: frozenset[int]) -> object:
    if isinstance(value, int):  # int(): an IntEnum or another subclass is written as a number
        bits = value.bit_length()
        return int(value) if bits < _BIG_INT_BITS else f"<an int of {bits} bits>"
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else str(value)  # NaN is not JSON
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if not isinstance(value, Mapping | list | tuple | set | frozenset):
        return _text(value)
    if depth >= MAX_DEPTH or id(value) in within:
        return REDACTED
    within = within | {id(value)}
    if isinstance(value, Mapping):
        return {
            _text(key): REDACTED if is_secret_key(_str(key)) else _jsonable(item, depth + 1, within)
            for key, item in value.items()
        }
    items = [_jsonable(item, depth + 1, within) for item in value]
    if isinstance(value, set | frozenset):  # in a stable order: a set's order changes per process
        items.sort(key=lambda item: json.dumps(item, sort_keys=True))
    return items


def _escape_unprintable(match: re.Match[str]) -> str:
    return "".join(char if char.isprintable() else _json_escape(char) for char in match.group())


def _json_escape(char: str) -> str:
    """`char` as a JSON escape; past U+FFFF as a UTF-16 surrogate pair, as JSON wants. A lone
    surrogate is escaped too (raw, it cannot be written as UTF-8)."""
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def log_format_from_env(value: str | None) -> LogFormat:
    """The log format a TETHER_LOG_FORMAT value asks for: `text` or `json`, in any case, spaces
    around ignored; unset or empty is `text`. Anything else is refused (ConfigurationError), so
    that a typo stops the process at start instead of logging in a format nobody parses."""
    chosen = (value or "").strip().lower()
    if chosen in ("", "text"):
        return "text"
    if chosen == "json":
        return "json"
    raise ConfigurationError(
        f"TETHER_LOG_FORMAT is `text` or `json` (in any case), or unset for text; not {value!r}"
    )


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler install_logging puts on the root logger (so it can find it again). Without
    a stream of its own it writes to whatever sys.stderr is at each record, as logging's last
    resort handler does (so a replaced stderr, a test's capture, is honoured)."""

    def __init__(self, stream: IO[str] | None) -> None:
        logging.Handler.__init__(self)
        self._own = stream

    @property
    def stream(self) -> IO[str]:
        return self._own if self._own is not None else sys.stderr

    @stream.setter
    def stream(self, value: IO[str] | None) -> None:
        self._own = value


def install_logging(
    level: int | str = logging.INFO,
    *,
    stream: IO[str] | None = None,
    fmt: str = LOG_FORMAT,
    format: LogFormat = "text",
) -> logging.Handler:
    """Log every record at `level` or above to `stream` (stderr), one record a line, secrets
    redacted. With `format="text"`, as `fmt` (SafeFormatter), which may use %(run_id)s,
    %(workflow)s and %(step)s; with `format="json"`, as JSON (JsonFormatter; `fmt` is ignored).
    Sets the root logger's level, like basicConfig.
    Called again, it reconfigures the handler it installed instead of adding another."""
    if format not in get_args(LogFormat):  # checked before anything changes
        raise ConfigurationError(f"the log format is 'text' or 'json', not {format!r}")
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, _Handler)), None)
    if handler is None:
        handler = _Handler(stream)
        handler.addFilter(RunContextFilter())
        root.addHandler(handler)
    elif stream is not None:
        handler.stream = stream
    handler.setFormatter(JsonFormatter() if format == "json" else SafeFormatter(fmt))
    handler.setLevel(level)
    root.setLevel(level)
    return handler

"""Log records that say where they come from (the run, its workflow and the step attempt) and
that cannot lie about it: SafeFormatter writes one record as one line, whatever a title, a run
id or an argument holds (control characters shown as escapes, a newline as `\\n`), and hides
secret shapes (tether.redact.redact_text) in everything it writes.

RunContextFilter reads Tether's context variables, so it works for any logger, Tether's or the
user's, in workflow code, in async steps and in sync steps (their threads carry the context).
A handler filter sees every record the handler emits, whichever logger made it; that is why
the filter goes on the handler, not on a logger. Neither may change a record other handlers see.
"""

from __future__ import annotations

import logging
import sys
from typing import IO

from tether.core.context import ambient
from tether.redact import redact_text
from tether.text import visible

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [run=%(run_id)s step=%(step)s] %(message)s"


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
    level: int | str = logging.INFO, *, stream: IO[str] | None = None, fmt: str = LOG_FORMAT
) -> logging.Handler:
    """Log every record at `level` or above to `stream` (stderr) as `fmt`, which may use
    %(run_id)s, %(workflow)s and %(step)s; one record, one line (SafeFormatter), secrets
    redacted. Sets the root logger's level, like basicConfig.
    Called again, it reconfigures the handler it installed instead of adding another."""
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, _Handler)), None)
    if handler is None:
        handler = _Handler(stream)
        handler.addFilter(RunContextFilter())
        root.addHandler(handler)
    elif stream is not None:
        handler.stream = stream
    handler.setFormatter(SafeFormatter(fmt))
    handler.setLevel(level)
    root.setLevel(level)
    return handler

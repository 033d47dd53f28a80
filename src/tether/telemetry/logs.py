"""Log records that say where they come from: the run, its workflow and the step attempt.

RunContextFilter reads Tether's context variables, so it works for any logger, Tether's or the
user's, in workflow code, in async steps and in sync steps (their threads carry the context).
A handler filter sees every record the handler emits, whichever logger made it; that is why
the filter goes on the handler, not on a logger.
"""

from __future__ import annotations

import logging
import sys
from typing import IO

from tether.core.context import ambient

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
    %(run_id)s, %(workflow)s and %(step)s. Sets the root logger's level, like basicConfig.
    Called again, it reconfigures the handler it installed instead of adding another."""
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, _Handler)), None)
    if handler is None:
        handler = _Handler(stream)
        handler.addFilter(RunContextFilter())
        root.addHandler(handler)
    elif stream is not None:
        handler.stream = stream
    handler.setFormatter(logging.Formatter(fmt))
    handler.setLevel(level)
    root.setLevel(level)
    return handler

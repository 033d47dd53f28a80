"""The control-flow signals that end one execution of a run short, without ending the run.

They derive from BaseException so that user code's `except Exception` cannot swallow them;
user code must never catch them (nor BaseException). An execution ends as a whole
(RunContext.end): every task of the workflow unwinds with the same signal, then the runner
records what it means. This module holds no logic and imports only errors.
"""

from __future__ import annotations

from collections.abc import Sequence

from tether.errors import LeaseLost, NonDeterminismError, SerializationError, StoreUnavailable


class Signal(BaseException):
    """Base of Tether's control-flow signals."""


class Suspend(Signal):
    """The run releases its worker until wake_at (a durable retry delay, a timer), or until an
    event arrives for one of the wake_on keys: every task of the workflow waits."""

    def __init__(self, wake_at: float | None, wake_on: Sequence[str] = ()) -> None:
        super().__init__(wake_at)
        self.wake_at = wake_at
        self.wake_on = tuple(wake_on)


class ReplayNow(Signal):
    """Forced-replay mode: restart the workflow from the store after a new checkpoint."""


class EndOfHistory(Signal):
    """Replay-only mode: every task waits for something the history does not hold, and every
    recorded checkpoint was asked for and matched."""


class Abandon(Signal):
    """The run cannot go on here: the lease was lost, replay diverged from the history, or a
    recorded checkpoint cannot be decoded (SerializationError: the engine cannot execute the
    run, and counts the failure; see Runner)."""

    def __init__(
        self, cause: LeaseLost | NonDeterminismError | StoreUnavailable | SerializationError
    ) -> None:
        super().__init__(str(cause))
        self.cause = cause

"""Retry policies for steps: how many attempts, how long to wait between them, which errors retry.

Pure computation: the engine persists the attempt count and the due time of the next attempt, so
a restart during a backoff waits out the rest. This module does no I/O and reads no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from tether.errors import ConfigurationError, PermanentError, SerializationError

# Errors that cannot go away by trying again: the same input gives the same failure.
_NEVER_RETRIED: tuple[type[BaseException], ...] = (PermanentError, SerializationError)


@dataclass(frozen=True, slots=True)
class Retry:
    """A step's retry policy. Attempt n (n >= 1) that fails waits
    min(initial_delay * backoff**(n-1), max_delay), shortened by up to `jitter` of itself."""

    max_attempts: int = 3
    initial_delay: timedelta = timedelta(seconds=1)
    backoff: float = 2.0
    max_delay: timedelta = timedelta(minutes=1)
    jitter: float = 0.1
    retry_on: tuple[type[BaseException], ...] = field(default=(Exception,))

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            problems.append(f"max_attempts must be an int >= 1, not {self.max_attempts!r}")
        for name in ("initial_delay", "max_delay"):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value < timedelta(0):
                problems.append(f"{name} must be a timedelta >= 0, not {value!r}")
        if not isinstance(self.backoff, int | float) or self.backoff < 1:
            problems.append(f"backoff must be a number >= 1, not {self.backoff!r}")
        if not isinstance(self.jitter, int | float) or not 0 <= self.jitter <= 1:
            problems.append(f"jitter must be between 0 and 1, not {self.jitter!r}")
        retry_on = self.retry_on
        if not isinstance(retry_on, tuple) or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in retry_on
        ):
            problems.append(f"retry_on must be a tuple of exception classes, not {retry_on!r}")
        if problems:
            raise ConfigurationError("invalid tether.Retry: " + "; ".join(problems))

    def delay(self, attempt: int, u: float) -> float:
        """Seconds to wait after failed attempt `attempt`; u in [0, 1) draws the jitter."""
        base = self.initial_delay.total_seconds() * self.backoff ** (attempt - 1)
        base = min(base, self.max_delay.total_seconds())
        return base * (1.0 - self.jitter * u)

    def retries(self, exc: BaseException, attempt: int) -> bool:
        """Whether failed attempt `attempt` with this error is followed by another."""
        if attempt >= self.max_attempts or isinstance(exc, _NEVER_RETRIED):
            return False
        return isinstance(exc, self.retry_on)


NO_RETRY = Retry(max_attempts=1)

"""Retry policy properties: delays stay within their bounds, and which errors retry."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tether
from tether.core.retry import Retry

policies = st.builds(
    Retry,
    max_attempts=st.integers(1, 20),
    initial_delay=st.timedeltas(timedelta(0), timedelta(minutes=5)),
    backoff=st.floats(1.0, 10.0),
    max_delay=st.timedeltas(timedelta(0), timedelta(hours=1)),
    jitter=st.floats(0.0, 1.0),
)


@settings(max_examples=300, deadline=None)
@given(policy=policies, attempt=st.integers(1, 60), u=st.floats(0.0, 1.0, exclude_max=True))
def test_a_retry_delay_stays_between_its_jittered_floor_and_the_max_delay(
    policy: Retry, attempt: int, u: float
) -> None:
    delay = policy.delay(attempt, u)
    base = min(
        policy.initial_delay.total_seconds() * policy.backoff ** (attempt - 1),
        policy.max_delay.total_seconds(),
    )
    assert 0.0 <= delay <= policy.max_delay.total_seconds() + 1e-9
    assert base * (1 - policy.jitter) - 1e-9 <= delay <= base + 1e-9


@settings(max_examples=200, deadline=None)
@given(policy=policies.filter(lambda p: p.jitter == 0), attempt=st.integers(1, 30))
def test_without_jitter_delays_never_shrink_from_one_attempt_to_the_next(
    policy: Retry, attempt: int
) -> None:
    assert policy.delay(attempt + 1, 0.5) >= policy.delay(attempt, 0.5)


@settings(max_examples=200, deadline=None)
@given(policy=policies, attempt=st.integers(1, 25))
def test_the_last_attempt_and_permanent_errors_never_retry(policy: Retry, attempt: int) -> None:
    assert not policy.retries(tether.PermanentError("no"), attempt)
    assert not policy.retries(tether.SerializationError("no"), attempt)
    assert policy.retries(OSError("flaky"), attempt) == (attempt < policy.max_attempts)


def test_retry_on_limits_which_errors_retry() -> None:
    policy = Retry(max_attempts=3, retry_on=(TimeoutError, ConnectionError))
    assert policy.retries(TimeoutError(), 1)
    assert policy.retries(ConnectionResetError(), 1)
    assert not policy.retries(ValueError(), 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be an int >= 1"),
        ({"initial_delay": 1.5}, "initial_delay must be a timedelta"),
        ({"max_delay": timedelta(seconds=-1)}, "max_delay must be a timedelta >= 0"),
        ({"backoff": 0.5}, "backoff must be a number >= 1"),
        ({"jitter": 2}, "jitter must be between 0 and 1"),
        ({"retry_on": ValueError}, "retry_on must be a tuple of exception classes"),
    ],
)
def test_an_invalid_policy_is_refused_with_what_to_fix(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(tether.ConfigurationError, match=message):
        Retry(**kwargs)  # type: ignore[arg-type]

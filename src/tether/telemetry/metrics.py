"""In-process metrics of run executions and step attempts, fed by the engine's observer.

Plain dicts of numbers keyed by label values: counting costs a dict lookup and an addition
on the event loop, and nothing is imported for it. Labels are bounded by what the App
registers (workflow and step names, outcomes), never by run ids or checkpoint names, so a
loop of a thousand steps does not make a thousand series. The server turns a snapshot into
the Prometheus text format (tether.server.metrics); these are this process's counts only.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import cast

from tether.core.engine import Engine
from tether.core.observe import Observer, RunOutcome, StepOutcome, installed
from tether.errors import LeaseLost

# Upper bounds (seconds) of the step duration buckets: from a fast local call to a slow model.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0)  # fmt: skip
# Executions after which the run goes on: they count as executions, not as finished runs.
_GOES_ON = frozenset({RunOutcome.SUSPENDED, RunOutcome.ERRORED, RunOutcome.ABANDONED,
                      RunOutcome.HELD})  # fmt: skip


@dataclass(slots=True)
class Histogram:
    """Observations counted per bucket (`counts[i]`: those <= bounds[i] and above the bound
    before; the last count is above every bound), with their sum and number."""

    bounds: tuple[float, ...] = DURATION_BUCKETS
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it) per bucket, ending with (inf, count)."""
        total, out = 0, []
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    def copy(self) -> Histogram:
        return Histogram(self.bounds, list(self.counts), self.sum, self.count)


class Metrics(Observer):
    """Counts of what this process executed: runs started (their first execution began here)
    by workflow, runs finished by workflow and status, run executions by workflow and outcome
    (suspended, errored and abandoned ones too), executions stopped by a lost lease by
    workflow, step attempts by step and outcome, and a histogram of step attempt durations by
    step (completed, retrying and failed attempts; an interrupted attempt has no duration worth
    reporting). Keys hold the outcome members themselves (StrEnum: they compare and print as
    their values)."""

    def __init__(self) -> None:
        self.runs_started: dict[str, int] = {}  # by workflow
        self.lease_losses: dict[str, int] = {}  # by workflow
        self.runs_finished: dict[tuple[str, RunOutcome], int] = {}  # (workflow, status)
        self.run_executions: dict[tuple[str, RunOutcome], int] = {}  # (workflow, outcome)
        self.step_attempts: dict[tuple[str, StepOutcome], int] = {}  # (step, outcome)
        self.step_durations: dict[str, Histogram] = {}  # by step

    def run_started(self, run_id: str, workflow: str, epoch: int) -> object:
        if epoch == 1:  # the first claim: a run created claimed, or claimed once
            self.runs_started[workflow] = self.runs_started.get(workflow, 0) + 1
        return workflow

    def run_ended(self, state: object, outcome: RunOutcome, error: BaseException | None) -> None:
        workflow = cast(str, state)
        key = (workflow, outcome)
        self.run_executions[key] = self.run_executions.get(key, 0) + 1
        if outcome not in _GOES_ON:
            self.runs_finished[key] = self.runs_finished.get(key, 0) + 1
        elif outcome is RunOutcome.ABANDONED and isinstance(error, LeaseLost):
            self.lease_losses[workflow] = self.lease_losses.get(workflow, 0) + 1

    def step_started(
        self, run_id: str, workflow: str, step: str, name: str, attempt: int
    ) -> object:
        return step

    def step_ended(
        self, state: object, outcome: StepOutcome, duration: float, error: BaseException | None
    ) -> None:
        step = cast(str, state)
        key = (step, outcome)
        attempts = self.step_attempts
        attempts[key] = attempts.get(key, 0) + 1
        if outcome is not StepOutcome.INTERRUPTED:
            histogram = self.step_durations.get(step)
            if histogram is None:
                histogram = self.step_durations[step] = Histogram()
            histogram.observe(duration if duration > 0.0 else 0.0)

    def snapshot(self) -> Metrics:
        """A copy to read while the engine goes on counting."""
        copy = Metrics()
        copy.runs_started = dict(self.runs_started)
        copy.lease_losses = dict(self.lease_losses)
        copy.runs_finished = dict(self.runs_finished)
        copy.run_executions = dict(self.run_executions)
        copy.step_attempts = dict(self.step_attempts)
        copy.step_durations = {k: h.copy() for k, h in list(self.step_durations.items())}
        return copy


def metrics_of(engine: Engine) -> Metrics:
    """The Metrics observing this engine, installed on first use (one per engine)."""
    for observer in installed(engine.observer):
        if isinstance(observer, Metrics):
            return observer
    metrics = Metrics()
    engine.observe(metrics)
    return metrics

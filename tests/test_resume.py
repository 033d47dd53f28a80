"""Which recorded failure ended a run (core.resume.ending_failure): the one the runner named,
or, for a run failed by an older version that named none, the last failed checkpoint with the
run's error; a failure the workflow caught and handled is never the one."""

from __future__ import annotations

import json

from tether.core.resume import ending_failure
from tether.store.port import Checkpoint, CheckpointStatus, RunRecord, RunStatus


def failed(seq: int, name: str, kind: str, message: str) -> Checkpoint:
    error = json.dumps({"type": kind, "message": message, "traceback": ""})
    return Checkpoint(seq, name, "step", CheckpointStatus.FAILED, error=error, attempts=1)


def run(error: dict[str, str] | None) -> RunRecord:
    return RunRecord("r", "wf", RunStatus.FAILED, "{}", error=None if error is None
                     else json.dumps(error))  # fmt: skip


HISTORY = [
    failed(0, "lookup", "LookupError", "not there"),  # caught by the workflow
    Checkpoint(1, "fetch", "step", CheckpointStatus.COMPLETED, result="1", attempts=1),
    failed(2, "publish", "ValueError", "down"),
]


def test_the_failure_the_runner_named_is_the_one() -> None:
    assert ending_failure(run({"type": "ValueError", "message": "down", "position": "2"}),
                          HISTORY) == "2"  # fmt: skip


def test_an_older_runs_error_is_matched_to_the_last_failed_checkpoint_with_it() -> None:
    assert ending_failure(run({"type": "ValueError", "message": "down"}), HISTORY) == "2"
    again = [*HISTORY, failed(3, "publish#2", "ValueError", "down")]
    assert ending_failure(run({"type": "ValueError", "message": "down"}), again) == "3"


def test_a_failure_of_the_workflows_own_code_names_no_checkpoint() -> None:
    # The workflow raised its own error after catching `lookup`: no step failure ended it.
    assert ending_failure(run({"type": "RuntimeError", "message": "gave up"}), HISTORY) is None
    assert ending_failure(run(None), HISTORY) is None

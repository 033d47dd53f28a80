"""Golden histories, recorded once and kept: the current workflow code must replay each of them,
and must refuse the one recorded from an incompatible older version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.golden import flows

import tether
from tether.testing import assert_replays, check_history

HERE = Path(__file__).parent
COMPATIBLE = sorted(p for p in HERE.glob("*.json") if "nondeterministic" not in p.name)


def current_app(**versions: int) -> tether.App:
    app = tether.App("memory://")
    flows.register(app, **versions)
    return app


def test_the_golden_folder_holds_histories_of_every_kind() -> None:
    names = {p.stem for p in HERE.glob("*.json")}
    assert {"order_v2", "greet", "batch", "order_v1_nondeterministic", "survey"} <= names


@pytest.mark.parametrize("path", COMPATIBLE, ids=[p.stem for p in COMPATIBLE])
async def test_a_recorded_history_replays_under_the_current_code(path: Path) -> None:
    history = json.loads(path.read_text())
    assert history["checkpoints"], "an empty history proves nothing"
    await assert_replays(current_app(), history)


async def test_a_history_of_the_older_order_workflow_fails_as_nondeterministic() -> None:
    history = json.loads((HERE / "order_v1_nondeterministic.json").read_text())
    outcome = await check_history(current_app(), history)
    assert not outcome.ok
    assert isinstance(outcome.error, tether.NonDeterminismError)
    assert outcome.error.recorded[:2] == ["charge", "reserve"]
    assert outcome.error.requested == ["reserve"]
    assert "recorded 'charge' at position 0, this code asked for 'reserve'" in str(outcome.error)


async def test_a_history_cut_short_replays_as_far_as_it_goes() -> None:
    history = json.loads((HERE / "batch.json").read_text())
    history["checkpoints"] = history["checkpoints"][:1]  # as if the run were still going
    assert (await check_history(current_app(), history)).ok


async def test_a_history_with_a_step_the_code_no_longer_asks_for_fails() -> None:
    history = json.loads((HERE / "batch.json").read_text())
    extra = dict(history["checkpoints"][-1], seq=len(history["checkpoints"]), name="audit")
    history["checkpoints"].append(extra)
    outcome = await check_history(current_app(), history)
    assert outcome.error is not None
    assert "stopped after 3 checkpoints" in str(outcome.error)


async def test_a_history_whose_arguments_no_longer_fit_the_workflow_fails_with_a_report() -> None:
    history = json.loads((HERE / "batch.json").read_text())
    history["args"] = {"args": [], "kwargs": {"count": 3}}  # as if `batch(n)` became `batch()`
    outcome = await check_history(current_app(), history)
    assert outcome.error is not None
    assert "no longer fit workflow 'batch'" in str(outcome.error)


async def test_a_concurrent_history_replays_whatever_order_its_tasks_finished_in() -> None:
    history = json.loads((HERE / "survey.json").read_text())
    names = [c["name"] for c in sorted(history["checkpoints"], key=lambda c: c["seq"])]
    # Recorded as the branches finished: the last one first.
    assert names[:3] == ["measure@0", "measure@1", "measure@2"]
    assert names.index("measure@2#2") < names.index("measure@0#2")
    reordered = dict(history)
    reordered["checkpoints"] = [
        dict(c, seq=len(history["checkpoints"]) - 1 - c["seq"]) for c in history["checkpoints"]
    ]  # as if they had finished in the opposite order
    await assert_replays(current_app(), history)
    await assert_replays(current_app(), reordered)


async def test_a_concurrent_history_cut_short_replays_as_far_as_it_goes() -> None:
    history = json.loads((HERE / "survey.json").read_text())
    in_order = sorted(history["checkpoints"], key=lambda c: c["seq"])
    for keep in (1, 4, 9, 12, 16):
        cut = dict(history, checkpoints=in_order[:keep])  # as if the run were still going
        assert (await check_history(current_app(), cut)).ok, keep


async def test_a_branch_calling_a_step_with_other_arguments_fails_with_both_named() -> None:
    history = json.loads((HERE / "survey.json").read_text())
    outcome = await check_history(current_app(survey_version=0), history)
    assert outcome.error is not None
    assert outcome.first_difference is not None
    position, recorded, requested = outcome.first_difference
    assert (recorded, requested) == (recorded, recorded)  # the same step: other arguments
    assert position is not None
    assert position.endswith("/0")  # a branch's first checkpoint
    assert "with other arguments" in str(outcome.error)
    assert '"args":["north",120]' in str(outcome.error)
    assert '"args":["north",121]' in str(outcome.error)

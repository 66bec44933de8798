"""The training run's parts, each on its own (no torch): which checkpoint is the best, which one
becomes the drafter and why, what a resumed run refuses, what a checkpoint keeps, and the figures
each step reports. The whole loop on real speculators: tests/workloads/test_train.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kimideploy.workloads.runtime import BadInputError
from kimideploy.workloads.train import StepFigures
from kimideploy.workloads.train_checkpoints import (
    STATE_FILE,
    Checkpoints,
    Position,
    check_resumable,
    step_dir,
)
from kimideploy.workloads.train_judge import Best, next_best
from kimideploy.workloads.train_writer import Selection, select
from tests.unit.test_train_checks import spec


def judged(**by_k: float) -> dict[str, Any]:
    """heldout.figures' shape, as far as the judge reads it."""
    return {"mean_acceptance_length": {k.removeprefix("k"): v for k, v in by_k.items()}}


def test_the_best_is_the_longest_acceptance_at_the_serving_k_the_earliest_of_equals() -> None:
    best = next_best(None, judged(k1=1.5, k3=2.0), step=100, k=3)
    assert best == Best(step=100, length=2.0, k=3, latest_length=2.0)
    best = next_best(best, judged(k1=1.9, k3=2.4), step=200, k=3)
    assert (best.step, best.length, best.latest_length) == (200, 2.4, 2.4)
    # Worse at k=3 (better at k=1 does not count): the best stays, the latest is remembered.
    best = next_best(best, judged(k1=1.95, k3=2.1), step=300, k=3)
    assert (best.step, best.length, best.latest_length) == (200, 2.4, 2.1)
    # An equal figure later does not move the best: fewer steps, same prediction.
    assert next_best(best, judged(k1=1.0, k3=2.4), step=400, k=3).step == 200


def test_the_best_survives_a_restart_through_the_checkpoints_record() -> None:
    best = Best(step=200, length=2.4, k=3, latest_length=2.1)
    assert Best.from_record(json.loads(json.dumps(best.record()))) == best
    # Checkpoints written before the latest length was kept read as their best.
    assert Best.from_record({"step": 5, "length": 1.5, "k": 2}) == Best(5, 1.5, 2, 1.5)
    assert Best.from_record(None) is None


def test_the_drafter_is_the_selected_checkpoint_and_says_why() -> None:
    nothing = select(None, last_step=900, held_out_fraction=0.0)
    assert nothing.record() == {
        "step": 900,
        "reason": "the last step: no held-out samples to judge on (train.held_out_fraction 0.0)",
    }
    last = select(Best(900, 3.1, 3, 3.1), last_step=900, held_out_fraction=0.05)
    assert last == Selection(
        900, "the last step has the best held-out mean acceptance length at k=3 (3.1)", 3.1
    )
    earlier = select(Best(400, 3.3, 3, 3.1), last_step=900, held_out_fraction=0.05)
    assert earlier.record() == {
        "step": 400,
        "held_out_length": 3.3,
        "reason": "step 400 has the best held-out mean acceptance length at k=3 (3.3); the last "
        "step (900) had 3.1",
    }


SPLIT = {"held_out_samples": 12, "fraction": 0.05, "held_out_ids_sha256": "aa"}


def test_a_checkpoint_of_another_dataset_or_split_is_not_resumed(tmp_path: Path) -> None:
    saved = {"step": 40, "epoch": 1, "step_in_epoch": 4, "tokens": 9000, "dataset": "d1",
             "split": SPLIT}  # fmt: skip
    check_resumable(saved, tmp_path, dataset="d1", split=SPLIT, fraction=0.05)
    with pytest.raises(BadInputError, match="trained on dataset d1, this run trains on d2"):
        check_resumable(saved, tmp_path, dataset="d2", split=SPLIT, fraction=0.05)
    other = {**SPLIT, "held_out_samples": 30, "held_out_ids_sha256": "bb"}
    with pytest.raises(
        BadInputError, match=r"held out other samples \(12 at fraction 0.05\) than this run would "
        r"\(30 at 0.1\)"
    ):  # fmt: skip
        check_resumable(saved, tmp_path, dataset="d1", split=other, fraction=0.1)
    assert Position.from_state(saved) == Position(step=40, epoch=1, step_in_epoch=4, tokens=9000)


def test_the_held_out_judgement_of_a_step_is_read_from_its_checkpoint(tmp_path: Path) -> None:
    checkpoints = Checkpoints(
        spec([3], "vllm", [3]).model_copy(update={"checkpoint_dir": str(tmp_path)}),
        leader=True,
        split=SPLIT,
        dataset="d1",
    )
    assert not checkpoints.written(40) and checkpoints.held_out_of(40) is None
    folder = step_dir(tmp_path, 40)
    folder.mkdir()
    assert checkpoints.held_out_of(40) is None  # a directory without state.json is incomplete
    (folder / STATE_FILE).write_text(json.dumps({"held_out": judged(k3=2.5)}))
    assert checkpoints.written(40) and checkpoints.held_out_of(40) == judged(k3=2.5)


def test_a_steps_figures_mention_the_held_out_length_once_there_is_one() -> None:
    figures = StepFigures(step=3, epoch=1, loss=1.25, lr=1e-4, accuracy_per_position=[0.5, 0.25],
                          tokens_per_s=800.0, step_s=0.2)  # fmt: skip
    assert "held_out_length" not in figures.as_dict()
    assert figures.as_dict()["accuracy_per_position"] == [0.5, 0.25]
    judged_once = StepFigures(**{**figures.as_dict(), "held_out_length": 2.25})
    assert judged_once.as_dict()["held_out_length"] == 2.25

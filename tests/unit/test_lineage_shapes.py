"""A lineage whose held-out figures have the wrong shape is named where it is read, before any
work that cannot be undone: the publish pod refuses it before the push; drafter check says so."""

from __future__ import annotations

from typing import Any

import pytest

from kimideploy.config.drafters import held_out_from_lineage

BAD = [
    {"mean_acceptance_length": [1.5, 2.0]},
    {"mean_acceptance_length": {"three": 2.0}},
    {"mean_acceptance_length": {"3": "long"}},
    {"mean_acceptance_length": {"3": 2.0}, "by_k": ["x"]},
    {"mean_acceptance_length": {"3": 99.0}},
    "held out",
]


@pytest.mark.parametrize("held_out", BAD)
def test_a_wrong_shape_is_a_named_value_error(held_out: Any) -> None:
    with pytest.raises(ValueError, match="held_out in the lineage has the wrong shape"):
        held_out_from_lineage({"held_out": held_out})


def test_a_good_lineage_still_reads() -> None:
    found = held_out_from_lineage(
        {"held_out": {"mean_acceptance_length": {"3": 2.5}, "samples": 10}, "run_id": "r"}
    )
    assert found is not None and found.mean_acceptance_length == {3: 2.5}
    assert held_out_from_lineage({}) is None


@pytest.mark.parametrize("held_out", BAD[:4])
def test_drafter_check_names_a_held_out_of_the_wrong_shape(
    example: Any, tmp_path: Any, held_out: Any
) -> None:
    from tests.unit.test_drafter_check import drafter_dir, findings, write_lineage

    folder = write_lineage(drafter_dir(tmp_path / "d"), example, held_out=held_out)
    found = findings(example, "v3", folder)
    assert not found["lineage: held-out"].ok
    assert "wrong shape" in found["lineage: held-out"].detail


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('["not", "an", "object"]', "a list, not an object"),
        ('{"input_ids": [1, 2], "loss_mask": [1]}', "no token ids with a loss mask"),
        ('{"input_ids": [1, "x"], "loss_mask": [1, 1]}', "token ids that are not token ids"),
    ],
)
def test_replay_sample_rows_are_checked_where_they_are_read(
    tmp_path: Any, line: str, why: str
) -> None:
    """Before the GPU capture: a row of the wrong shape is named with its line number."""
    from kimideploy.workloads import replay_sample
    from kimideploy.workloads.runtime import BadInputError

    good = '{"input_ids": [1, 2], "loss_mask": [0, 1]}'
    (tmp_path / replay_sample.REPLAY_SAMPLE_FILE).write_text(f"{good}\n{line}\n")
    with pytest.raises(BadInputError, match=f":2: {why}"):
        replay_sample.read(tmp_path)


@pytest.mark.parametrize("held_out", [*BAD, {"mean_acceptance_length": {"3": 2.4, "x": 1.0},
                                              "by_k": {"k3": {}, "3": {"acceptance_per_position":
                                                                       [0.8, "a", 0.5]}}}])  # fmt: skip
def test_the_doctor_reads_what_it_can_of_a_lineage_and_never_raises(held_out: Any) -> None:
    """The round-four case: `drafter doctor` on a lineage whose held-out figures carry a key that
    is not a depth ended in a traceback (`int(k)`); it now leaves that figure out."""
    from types import SimpleNamespace

    from kimideploy.services.drafters.doctor import _held_out

    lengths, rates = _held_out(SimpleNamespace(held_out=None), {"held_out": held_out})
    if isinstance(held_out, dict) and "x" in held_out["mean_acceptance_length"]:
        assert (lengths, rates) == ({3: 2.4}, [0.8, 0.5])
    else:
        assert lengths in (None, {3: 2.0}, {3: 99.0}) and all(isinstance(r, float) for r in rates)

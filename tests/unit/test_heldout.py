"""Held-out judgement's own logic: the split, the serving walk and the figures vLLM would count,
and the learning-rate schedule (the model-level parts run in tests/workloads/test_train.py)."""

from __future__ import annotations

import itertools
import math

from kimideploy.config.specs import TrainSpec
from kimideploy.workloads import heldout
from kimideploy.workloads.train_schedule import lr_factor


def test_the_split_is_by_sample_id_whatever_the_order_or_count() -> None:
    ids = [f"sample-{i:05d}" for i in range(4000)]
    split = heldout.split_samples(ids, 0.05, max_held_out=10_000)
    held = {ids[i] for i in split.held_out}
    assert 150 < len(held) < 250  # about 5%
    assert set(split.train).isdisjoint(split.held_out)
    assert len(split.train) + len(split.held_out) == len(ids)
    shuffled = list(reversed(ids))[:3000]  # other order, fewer samples
    again = heldout.split_samples(shuffled, 0.05, max_held_out=10_000)
    assert {shuffled[i] for i in again.held_out} == held & set(shuffled)
    assert heldout.split_samples(ids, 0.0, 10).held_out == []


def test_only_max_held_out_are_judged_but_none_of_the_rest_is_trained() -> None:
    ids = [f"s{i}" for i in range(2000)]
    split = heldout.split_samples(ids, 0.1, max_held_out=5)
    assert len(split.held_out) == 5
    assert split.record["held_out_samples"] > 5
    held_all = [i for i, s in enumerate(ids) if heldout.is_held_out(s, 0.1)]
    assert set(split.train).isdisjoint(held_all)
    assert split.record["training_samples"] == len(ids) - len(held_all)


def test_the_walk_drafts_where_greedy_speculative_decoding_drafts() -> None:
    # Accepted-in-a-row counts at each draft start of one turn, evaluated to depth 3.
    lengths = [3, 0, 0, 0, 2, 1, 0, 3, 3, 3, 0]
    walk = heldout.walk(lengths, 3)
    # starts: 0 (a=3) -> 4 (a=2) -> 7 (a=3) -> 11: end
    assert (walk.drafts, walk.accepted) == (3, 8)
    assert walk.at_position == [3, 3, 2]
    figures = walk.figures()
    assert figures["mean_acceptance_length"] == round(1 + 8 / 3, 4)
    assert figures["acceptance_rate"] == round(8 / 9, 4)
    assert figures["acceptance_per_position"] == [1.0, 1.0, round(2 / 3, 4)]
    # k = 1: every draft accepts at most one token
    one = heldout.walk(lengths, 1)
    # starts: 0 (1) -> 2 (0) -> 3 (0) -> 4 (1) -> 6 (0) -> 7 (1) -> 9 (1) -> 11
    assert (one.drafts, one.accepted) == (7, 4)


def test_figures_combine_turns_by_counts_not_by_averaging_turns() -> None:
    walks = heldout.judge_turns([[3, 3, 3, 3], [0, 0]], depth=3)
    three = walks[3]
    # turn 1: start 0 accepts 3, then 4: end -> 1 draft, 3 accepted; turn 2: 2 drafts, 0 accepted
    assert (three.drafts, three.accepted) == (3, 3)
    out = heldout.figures(walks, samples=2)
    assert out["mean_acceptance_length"]["3"] == 2.0
    assert set(out["by_k"]) == {"1", "2", "3"} and out["depth"] == 3


def test_an_untrained_drafter_scores_one() -> None:
    out = heldout.figures(heldout.judge_turns([[0] * 50], depth=4), samples=1)
    assert all(v == 1.0 for v in out["mean_acceptance_length"].values())
    assert out["by_k"]["4"]["acceptance_per_position"] == [0.0, 0.0, 0.0, 0.0]


def test_a_small_cost_in_some_turns_is_measurable_when_paired() -> None:
    # 200 turns of very different difficulty (every position of a turn accepts 0-3 in a row);
    # with the other features every fourth of the easiest turns accepts one token less.
    base = [[i % 4] * 12 for i in range(200)]
    other = [[2] * 12 if i % 16 == 3 else turn for i, turn in enumerate(base)]
    paired = heldout.paired_difference(base, other, 3)
    assert paired["turns"] == 200 and paired["k"] == 3
    low, high = paired["ci95"]
    assert low <= paired["difference"] <= high < 0  # measurable: the interval excludes 0
    # ... a cost far below the spread of the turns: unpaired, the two means could not tell it.
    assert -paired["difference"] < 0.1
    assert heldout.paired_difference(base, other, 3) == paired  # the same interval every run


def test_no_change_gives_a_zero_interval_and_gains_and_losses_one_that_spans_zero() -> None:
    base = [[i % 4] * 12 for i in range(200)]
    assert heldout.paired_difference(base, base, 3)["ci95"] == [0.0, 0.0]
    # As many turns lose a token as gain one: no net change.
    swapped = [
        [5 - (i % 4)] * 12 if i % 4 in (2, 3) and i % 8 < 4 else t for i, t in enumerate(base)
    ]
    paired = heldout.paired_difference(base, swapped, 3)
    assert paired["difference"] == 0
    low, high = paired["ci95"]
    assert low < 0 < high


def test_paired_judgements_must_judge_the_same_turns() -> None:
    import pytest

    with pytest.raises(ValueError, match="3 and 2 turns"):
        heldout.paired_difference([[1], [2], [3]], [[1], [2]], 3)


def spec(**settings: object) -> TrainSpec:
    base = {"workload": "train", "run_id": "r", "cluster": "c",
            "target": {"repo": "a/b", "revision": "0" * 40, "served_name": "t", "path": "/m",
                       "num_hidden_layers": 6, "hidden_size": 128, "vocab_size": 512},
            "drafter": "d", "base_drafter_path": None, "hidden_states_dir": "/h",
            "vocab_dir": "/v", "checkpoint_dir": "/c", "output_dir": "/o",
            "layers": {"ids": [1], "convention": "vllm", "vllm_ids": [1]},
            "draft_vocab_size": 256, "num_speculative_tokens": 3, "mode": "offline", "nodes": 1,
            "gpus_per_node": 1, "epochs": 1, "lr": 1e-3, "batch_size": 1, "max_seq_len": 128,
            "checkpoint_every_steps": 10}  # fmt: skip
    return TrainSpec.model_validate({**base, **settings})


def test_the_schedule_warms_up_then_decays_to_the_floor() -> None:
    cosine = spec(lr_schedule="cosine", warmup_ratio=0.1, min_lr_ratio=0.1)
    factors = [lr_factor(step, 100, cosine) for step in range(100)]
    assert factors[0] < factors[5] < factors[9] <= 1.0  # warmup over 10 steps
    assert max(factors) == 1.0
    assert all(a >= b for a, b in itertools.pairwise(factors[10:]))  # decays
    assert math.isclose(factors[-1], 0.1)
    linear = spec(lr_schedule="linear", warmup_ratio=0.0, min_lr_ratio=0.0)
    assert [round(lr_factor(s, 5, linear), 3) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    constant = spec(lr_schedule="constant", warmup_ratio=0.0)
    assert {lr_factor(s, 50, constant) for s in range(50)} == {1.0}


def test_the_held_out_interval_holds_the_figure_and_narrows_with_more_turns() -> None:
    """A bootstrap over turns: how far serving the same distribution may count from the figure.
    The same turns give the same interval (seeded); four times the turns, about half the width."""
    import random as draw

    from kimideploy.workloads.heldout import figures, interval, judge_turns

    rng = draw.Random(7)
    turns = [[rng.choice([0, 1, 2, 3, 3, 3]) for _ in range(40)] for _ in range(30)]
    judged = figures(judge_turns(turns, 3), samples=30, per_turn=turns)
    low, high = judged["by_k"]["3"]["ci95"]
    length = judged["mean_acceptance_length"]["3"]
    assert low < length < high and judged["by_k"]["3"]["turns"] == judged["turns"] == 30
    assert interval(turns, 3) == [low, high]  # the same on every run and machine
    more = turns * 4
    wide, narrow = high - low, interval(more, 3)[1] - interval(more, 3)[0]
    assert 0.35 * wide < narrow < 0.65 * wide
    assert interval([], 3) == [1.0, 1.0]

"""The doctor's verdicts from replay figures (plan/drafter_doctor.py): each cause is named from
the link of the scenario chain where the drop happens, with the figures and a fix; a drafter
with no significant drop that pays is healthy. The engine-side test (tests/pipeline/
test_doctor.py) reproduces every cause with real drafters; these pin the rules."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kimideploy.formats.vllm_metrics import conditional_rates
from kimideploy.plan.calibration import DefaultCost
from kimideploy.plan.drafter_doctor import (
    DoctorInputs,
    Measured,
    diagnose,
    significant,
)

GOOD = [0.85, 0.75, 0.65, 0.55, 0.5]


def figures(rates: list[float]) -> dict[str, Any]:
    """A replay scenario's figures for conditional per-position rates (judged at depth 5)."""
    lengths, survive, total = {}, 1.0, 1.0
    for k, rate in enumerate(rates, 1):
        survive *= rate
        total += survive
        lengths[str(k)] = round(total, 4)
    deepest = str(len(rates))
    return {"mean_acceptance_length": lengths,
            "by_k": {deepest: {"acceptance_per_position": rates}}}  # fmt: skip


def replay(**scenarios: list[float]) -> dict[str, Any]:
    base = dict.fromkeys(("served_features", "served_rendering", "served_answers"), GOOD)
    rates = {**base, **scenarios}
    return {
        "layers": {"served": [2, 3, 4], "trained": [2, 3, 4], "trained_known_from": "lineage"},
        "scenarios": {name: figures(r) for name, r in rates.items()},
        "shifted": {"probe": "served_answers", "by": {}},
        "rendering": {"conversations": 48, "differ": 0, "first_difference": ""},
        "head_agreement": 1.0,
    }


def inputs(result: dict[str, Any], per_token: float = 0.1433, **extra: Any) -> DoctorInputs:
    held = figures(GOOD)["mean_acceptance_length"]
    return DoctorInputs(
        drafter="d", cluster="c", k=3, replay=result,
        held_out={int(k): v for k, v in held.items()}, held_out_per_position=GOOD,
        costs=DefaultCost(per_token, "c"), concurrency=1, **extra,
    )  # fmt: skip


def test_a_drafter_with_no_drop_that_pays_is_healthy() -> None:
    found = diagnose(inputs(replay()))
    assert found.healthy and found.verdict == "healthy", found.as_dict()
    assert found.prediction["best_k"] == 3


def test_features_of_another_target_are_the_target_cause() -> None:
    weak = [0.5, 0.4, 0.3, 0.3, 0.3]
    found = diagnose(inputs(replay(served_features=weak, served_rendering=weak,
                                   served_answers=weak), trained_for="a@1", served_model="b@2"))  # fmt: skip
    assert found.causes == ["target"]
    assert "a@1" in found.findings[0].evidence and "b@2" in found.findings[0].evidence


def test_a_drop_at_the_served_rendering_is_the_template() -> None:
    weak = [0.5, 0.4, 0.3, 0.3, 0.3]
    result = replay(served_rendering=weak, served_answers=weak)
    result["rendering"] = {"conversations": 48, "differ": 48, "first_difference": "token 3"}
    found = diagnose(inputs(result))
    assert found.causes == ["template"]
    assert "48 of 48" in found.findings[0].evidence


def test_layers_that_differ_from_the_lineage_are_the_convention_whatever_they_cost() -> None:
    result = replay()
    result["layers"] = {"served": [3, 4, 5], "trained": [2, 3, 4], "trained_known_from": "x"}
    result["scenarios"]["served_layers"] = figures(GOOD)  # costs nothing on this model
    found = diagnose(inputs(result))
    assert found.causes == ["convention"]
    assert "aux_layer_ids: [2, 3, 4]" in found.findings[0].fix
    # With the replay's paired difference, its size and whether it is measurable are shown.
    result["layers"]["cost"] = {"k": 3, "turns": 40, "difference": -0.031, "ci95": [-0.05, -0.012]}
    evidence = diagnose(inputs(result)).findings[0].evidence
    assert "-0.031 at k=3 over 40 turns, 95% interval -0.050 to -0.012: measurable" in evidence
    result["layers"]["cost"]["ci95"] = [-0.06, 0.01]
    assert "within what chance gives" in diagnose(inputs(result)).findings[0].evidence


def test_without_a_lineage_a_shift_that_accepts_more_is_the_convention() -> None:
    result = replay(served_answers=[0.5, 0.4, 0.3, 0.3, 0.3])
    result["shifted"]["by"] = {"-1": figures(GOOD), "+1": figures([0.4, 0.3, 0.3, 0.3, 0.3])}
    found = diagnose(inputs(result))
    assert found.causes[0] == "convention"
    assert "[1, 2, 3]" in found.findings[0].fix


def test_the_users_prompts_far_below_its_own_are_the_domain() -> None:
    result = replay(**{"prompts:yours": [0.6, 0.5, 0.4, 0.4, 0.4]})
    found = diagnose(inputs(result, prompt_set="yours"))
    assert found.causes[0] == "domain"
    assert "0.60" not in found.findings[0].evidence and "yours" in found.findings[0].evidence
    # Without --prompts there is nothing to compare.
    assert diagnose(inputs(result)).healthy


def test_a_k_deeper_than_pays_names_the_k_that_pays_most() -> None:
    found = diagnose(inputs(replay(), per_token=0.6))
    assert found.causes == ["k"]
    assert found.prediction["best_k"] == 1
    assert "num_speculative_tokens: 1" in found.findings[0].fix


def test_a_deeper_k_that_would_pay_more_is_a_note_not_a_cause() -> None:
    """High acceptance a deeper k would use better is not why acceptance is low."""
    found = diagnose(inputs(replay(), per_token=0.02))
    assert found.healthy and found.prediction["best_k"] == 5
    assert any("num_speculative_tokens: 5" in note for note in found.notes)


def test_nothing_to_judge_is_inconclusive_not_healthy() -> None:
    empty = {"layers": {"served": [2, 3, 4], "trained": [2, 3, 4]}, "scenarios": {},
             "shifted": {"probe": None, "by": {}}}  # fmt: skip
    found = diagnose(DoctorInputs("d", "c", 3, empty, None, [], DefaultCost(0.1, "c"), 1))
    assert not found.healthy and found.causes == []
    assert found.verdict.startswith("inconclusive") and found.as_dict()["verdict"] == "inconclusive"


def test_a_stored_bench_run_is_shown_beside_the_prediction_never_in_its_place() -> None:
    """vLLM's rates from the bench's prompts said 3.09 whatever the prompts replayed were (prose
    included, where vLLM counted 1.63): the prediction is the replay's own, on the prompts
    replayed; the bench's figure stands beside it, labelled with its basis."""
    measured = Measured(2.2, [0.7, 0.6, 0.5], "bench run r1")
    alone, found = diagnose(inputs(replay())), diagnose(inputs(replay(), measured=measured))
    assert found.prediction["by_k"] == alone.prediction["by_k"]
    assert found.prediction["per_position"] == alone.prediction["per_position"] == GOOD
    assert found.prediction["per_position_basis"] == "conditional, replay walk"
    beside = found.prediction["measured_elsewhere"]
    assert beside["per_position"] == [0.7, 0.6, 0.5] and beside["mean_acceptance_length"] == 2.2
    assert beside["per_position_basis"] == "per draft, vLLM's counters"
    assert any("2.20" in note for note in found.notes)


def test_the_printed_figure_at_each_judged_k_is_the_replays_own() -> None:
    """Rebuilt from the deepest k's first rates, k=3 came out up to 0.15 below the replay's own
    k=3 figure (the walks start their drafts at other positions): each judged k is its own."""
    result = replay()
    figures = result["scenarios"]["served_answers"]
    figures["mean_acceptance_length"] = {"1": 1.9, "2": 2.61, "3": 3.28, "4": 3.7, "5": 4.0}
    found = diagnose(inputs(result))
    by_k = found.prediction["by_k"]
    assert [by_k[k]["mean_acceptance_length"] for k in ("1", "2", "3")] == [1.9, 2.61, 3.28]
    assert {v["basis"] for v in by_k.values()} == {"replay at this k"}


def test_nothing_paying_on_its_own_conversations_is_weak() -> None:
    weak = [0.1, 0.1, 0.1, 0.1, 0.1]
    found = diagnose(inputs(replay(served_answers=weak), per_token=0.3))
    assert found.causes == ["weak"]


def test_without_a_replay_sample_or_held_out_vllms_count_judges_weakness() -> None:
    """The tier's untrained drafter (trained with no held-out split, so it carries neither a
    replay sample nor held-out figures) was called healthy once the k prediction stopped taking
    vLLM's rates: with nothing else, the engine's own count (1.00 at k=3) says it is weak."""
    result = replay()
    result["scenarios"] = {"prompts:yours": figures([0.004, 0.0, 0.0, 0.0, 0.0])}
    counted = Measured(1.0, [0.0, 0.0, 0.0], "bench of untrained (code, c=4)")
    bare = DoctorInputs("d", "c", 3, result, None, [], DefaultCost(0.1433, "c"), 4,
                        measured=counted)  # fmt: skip
    found = diagnose(bare)
    assert found.causes == ["weak"], found.as_dict()
    assert "vLLM's count, bench of untrained" in found.findings[0].evidence
    paying = Measured(2.9, [0.8, 0.7, 0.6], "bench of good")
    assert diagnose(replace(bare, measured=paying)).healthy


def test_a_mismatch_explains_low_acceptance_before_weakness_does() -> None:
    weak = [0.1, 0.1, 0.1, 0.1, 0.1]
    result = replay(served_rendering=weak, served_answers=weak)
    result["rendering"]["differ"] = 10
    assert diagnose(inputs(result, per_token=0.3)).causes == ["template"]


@pytest.mark.parametrize(
    ("high", "low", "expected"),
    [(3.2, 3.1, False), (3.2, 3.0, True), (1.4, 1.3, False), (1.4, 1.2, True)],
)
def test_a_drop_counts_when_it_is_both_absolute_and_relative(
    high: float, low: float, expected: bool
) -> None:
    assert significant(high, low) is expected


def test_vllms_rates_at_a_fixed_k_become_conditional() -> None:
    assert conditional_rates([0.8, 0.4, 0.2]) == pytest.approx([0.8, 0.5, 0.5])
    assert conditional_rates([0.0, 0.0]) == [0.0, 0.0]

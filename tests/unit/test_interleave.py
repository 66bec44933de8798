"""A/B on one server by interleaving (services/gate/interleave.py): which bake-off candidates can
be swapped among themselves, the alternating order of the rounds, and how a candidate's rounds
become one result. The swaps and benches on the engine: tests/pipeline/test_drafter_swap.py."""

from __future__ import annotations

from typing import Any

import pytest

from kimideploy.formats.bench_result import BenchResult
from kimideploy.services.gate import interleave
from tests.unit.test_drafter_swap import pipeline_objects


def test_the_drafters_of_one_shape_are_interleaved_and_the_others_say_why() -> None:
    renders = {name: pipeline_objects(name) for name in ("none", "ngram", "good", "shifted",
                                                         "untrained")}  # fmt: skip
    group, left_out = interleave.swap_group(renders)
    assert group == ["good", "untrained"]
    assert left_out["shifted"].startswith("more than the drafter changes (spec.layers")
    assert "ngram" in left_out
    alone, why = interleave.swap_group({n: renders[n] for n in ("none", "ngram", "shifted")})
    assert alone == [] and set(why) == {"ngram", "shifted"}


def test_rounds_alternate_and_a_candidate_spanning_two_rounds_is_served_once() -> None:
    assert interleave.round_orders(["a", "b"], 1) == []
    assert interleave.round_orders(["a", "b"], 4) == [["b", "a"], ["a", "b"], ["b", "a"]]
    served: list[str] = []
    benched: list[str] = []

    def bench(name: str) -> BenchResult:
        benched.append(name)
        return BenchResult(levels=(), run_id=str(len(benched)))

    measured = interleave.run_rounds(interleave.round_orders(["a", "b"], 3), "b",
                                     served.append, bench)  # fmt: skip
    assert benched == ["b", "a", "a", "b"]
    assert served == ["a", "b"]  # b already served; a ends round 2 and starts round 3
    assert [r.run_id for r in measured["a"]] == ["2", "3"]


def level(tokens: float, rate: float | None, positions: list[float] | None) -> dict[str, Any]:
    return {"prompt_set": "chat", "concurrency": 4, "output_tokens_per_s": tokens,
            "acceptance_rate": rate, "mean_acceptance_length": None if rate is None else 1 + rate,
            "per_position_acceptance": positions, "metrics": "requests"}  # fmt: skip


def test_a_candidates_rounds_are_judged_by_their_mean_and_their_spread_is_shown() -> None:
    rounds = [BenchResult.from_dict(r) for r in (
        {"run_id": "r1", "levels": [level(100.0, 0.5, [0.7, 0.3])]},
        {"run_id": "r2", "levels": [level(110.0, 0.7, [0.9, 0.5])]})]  # fmt: skip
    merged = interleave.merge_rounds(rounds)
    [merged_level] = merged.levels
    assert merged.rounds == 2 and merged.run_id == "r1"
    assert merged_level.output_tokens_per_s == pytest.approx(105.0)
    assert merged_level.acceptance_rate == pytest.approx(0.6)
    assert merged_level.per_position_acceptance == pytest.approx([0.8, 0.4])
    assert merged_level.counted_by == "requests"
    assert interleave.merge_rounds(rounds[:1]) is rounds[0]
    # A round without counters keeps the level unaveraged rather than inventing a figure.
    without = BenchResult.from_dict({"levels": [level(90.0, None, None)]})
    partial = interleave.merge_rounds([rounds[0], without])
    assert partial.levels[0].acceptance_rate == 0.5
    assert interleave.spread_lines({"good": rounds}, [("chat", 4)]) == [
        "good chat c=4: tokens/s by round 100.0, 110.0; acceptance 50.0%, 70.0%"
    ]
    # What is stored and printed is the shape the bench pod writes.
    assert merged.as_dict()["rounds"] == 2 and "rounds" not in rounds[0].as_dict()

"""Acceptance on the informative target means something: the correct drafter lands in the middle
of the range, each known mistake measurably lowers what vLLM counts, and the held-out length
training printed predicts what vLLM counts when it serves that drafter on prompts of the same
distribution.

All figures are greedy, k=3, on held-out code prompts (tests/pipeline/stdlib_corpus.py: seen by
neither the target's training nor datagen), counted by vLLM 0.32 per request. The thresholds
below were set from measurements of this tier (CONTRIBUTING.md, "The pipeline tier"); each mistake's
margin is below the smallest gap measured across seeds, so a failure here means a real change in
training, serving or the target, not noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.pipeline.conftest import PULLED, SERVED_MISTAKES, SecondCluster, Served, length
from tests.pipeline.figures import FIGURES

GOOD_RANGE = (2.6, 3.6)
"""Where the correctly trained drafter lands at k=3 (the maximum is 4): measured 3.18 / 3.21 / 3.24
(three seeds, Intel) and 3.30 / 3.30 / 3.35 (AMD EPYC: the target is trained on the machine that
runs the tier, and came out otherwise there)."""
MARGIN = {"untrained": 1.0, "other-template": 0.5, "other-target": 0.5}
"""How much lower each mistake must measure than the correct drafter; measured gaps on the engine
(bench/acceptance_seeds.py, training seeds 0 (the tier's), 1 and 2): untrained 2.18 / 2.21 /
2.23, other-template 1.36 / 1.35 / 1.37, other-target 1.43 / 1.47 / 1.54, with good at 3.18 /
3.21 / 3.24; on the AMD build (seeds 0 / 1 / 2) 2.30 / 2.30 / 2.35, 1.10 / 1.11 / 1.22,
1.43 / 1.55 / 1.45 with good at 3.30 / 3.30 / 3.35. The margins are at most half the smallest
gap."""
PREDICTION_TOLERANCE = 0.15
"""|held-out length training printed - length vLLM counted| on the *same* prompts: the prompts of
the held-out conversations training judged the drafter on (its replay sample), answered again by
the served target and counted by vLLM. Measured: see the figures this test prints and
bench/MEASUREMENTS.md (both builds of the target and a loaded run). The old comparison, against
vLLM's count on another held-out prompt set, is printed as a figure, not asserted: 3.40 vs 3.09
once, on a third machine (the two count different prompts)."""


def test_the_correct_drafter_beats_every_known_mistake_on_the_engine(
    served: dict[str, Served],
) -> None:
    good = length(served["good"])
    measured = {name: length(served[name]) for name in SERVED_MISTAKES}
    table = "  ".join(f"{name} {value:.2f}" for name, value in measured.items())
    print(f"mean acceptance length, k=3, held-out code prompts: good {good:.2f}  {table}")
    FIGURES["acceptance side by side (good; mistakes)"] = f"{good:.2f}; {table}"
    assert GOOD_RANGE[0] <= good <= GOOD_RANGE[1], good
    for name, margin in MARGIN.items():
        assert measured[name] <= good - margin, (name, measured[name], good)
    # The convention mistake is measured and printed, not asserted lower: on this 6-layer
    # target the residual stream of adjacent layers carries the same directions, so a drafter
    # fed the layers one (or two) above its own loses almost nothing (3.17 vs 3.18 on an Intel
    # build of the target, 3.31 vs 3.30 on an AMD one; the held-out judgement agrees: 3.26 vs
    # 3.28, and 3.20 shifted by two), while the features of another checkpoint cost 1.4. Fed the
    # layers one below instead (the other direction: SGLang ids [1, 2, 3] read as vLLM's, as
    # vLLM reads a SpecForge config.json) it measured 3.15 vs 3.18 (Intel, 2026-12-03): the
    # residual stream after layer 0 is dominated by one large direction that layer writes (norm
    # ~31 against the embeddings' 0.65; adjacent layers' cosine 0.94-0.98 on held-out code).
    # Paired on the replay (same 39 turns judged both ways, 95% bootstrap interval;
    # test_doctor.py prints it): one above -0.020 (-0.088 to +0.046) on Intel, -0.025 (-0.091
    # to +0.049) on AMD; one below -0.066 (-0.127 to -0.006) and +0.009 (-0.053 to +0.072).
    # Small on real models too: ~0.10 on Kimi-K2.5 (SGLang PR 25454). What catches it is the
    # records: `drafter check` (test_lifecycle.py) and `drafter doctor`.
    assert measured["shifted"] >= measured["untrained"] + 1.0


def test_the_held_out_length_training_printed_predicts_what_vllm_counts_on_the_same_prompts(
    served: dict[str, Served], good_drafter: dict[str, Any]
) -> None:
    """Like for like: training's held-out figure is about the held-out conversations it judged;
    vLLM counts the same prompts, answered again by the served target (greedy, the same length
    cap as datagen). Its interval is printed beside it."""
    held_out = good_drafter["result"]["held_out"]
    predicted = held_out["mean_acceptance_length"]["3"]
    low, high = held_out["by_k"]["3"]["ci95"]
    trained = served["good"].trained_prompts
    assert trained is not None
    counted = float(next(lv for lv in trained["levels"] if lv["prompt_set"] == "trained")
                     ["mean_acceptance_length"])  # fmt: skip
    elsewhere = length(served["good"])
    FIGURES["good: held-out prediction [95%] vs vLLM's count, same prompts (k=3)"] = (
        f"{predicted:.2f} [{low:.2f}-{high:.2f}] vs {counted:.2f} over {held_out['turns']} turns"
    )
    FIGURES["good: held-out prediction vs vLLM's count, other held-out prompts (k=3)"] = (
        f"{predicted:.2f} vs {elsewhere:.2f}"
    )
    assert abs(predicted - counted) <= PREDICTION_TOLERANCE, (predicted, counted)
    assert low <= predicted <= high


def test_training_judged_every_checkpoint_and_wrote_the_best(good_drafter: dict[str, Any]) -> None:
    evaluations = good_drafter["evaluations"]
    assert len(evaluations) >= 3  # every checkpoint: every 100 steps and at each epoch end
    lengths = {e["step"]: e["held_out"]["mean_acceptance_length"]["3"] for e in evaluations}
    selected = good_drafter["result"]["selected"]
    assert lengths[selected["step"]] == max(lengths.values())
    assert all(len(e["held_out"]["by_k"]["3"]["acceptance_per_position"]) == 3 for e in evaluations)
    # The first evaluation (after 100 steps) is below the best: training taught it something the
    # held-out samples can see.
    assert lengths[min(lengths)] < max(lengths.values())


PULLED_TOLERANCE = 0.02
"""The same drafter bytes on the same target, greedy: vLLM counts the same acceptance, up to
the order in which 4 concurrent requests are batched."""


def test_a_drafter_published_on_one_cluster_serves_the_same_on_another(
    served: dict[str, Served], second_cluster: SecondCluster, good_drafter: dict[str, Any]
) -> None:
    """Trained on cpu, published (`drafter publish good --cluster cpu`), pinned by digest, pulled
    by cpu-b's serve pod into its own models volume, served there with the rendered flags."""
    here, there = length(served["good"]), length(served[PULLED])
    FIGURES["good: served where trained vs pulled on cpu-b (k=3)"] = f"{here:.3f} vs {there:.3f}"
    assert abs(here - there) <= PULLED_TOLERANCE, (here, there)
    trained, pulled = Path(good_drafter["out"]), Path(second_cluster.pulled)
    for name in second_cluster.published["files"]:
        assert (pulled / name).read_bytes() == (trained / name).read_bytes(), name
    drafter = second_cluster.loaded.project.drafters["good"]
    assert drafter.source.oci is not None and drafter.status == "trained"
    assert drafter.held_out is not None  # the held-out figures travelled with it

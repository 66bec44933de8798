"""What a plan says where it once said something false: a run on an image without vLLM named
"(vLLM None)" as its serve stack, and a plan without a drafter listed a drafter's kernel."""

from __future__ import annotations

import pytest

from kimideploy.config.loading import LoadedProject
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.resolve import resolve


@pytest.mark.parametrize("workload", ["train", "bench", "vocab", "datagen"])
def test_a_run_on_an_image_without_vllm_prices_the_clusters_serve_stack(
    example: LoadedProject, workload: str
) -> None:
    plan = resolve(example, PlanRequest(workload, "b300", None))
    text = " ".join(value for _, value in plan.facts)
    assert "vLLM None" not in text
    if "acceptance needed" in dict(plan.facts):
        assert "vllm-0.32-kimi (vLLM 0.32.0)" in dict(plan.facts)["acceptance needed"]


def test_a_plan_without_a_drafter_lists_the_targets_kernels_only(example: LoadedProject) -> None:
    plain = dict(resolve(example, PlanRequest("serve", "b300", "none")).facts)["kernels"]
    assert "drafter" not in plain and "verification" not in plain
    assert plain.startswith("vLLM 0.32.0 on sm_103: target ") and "experts MARLIN" in plain
    speculative = dict(resolve(example, PlanRequest("serve", "b300", "v3")).facts)["kernels"]
    assert "; drafter " in speculative and "verification on the" in speculative

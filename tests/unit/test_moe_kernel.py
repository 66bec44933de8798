"""The routed experts' kernel in the plan (issue: the MoE kernel was unknown to the plan): what
vLLM 0.32's own MoE oracle picks for Kimi-K2.5's INT4 (W4A16, group 32) experts on every cluster,
derived under the stand-ins and stored in docker/kernel-plans.json (tests/images re-derive it),
and `serve.moe_backend` as an option: its flag, the variable FlashInfer's INT4 kernel needs, and
the refusal where that kernel cannot run."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from kimideploy.config.loading import LoadedProject
from kimideploy.errors import UsageError
from kimideploy.formats.bench_result import BenchLevel, BenchResult, BenchResultError
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.resolve import resolve
from kimideploy.services.gate.verdict import KEEP, Verdict
from kimideploy.services.rendering import render_workload


def with_moe_backend(example: LoadedProject, cluster: str, backend: str) -> LoadedProject:
    clusters = dict(example.project.clusters)
    profile = clusters[cluster]
    serve = profile.workloads.serve.model_copy(update={"moe_backend": backend})
    clusters[cluster] = profile.model_copy(
        update={"workloads": profile.workloads.model_copy(update={"serve": serve})}
    )
    return replace(example, project=example.project.model_copy(update={"clusters": clusters}))


def serve_container(loaded: LoadedProject, cluster: str) -> dict[str, Any]:
    rendered = render_workload(loaded, PlanRequest("serve", cluster, "v3"))
    deployment = next(o for o in rendered.objects if o["kind"] == "Deployment")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize(("cluster", "arch"), [("rtx6000", "sm_120"), ("b300", "sm_103")])
def test_the_plan_names_marlin_for_kimis_int4_experts(
    example: LoadedProject, cluster: str, arch: str
) -> None:
    kernels = dict(resolve(example, PlanRequest("serve", cluster, "v3")).facts)["kernels"]
    assert f"on {arch}:" in kernels and "int4 experts MARLIN" in kernels


def test_the_nvfp4_variant_on_b200_says_its_kernel_is_flashinfers(example: LoadedProject) -> None:
    kernels = dict(resolve(example, PlanRequest("serve", "b200", "v3")).facts)["kernels"]
    assert "nvfp4 experts FLASHINFER_" in kernels and "not decidable on CPU" in kernels


def test_flashinfer_int4_experts_get_their_variable_on_the_sm100_family(
    example: LoadedProject,
) -> None:
    chosen = with_moe_backend(example, "b300", "flashinfer_trtllm")
    container = serve_container(chosen, "b300")
    args = container["args"]
    assert args[args.index("--moe-backend") + 1] == "flashinfer_trtllm"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VLLM_USE_FLASHINFER_MOE_INT4"] == "1"
    kernels = dict(resolve(chosen, PlanRequest("serve", "b300", "v3")).facts)["kernels"]
    assert "int4 experts FLASHINFER_TRTLLM (serve.moe_backend)" in kernels
    # auto: no flag, no variable (vLLM's own choice, Marlin).
    container = serve_container(example, "b300")
    assert "--moe-backend" not in container["args"]
    assert "VLLM_USE_FLASHINFER_MOE_INT4" not in {e["name"] for e in container["env"]}


def test_flashinfer_int4_experts_on_the_pcie_host_are_refused_before_the_load(
    example: LoadedProject,
) -> None:
    with pytest.raises(UsageError) as info:
        resolve(with_moe_backend(example, "rtx6000", "flashinfer_trtllm"),
                PlanRequest("serve", "rtx6000", "v3"))  # fmt: skip
    assert "sm_100 family only, and rtx6000 is sm_120" in info.value.message
    marlin = serve_container(with_moe_backend(example, "rtx6000", "marlin"), "rtx6000")
    assert marlin["args"][marlin["args"].index("--moe-backend") + 1] == "marlin"


def bench_kernels(loaded: LoadedProject, cluster: str, drafter: str) -> tuple[str, str]:
    """(the plan's kernels fact, what the bench pod is told to keep with its figures)."""
    plan = resolve(loaded, PlanRequest("bench", cluster, drafter))
    rendered = render_workload(loaded, PlanRequest("bench", cluster, drafter))
    config_map = next(o for o in rendered.objects if o["kind"] == "ConfigMap")
    spec = json.loads(next(iter(config_map["data"].values())))
    return dict(plan.facts)["kernels"], spec["kernels"]


def test_a_bench_says_which_kernels_its_figures_were_measured_on(example: LoadedProject) -> None:
    fact, kept = bench_kernels(example, "b300", "v3")
    assert fact == kept and "int4 experts MARLIN" in kept and "; drafter " in kept
    # The non-speculative baseline's engine has no drafter, so its record names none.
    fact, kept = bench_kernels(example, "b300", "none")
    assert fact == kept and "int4 experts MARLIN" in kept and "drafter" not in kept
    # A chosen MoE backend is what the figures were measured on.
    _, kept = bench_kernels(with_moe_backend(example, "b300", "flashinfer_trtllm"), "b300", "v3")
    assert "int4 experts FLASHINFER_TRTLLM (serve.moe_backend)" in kept


def test_the_result_and_the_gates_record_keep_the_kernels() -> None:
    level = BenchLevel(prompt_set="chat", concurrency=1, output_tokens_per_s=10.0)
    result = BenchResult(levels=(level,), kernels="vLLM 0.32.0 on sm_103: int4 experts MARLIN")
    assert BenchResult.from_dict(result.as_dict()) == result
    assert "kernels" not in BenchResult(levels=(level,)).as_dict()
    with pytest.raises(BenchResultError, match="kernels"):
        BenchResult.from_dict({**result.as_dict(), "kernels": 3})
    verdict = Verdict(KEEP, "fast", 1.1, kernels=result.kernels)
    assert verdict.details()["kernels"] == result.kernels


def init_probes(loaded: LoadedProject, cluster: str) -> list[str]:
    rendered = render_workload(loaded, PlanRequest("serve", cluster, "v3"))
    deployment = next(o for o in rendered.objects if o["kind"] == "Deployment")
    check = next(c for c in deployment["spec"]["template"]["spec"]["initContainers"]
                 if "kimideploy.workloads.gpucheck" in c.get("command", []))  # fmt: skip
    probes: list[str] = check["command"][check["command"].index("--probes") + 1].split(",")
    return probes


def test_the_gpu_check_probes_the_kernel_that_serves_the_experts(example: LoadedProject) -> None:
    for cluster in ("rtx6000", "b300"):  # INT4 experts: Marlin, as the kernel plan says
        assert "marlin-moe" in init_probes(example, cluster) and "moe" not in init_probes(
            example, cluster
        )
    chosen = with_moe_backend(example, "b300", "flashinfer_trtllm")
    assert "moe" in init_probes(chosen, "b300") and "marlin-moe" not in init_probes(chosen, "b300")

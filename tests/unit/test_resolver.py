"""The resolver makes every decision; these pin the ones users and clusters depend on."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.plan.model import Plan, PlanRequest
from kimideploy.plan.resolve import resolve
from kimideploy.plan.storage import hidden_state_bytes_per_token


def obj(plan: Plan, template: str) -> dict[str, Any]:
    [found] = [o.values for o in plan.objects if o.template == template]
    return found


def serve_args(example: LoadedProject, cluster: str, drafter: str | None) -> list[str]:
    plan = resolve(example, PlanRequest("serve", cluster, drafter))
    args: list[str] = obj(plan, "deployment-serve")["args"]
    return args


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize(("cluster", "tp"), [("rtx6000", "8"), ("b200", "8"), ("b300", "8")])
def test_tensor_parallel_is_the_gpus_per_node(
    example: LoadedProject, cluster: str, tp: str
) -> None:
    assert flag(serve_args(example, cluster, "v3"), "--tensor-parallel-size") == tp


def test_tensor_parallel_follows_the_cluster_profile(edited_config: Callable[..., Path]) -> None:
    path = edited_config(
        ("      memory_gb: 96\n      per_node: 8", "      memory_gb: 96\n      per_node: 16")
    )
    args = serve_args(load_project(path), "rtx6000", None)
    assert flag(args, "--tensor-parallel-size") == "16"


@pytest.mark.parametrize(
    ("drafter", "expected"),
    [
        ("v1", {"method": "eagle3", "model": "/models/drafters/AQ-MedAI/Kimi-K2-Instruct-eagle3/"
                "5e4d3c2b1a0f9e8d7c6b5a493827161504f3e2d1", "num_speculative_tokens": 3}),
        ("v2", {"method": "eagle3", "model": "/models/drafters/v2", "num_speculative_tokens": 5}),
        ("v3", {"method": "eagle3", "model": "/models/drafters/v3", "num_speculative_tokens": 3}),
    ],
)  # fmt: skip
def test_speculative_config_json_from_each_drafter(
    example: LoadedProject, drafter: str, expected: dict[str, Any]
) -> None:
    args = serve_args(example, "rtx6000", drafter)
    assert json.loads(flag(args, "--speculative-config")) == expected


def test_draft_tensor_parallel_size_is_passed_when_set(edited_config: Callable[..., Path]) -> None:
    old = "    draft_vocab_size: 32000\n    status: planned"
    path = edited_config((old, "    draft_tensor_parallel_size: 1\n" + old))
    spec = json.loads(flag(serve_args(load_project(path), "rtx6000", "v3"), "--speculative-config"))
    assert spec["draft_tensor_parallel_size"] == 1


def test_no_drafter_means_no_speculative_arguments_at_all(example: LoadedProject) -> None:
    for drafter in (None, "none"):
        args = serve_args(example, "rtx6000", drafter)
        assert not any("specul" in a or "eagle" in a or "draft" in a for a in args)
    with_v3 = serve_args(example, "rtx6000", "v3")
    without = serve_args(example, "rtx6000", "none")
    assert with_v3[: with_v3.index("--speculative-config")] == without


def test_serve_arguments_carry_the_model_settings(example: LoadedProject) -> None:
    args = serve_args(example, "b300", "none")
    assert flag(args, "--served-model-name") == "kimi-k2.5"
    assert flag(args, "--max-model-len") == "65536"
    assert flag(args, "--reasoning-parser") == "kimi_k2"
    assert flag(args, "--tool-call-parser") == "kimi_k2"
    assert "--trust-remote-code" in args


@pytest.mark.parametrize(
    ("cluster", "strategy"),
    [
        ("rtx6000", {"type": "Recreate"}),
        ("b200", {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}),
        ("b300", {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}),
    ],
)
def test_rollout_strategy_per_cluster(example: LoadedProject, cluster: str, strategy: Any) -> None:
    plan = resolve(example, PlanRequest("serve", cluster, "v3"))
    assert obj(plan, "deployment-serve")["strategy"] == strategy


def test_startup_budget_covers_a_slow_load(example: LoadedProject) -> None:
    deployment = obj(resolve(example, PlanRequest("serve", "rtx6000")), "deployment-serve")
    startup = deployment["probes"]["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 40 * 60
    assert startup["httpGet"]["path"] == "/v1/models"
    assert deployment["probes"]["readinessProbe"]["httpGet"]["path"] == "/v1/models"
    assert deployment["progress_deadline_s"] > 2700


def test_hidden_state_estimate_matches_the_team_measurement(example: LoadedProject) -> None:
    # 3 aux layers + final, hidden 7168, bf16 = 57,344 B/token; 828 GB / 10K samples last time.
    assert hidden_state_bytes_per_token(3, 7168, "bfloat16") == 57_344
    plan = resolve(example, PlanRequest("extract", "rtx6000"))
    claim = next(
        o.values for o in plan.objects
        if o.template == "persistentvolumeclaim-storage" and o.values["name"] == "kimi-k25-hidden-states"
    )  # fmt: skip
    estimate = 10_000 * 1450 * 57_344
    assert claim["size"] == f"{-(-int(estimate * 1.15) // 2**30)}Gi"
    assert (
        "831.5 GB = 10,000 samples x 1,450 tokens x 57,344 B/token"
        in dict(plan.facts)["hidden states"]
    )


def test_explicit_small_hidden_state_claim_is_warned(edited_config: Callable[..., Path]) -> None:
    path = edited_config(
        ("hidden_states: {storage_class: local-path, size: auto}", "hidden_states: {storage_class: local-path, size: 100Gi}")
    )  # fmt: skip
    plan = resolve(load_project(path), PlanRequest("extract", "rtx6000"))
    assert any("smaller than the 831.5 GB" in w for w in plan.warnings)


def test_train_is_single_node_under_the_launcher_on_the_pcie_host(example: LoadedProject) -> None:
    plan = resolve(example, PlanRequest("train", "rtx6000"))
    job = obj(plan, "job-train")
    # kimideploy's launcher, not torchrun: a rank's exit code reaches the Job (75 resumes).
    assert job["command"] == ["python", "-m", "kimideploy.workloads.launch"]
    assert "--nnodes=1" in job["args"] and "--nproc-per-node=8" in job["args"]
    assert job["args"][job["args"].index("--") :] == [
        "--", "-m", "kimideploy.workloads", "train", "--spec", "/etc/kimideploy/spec.json"]  # fmt: skip
    assert job["completions"] == job["parallelism"] == 1
    assert not [o for o in plan.objects if o.template == "service-train"]


def test_train_is_multi_node_with_a_headless_service_on_b300(example: LoadedProject) -> None:
    plan = resolve(example, PlanRequest("train", "b300"))
    job = obj(plan, "job-train")
    name = job["name"]
    assert job["completions"] == job["parallelism"] == 4
    assert job["subdomain"] == name
    assert "--node-rank=$(JOB_COMPLETION_INDEX)" in job["args"]
    assert f"--master-addr={name}-0.{name}.kimi.svc" in job["args"]
    assert obj(plan, "service-train")["name"] == name


def test_overrides_change_the_workload_settings(example: LoadedProject) -> None:
    plan = resolve(
        example, PlanRequest("train", "b300", overrides=("train.epochs=7", "train.nodes=2"))
    )
    spec = json.loads(obj(plan, "configmap-spec")["data"]["spec.json"])
    assert spec["epochs"] == 7 and spec["nodes"] == 2
    assert obj(plan, "job-train")["completions"] == 2


def test_render_run_ids_are_deterministic_and_input_dependent(example: LoadedProject) -> None:
    first = resolve(example, PlanRequest("datagen", "b300"))
    again = resolve(example, PlanRequest("datagen", "b300"))
    other = resolve(example, PlanRequest("datagen", "b300", overrides=("datagen.shards=8",)))
    assert first.run_id == again.run_id != other.run_id
    assert resolve(example, PlanRequest("datagen", "b300", run_id="abc123")).run_id == "abc123"


def test_extract_parallelism_is_bounded_by_gpu_copies(example: LoadedProject) -> None:
    job = obj(
        resolve(example, PlanRequest("extract", "rtx6000", overrides=("extract.shards=4",))),
        "job-extract",
    )
    assert job["completions"] == 4 and job["parallelism"] == 1  # one 8-GPU copy fits on the host


def test_gpu_pods_select_the_gpu_product_and_cpu_pods_do_not(example: LoadedProject) -> None:
    serve = obj(resolve(example, PlanRequest("serve", "b300")), "deployment-serve")
    bench = obj(resolve(example, PlanRequest("bench", "b300")), "job-bench")
    assert serve["node_selector"] == {"nvidia.com/gpu.product": "NVIDIA-B300-SXM6-AC"}
    assert bench["node_selector"] == {}
    assert "nvidia.com/gpu" not in bench["resources"]["requests"]


def test_warnings_flag_the_known_mistakes(example: LoadedProject) -> None:
    v1 = resolve(example, PlanRequest("serve", "rtx6000", "v1")).warnings
    v2 = resolve(example, PlanRequest("serve", "rtx6000", "v2")).warnings
    v3 = resolve(example, PlanRequest("serve", "rtx6000", "v3")).warnings
    assert any("trained for moonshotai/Kimi-K2-Instruct" in w for w in v1)
    assert any("eagle_aux_hidden_state_layer_ids of [3, 31, 59]" in w for w in v1)
    assert any("drafts 5 tokens" in w for w in v2)
    assert any("rejected" in w for w in v2)
    assert v3 == ()

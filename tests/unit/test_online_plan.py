"""train.mode online as planned: the target server beside each trainer, the GPU split, and the
refusals that stop an online run that cannot work before anything reaches the cluster."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kimideploy.cluster.jobs import pod_waiting
from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.config.specs import ExtractSpec, OnlineTrainSpec
from kimideploy.errors import ConfigError
from kimideploy.formats.chat_template import SAMPLE_FORMAT
from kimideploy.plan.model import Plan, PlanRequest
from kimideploy.plan.online import SCRATCH_MOUNT, server_args
from kimideploy.plan.resolve import resolve
from kimideploy.plan.vllm_server import ServerBase
from kimideploy.workloads import dataset_record
from kimideploy.workloads.extract_vllm import engine_kwargs
from kimideploy.workloads.runtime import BadInputError
from kimideploy.workloads.train_features import OnlineFeatures
from tests.unit.test_train_checks import TARGET, spec


def obj(plan: Plan, template: str) -> dict[str, Any]:
    [found] = [o.values for o in plan.objects if o.template == template]
    return found


def test_each_b300_trainer_pod_runs_the_target_on_half_its_gpus(example: LoadedProject) -> None:
    plan = resolve(example, PlanRequest("train", "b300"))  # the example trains online there
    job = obj(plan, "job-train")
    # The locked-memory check runs first (multi-node RDMA, workloads/memlock_check.py), then the
    # train image's GPU check on the trainer's half (FlexAttention), then the target server.
    [check, gpu_check, server] = job["init_containers"]
    assert check["name"] == "memlock-check" and gpu_check["name"] == "gpu-check"
    probes = gpu_check["command"][gpu_check["command"].index("--probes") + 1]
    assert probes == "torch-arch,flex-attention"
    assert gpu_check["command"][gpu_check["command"].index("--gpus") + 1] == "4"
    assert gpu_check["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert server["name"] == "target-server" and server["restartPolicy"] == "Always"
    assert server["image"].startswith("ghcr.io/kimideploy/vllm@")  # the extraction image
    assert server["command"] == ["vllm", "serve", "/models/hub/moonshotai/Kimi-K2.5/"
                                 "3d2f1c0b9a8e7d6c5b4a39281706f5e4d3c2b1a0"]  # fmt: skip
    expected = ServerBase(
        served_name="kimi-k2.5", port=8000, tensor_parallel_size=4, max_model_len=8194,
        gpu_memory_utilization=0.9, trust_remote_code=True,
    )  # fmt: skip
    assert server["args"] == server_args(
        expected, dtype="bfloat16", vllm_ids=[2, 30, 58], num_hidden_layers=61,
        storage=SCRATCH_MOUNT,
    )  # fmt: skip
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert job["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert job["args"][0] == "--nproc-per-node=4"
    # Nothing holds the trainer back (a startup probe on a sidecar would, and a server that never
    # loads would then restart forever in a pod that never fails): the trainer waits the budget.
    assert "startupProbe" not in server
    assert server["readinessProbe"]["httpGet"] == {"path": "/v1/models", "port": 8000}
    # Liveness leaves the 45-minute load alone.
    assert server["livenessProbe"]["initialDelaySeconds"] == 2700
    # Both read and write the same pod-local scratch; no hidden-state volume is claimed.
    scratch = {"name": "hidden-states-scratch", "mountPath": SCRATCH_MOUNT}
    assert scratch in server["volumeMounts"] and scratch in job["volume_mounts"]
    assert {"name": "hidden-states-scratch", "emptyDir": {"sizeLimit": "256Gi"}} in job["volumes"]
    assert "hidden-states" not in [v["name"] for v in job["volumes"]]
    assert not [o for o in plan.objects if o.values.get("name") == "kimi-k25-hidden-states"]
    train = json.loads(obj(plan, "configmap-spec")["data"]["spec.json"])
    online = OnlineTrainSpec(**train["online"])
    assert train["mode"] == "online" and train["gpus_per_node"] == 4
    assert online.endpoint == "http://127.0.0.1:8000/v1" and online.storage_dir == SCRATCH_MOUNT
    assert online.aux_layer_ids == [2, 30, 58, 61] and online.server_wait_s == 2700
    facts = dict(plan.facts)
    assert facts["online"] == ("target server on 4 GPUs per node (tensor parallel 4, 149 of 259 "
                               "GB each for weights), trainer on 4")  # fmt: skip
    assert "never stored" in facts["hidden states"]
    assert not [w for w in plan.warnings if "hidden-state claim" in w]


def test_the_server_asks_vllm_for_exactly_what_offline_extraction_asks_for(
    example: LoadedProject,
) -> None:
    job = obj(resolve(example, PlanRequest("train", "b300")), "job-train")
    [server] = [c for c in job["init_containers"] if c["name"] == "target-server"]
    args = server["args"]
    extract = json.loads(obj(resolve(example, PlanRequest("extract", "b300")), "configmap-spec")
                         ["data"]["spec.json"])  # fmt: skip
    kwargs = engine_kwargs(ExtractSpec(**extract), Path(SCRATCH_MOUNT), 4096)
    speculative = json.loads(args[args.index("--speculative-config") + 1])
    transfer = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert speculative == kwargs["speculative_config"]
    assert transfer == kwargs["kv_transfer_config"]
    assert "--no-enable-prefix-caching" in args and kwargs["enable_prefix_caching"] is False


@pytest.mark.parametrize(
    ("cluster", "overrides", "message"),
    [
        ("rtx6000", (), "online training cannot fit on rtx6000: the target needs 8 of the node's "
                        "8 x 96 GB GPUs"),
        ("b300", ("train.online.server_gpus=8",), "leave the trainer at least one"),
        ("b300", ("train.online.server_gpus=3",), "must be one of 1, 2, 4, 8, 16"),
        ("b200", ("train.mode=online", "train.online.server_gpus=2"),
         "2 x 180 GB (162 GB usable each) cannot hold 595 GB of weights"),
        ("b300", ("train.max_seq_len=65535",), "exceed the model's max_model_len 65536"),
    ],
)  # fmt: skip
def test_an_online_run_that_cannot_work_is_refused_from_the_config(
    example: LoadedProject, cluster: str, overrides: tuple[str, ...], message: str
) -> None:
    request = PlanRequest("train", cluster, overrides=("train.mode=online", *overrides))
    with pytest.raises(ConfigError) as caught:
        resolve(example, request)
    assert message in caught.value.message
    assert caught.value.exit_code == 2 and caught.value.hint


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('    kubernetes_version: "1.34"\n    nodes: 8', '    kubernetes_version: "1.28"\n    nodes: 8'),
         "has no native sidecar containers"),
        (("      extract: vllm-0.32-kimi\n      vocab: tools\n      train: train-speculators-0.9\n"
          "      bench: tools\n    workloads:\n      serve:\n        replicas: 2\n        resources: "
          '{cpu: "96", memory: 1Ti}\n        startup_budget_s: 2400\n        max_num_batched_tokens: 16384\n      datagen:\n        prompts: '
          "prompts/mixed-v1.jsonl\n        samples: 500000",
          "      extract: vllm-0.16-kimi\n      vocab: tools\n      train: train-speculators-0.9\n"
          "      bench: tools\n    workloads:\n      serve:\n        replicas: 2\n        resources: "
          '{cpu: "96", memory: 1Ti}\n        startup_budget_s: 2400\n        max_num_batched_tokens: 16384\n      datagen:\n        prompts: '
          "prompts/mixed-v1.jsonl\n        samples: 500000"),
         "has vLLM 0.16.0; hidden-state extraction needs vLLM >= 0.18"),
        (("    torch: 2.13.0\n    vllm: 0.32.0\n", "    torch: 2.13.0\n    vllm: 0.18.0\n"),
         "has vLLM 0.18.0, which cannot hand out the final pre-norm layer of a kimi_k2 target; "
         "that needs vLLM >= 0.32"),
    ],
)  # fmt: skip
def test_a_cluster_or_image_that_cannot_serve_the_target_server_is_refused(
    edited_config: Callable[..., Path], edit: tuple[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(load_project(edited_config(edit)), PlanRequest("train", "b300"))
    assert message in caught.value.message


def online_spec(tmp_path: Path, aux: list[int]) -> Any:
    dataset_record.claim(tmp_path / "conv", {"stage": "datagen"}, {})
    shard = tmp_path / "conv" / "shard-00000"
    shard.mkdir(parents=True)
    (shard / "chunk-000001.jsonl").write_text(
        json.dumps({"format": SAMPLE_FORMAT, "id": "s0", "messages": [], "answer": "hi"}) + "\n"
    )
    base = spec([2, 30, 58], "vllm", [2, 30, 58])
    online = OnlineTrainSpec(endpoint="http://127.0.0.1:9/v1", storage_dir=str(tmp_path / "scratch"),
                             conversations_dir=str(tmp_path / "conv"), aux_layer_ids=aux)  # fmt: skip
    return base.model_copy(update={"mode": "online", "online": online, "target": TARGET})


def test_the_trainer_reads_and_deletes_only_inside_the_shared_scratch(tmp_path: Path) -> None:
    features = OnlineFeatures(online_spec(tmp_path, [2, 30, 58, 61]))
    try:
        (tmp_path / "scratch").mkdir()
        elsewhere = tmp_path / "elsewhere.safetensors"
        elsewhere.write_text("x")
        with pytest.raises(BadInputError, match="not a file in the shared scratch directory"):
            features._states_path(
                {"kv_transfer_params": {"hidden_states_path": str(elsewhere)}}, "s0"
            )
        with pytest.raises(BadInputError, match=r"without kv_transfer_params\.hidden_states_path"):
            features._states_path({"choices": []}, "s0")
        inside = tmp_path / "scratch" / "cmpl-1.safetensors"
        inside.write_text("x")
        assert (
            features._states_path({"kv_transfer_params": {"hidden_states_path": str(inside)}}, "s0")
            == inside
        )
        assert elsewhere.exists()
    finally:
        features.close()


def test_a_server_started_for_other_layers_is_refused_before_any_request(tmp_path: Path) -> None:
    with pytest.raises(
        BadInputError, match=r"extracts layers \[3, 31, 59, 61\].*needs \[2, 30, 58, 61\]"
    ):
        OnlineFeatures(online_spec(tmp_path, [3, 31, 59, 61]))


def pod(phase: str, init: list[dict[str, Any]], main: list[dict[str, Any]]) -> dict[str, Any]:
    spec = {"initContainers": [{"name": "target-server", "restartPolicy": "Always"}]}
    return {"spec": spec, "status": {"phase": phase, "initContainerStatuses": init,
                                     "containerStatuses": main}}  # fmt: skip


def test_a_run_says_when_its_target_server_is_loading_or_crashing() -> None:
    loading = {"name": "target-server", "started": True, "ready": False, "restartCount": 0,
               "state": {"running": {"startedAt": "2026-11-29T10:00:00Z"}}}  # fmt: skip
    trainer = {"name": "train", "state": {"running": {}}}
    assert pod_waiting(pod("Running", [loading], [trainer])) == (
        "target-server starting since 2026-11-29T10:00:00Z"
    )
    crashing = {"name": "target-server", "started": False, "ready": False, "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}}}  # fmt: skip
    assert pod_waiting(pod("Running", [crashing], [trainer])) == (
        "target-server CrashLoopBackOff, restarted 3 times"
    )
    ready = {**loading, "ready": True}
    training = {"name": "train", "state": {"running": {}}}
    assert pod_waiting(pod("Running", [ready], [training])) == ""
    assert pod_waiting(pod("Succeeded", [crashing], [training])) == ""

"""What GPU pods get that only real hardware would miss: kernel caches that survive a
restart, the replay holding only the GPUs each stage uses, and the serve flags of the recipe."""

from __future__ import annotations

import json
from typing import Any

from kimideploy.config.loading import LoadedProject
from kimideploy.images.dockerfile import render_dockerfile
from kimideploy.plan.asks import ReplayAsk
from kimideploy.plan.jobs import AFTER_ANNOTATION
from kimideploy.plan.model import Plan, PlanRequest
from kimideploy.plan.resolve import resolve
from tests.pipeline.conftest import CONFIG as PIPELINE_CONFIG


def obj(plan: Plan, template: str) -> dict[str, Any]:
    return next(o.values for o in plan.objects if o.template == template)


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def cache_dirs(env: dict[str, str]) -> set[str]:
    keys = (
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
        "VLLM_CACHE_ROOT",
        "FLASHINFER_WORKSPACE_BASE",
    )
    return {env[k].rsplit("/", 1)[0] for k in keys}


def test_compiled_kernels_are_kept_per_image_digest_on_the_compile_cache_claim(
    example: LoadedProject,
) -> None:
    """torch.compile, Triton, vLLM and FlashInfer caches lived in an emptyDir HOME: every restart
    and rollback compiled again. They live on a claim now, in a folder of the image's digest."""
    project = example.project
    serve = obj(resolve(example, PlanRequest("serve", "b300", "k25")), "deployment-serve")
    digest = project.images["vllm-0.32-kimi"].digest.removeprefix("sha256:")[:16]
    assert cache_dirs(env_of({"env": serve["env"]})) == {f"/cache/{digest}"}
    assert {"name": "compile-cache", "mountPath": "/cache", "readOnly": False} in serve[
        "volume_mounts"
    ]
    gpu_check = next(c for c in serve["init_containers"] if c["name"] == "gpu-check")
    assert cache_dirs(env_of(gpu_check)) == {f"/cache/{digest}"}  # its Triton kernel too
    train = obj(resolve(example, PlanRequest("train", "b200")), "job-train")
    trained_with = project.images["train-speculators-0.9"].digest.removeprefix("sha256:")[:16]
    assert cache_dirs(env_of({"env": train["env"]})) == {f"/cache/{trained_with}"}
    claims = {o.values["name"]: o.values for o in resolve(example, PlanRequest("train", "b200")).objects
              if o.template == "persistentvolumeclaim-storage"}  # fmt: skip
    cache = claims["kimi-k25-compile-cache"]
    checkpoints = claims["kimi-k25-checkpoints"]
    assert (cache["storage_class"], cache["access_mode"], cache["size"]) == (
        checkpoints["storage_class"],
        checkpoints["access_mode"],
        "200Gi",
    )
    datagen = obj(resolve(example, PlanRequest("datagen", "b200")), "job-datagen")
    assert "TRITON_CACHE_DIR" not in env_of({"env": datagen["env"]})  # a CPU pod compiles nothing


def test_the_online_sidecar_keeps_its_own_images_kernels(example: LoadedProject) -> None:
    train = obj(resolve(example, PlanRequest("train", "b300")), "job-train")
    server = train["init_containers"][-1]
    digest = example.project.images["vllm-0.32-kimi"].digest.removeprefix("sha256:")[:16]
    assert cache_dirs(env_of(server)) == {f"/cache/{digest}"}
    assert "/cache" in [m["mountPath"] for m in server["volumeMounts"]]


def test_vllm_images_carry_flashinfers_cubins_and_say_so_when_built(example: LoadedProject) -> None:
    for name in ("vllm-0.16-kimi", "vllm-0.32-kimi"):
        text = render_dockerfile(example.project, name)
        assert "RUN python -m flashinfer --download-cubin" in text
        assert text.count("ENV FLASHINFER_CUBIN_DIR=/opt/venv/share/flashinfer-cubins") == 2
        assert text.count("VLLM_HAS_FLASHINFER_CUBIN=1") == 1  # the runtime stage's
        assert "nccl ibverbs flashinfer-cubins" in text
    assert "flashinfer" not in render_dockerfile(example.project, "train-speculators-0.9")


def test_the_replay_holds_the_capture_gpus_only_while_capturing(example: LoadedProject) -> None:
    """An init container's GPUs count for its whole pod: a capture on 8 GPUs followed by a 1-GPU
    judgement in one pod held 8 GPUs for both. Two Jobs now, the second created after the first."""
    plan = resolve(example, PlanRequest("replay", "b300", "k25", ask=ReplayAsk(drafters=("k25",))))
    capture, judge = [o.values for o in plan.objects if o.template == "job-replay"]
    assert capture["name"] == f"{judge['name']}-capture" and judge["name"].startswith(
        "kimi-k25-replay"
    )
    assert capture["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert capture["command"][-3:] == ["replay-capture", "--spec", "/etc/kimideploy/spec.json"]
    assert (
        judge["resources"]["limits"]["nvidia.com/gpu"] == "1" and judge["args"][0] == "replay-judge"
    )
    assert judge["init_containers"] == [] and AFTER_ANNOTATION not in capture["annotations"]
    assert judge["annotations"][AFTER_ANNOTATION] == capture["name"]
    shm = {v["name"]: v for v in capture["volumes"]}["dshm"]["emptyDir"]["sizeLimit"]
    assert shm == "64Gi"  # the engine's TP group, not the judge's 16Gi
    policies = {o.values["name"] for o in plan.objects if o.template == "networkpolicy"}
    assert policies == {capture["name"], judge["name"]}


def test_serve_takes_the_recipes_flags_where_they_apply(example: LoadedProject) -> None:
    args = obj(resolve(example, PlanRequest("serve", "rtx6000", "v3")), "deployment-serve")["args"]
    assert args[args.index("--mm-encoder-tp-mode") + 1] == "data"  # Kimi-K2.5 is multimodal
    assert args[args.index("--max-num-batched-tokens") + 1] == "8192"
    b300 = obj(resolve(example, PlanRequest("serve", "b300", "k25")), "deployment-serve")["args"]
    assert b300[b300.index("--max-num-batched-tokens") + 1] == "16384"
    pinned = resolve(example, PlanRequest("serve", "b300", "k25",
                                          overrides=("serve.attention_backend=FLASHMLA",)))  # fmt: skip
    pinned_args = obj(pinned, "deployment-serve")["args"]
    assert pinned_args[pinned_args.index("--attention-backend") + 1] == "FLASHMLA"
    from kimideploy.config.loading import load_project

    text_only = load_project(PIPELINE_CONFIG)
    llama = obj(resolve(text_only, PlanRequest("serve", "cpu", "good")), "deployment-serve")["args"]
    assert "--mm-encoder-tp-mode" not in llama  # a text-only target has no encoder
    assert json.loads(llama[llama.index("--speculative-config") + 1])["method"] == "eagle3"

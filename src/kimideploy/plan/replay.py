"""The replay Job (`drafter doctor`, `drafter check --replay`): its spec, and the capture
container that runs before the judgement.

Capture runs on the cluster's serve image, the engine that serves, when its vLLM can extract
hidden states (vLLM >= 0.18; a DeepSeek-shaped target's final layer needs 0.32); otherwise on the
cluster's extraction image, and the plan says so (same weights and template, another engine
version). The judgement runs on the train image: speculators' modules, the code training's
held-out judgement runs. The captured sequences live on the hidden-states claim under a folder
named by what decides them (served checkpoint, capturing image, layers, dtype, answer length),
so a second doctor run on the same serving configuration reuses them and a restarted pod resumes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kimideploy.config.drafters import to_vllm_layer_ids
from kimideploy.config.images import Image
from kimideploy.config.specs import SPEC_PATH, ReplayDrafter, ReplayPromptSet, ReplaySpec
from kimideploy.errors import UsageError
from kimideploy.formats import extraction_engine
from kimideploy.plan import pods
from kimideploy.plan.asks import ReplayAsk
from kimideploy.plan.inputs import HIDDEN_STATES_MOUNT, PlanInputs, drafter_path

CAPTURE_CONTAINER = "replay-capture"
MAX_PROMPTS = 512
"""Prompts travel in the spec ConfigMap (1 MiB); 512 chat prompts fit with room to spare."""


def replay_drafters(ctx: PlanInputs) -> tuple[str, ...]:
    return ctx.asked(ReplayAsk).drafters or (ctx.drafter_name,)


def capture_image(ctx: PlanInputs) -> tuple[str, Image, str]:
    """The image whose vLLM captures, and a note when it is not the serve image."""
    images = ctx.cluster.images
    model_type = ctx.model.text_model_type
    serve = ctx.project.images[images.serve]
    problem = extraction_engine.image_problem(serve.vllm, model_type)
    if problem is None:
        return images.serve, serve, ""
    extract = ctx.project.images[images.extract]
    if extraction_engine.image_problem(extract.vllm, model_type) is not None:
        raise UsageError(
            f"cluster {ctx.cluster_name}: neither its serve image {images.serve} ({problem}) nor "
            f"its extraction image {images.extract} can capture hidden states for the replay",
            hint="set images.extract to an image with vLLM >= 0.32",
        )
    note = (
        f"captured on the extraction image {images.extract} (vLLM {extract.vllm}): the serve "
        f"image {images.serve} {problem}; same weights and template, another engine version"
    )
    return images.extract, extract, note


def layer_ids(ctx: PlanInputs, names: tuple[str, ...]) -> list[int]:
    """Every drafter's served layers and their neighbours (the convention probes), within the
    ids vLLM accepts (1 .. layers - 1; the final layer is always added)."""
    top = ctx.model.num_hidden_layers - 1
    wanted: set[int] = set()
    for name in names:
        drafter = ctx.project.eagle_drafter(name)
        for i in to_vllm_layer_ids(drafter.aux_layer_ids, drafter.layer_id_convention):
            wanted |= {j for j in (i - 1, i, i + 1) if 1 <= j <= top}
    return sorted(wanted)


def replay_spec(ctx: PlanInputs, run_id: str) -> ReplaySpec:
    names = replay_drafters(ctx)
    drafters = []
    for name in names:
        if name not in ctx.project.eagle_drafters:
            raise UsageError(
                f"drafter {name}: the replay judges EAGLE-3 drafters; model-free methods have "
                "nothing to replay offline",
                hint="`kimideploy run bench --drafters ...` measures them served",
            )
        drafter = ctx.project.eagle_drafter(name)
        if drafter.decoder != "llama":
            raise UsageError(
                f"drafter {name} has an MLA decoder: the replay judges with speculators' "
                "Eagle3DraftModel, which builds Llama decoder layers only",
                hint=f"measure it served (`kimideploy run bench --drafter {name}`) instead",
            )
        drafters.append(
            ReplayDrafter(
                name=name,
                path=drafter_path(name, drafter),
                served_layer_ids=to_vllm_layer_ids(
                    drafter.aux_layer_ids, drafter.layer_id_convention
                ),
                num_speculative_tokens=drafter.num_speculative_tokens,
            )
        )
    if sum(len(rows) for _, rows in ctx.asked(ReplayAsk).prompts) > MAX_PROMPTS:
        raise UsageError(
            f"--prompts: more than {MAX_PROMPTS} prompts; they travel in the Job's spec",
            hint=f"pass a sample of at most {MAX_PROMPTS} (they are answered on the GPUs)",
        )
    image_name, image, note = capture_image(ctx)
    settings = ctx.cluster.workloads.extract
    ids = layer_ids(ctx, names)
    max_tokens = ctx.cluster.workloads.bench.max_tokens
    decided = {
        "model": ctx.target_ref().model_dump(),
        "image": image.reference,
        "layers": ids,
        "dtype": settings.dtype,
        "tp": settings.gpus_per_shard,
        "max_tokens": max_tokens,
    }
    key = hashlib.sha256(json.dumps(decided, sort_keys=True).encode()).hexdigest()[:16]
    return ReplaySpec(
        run_id=run_id,
        cluster=ctx.cluster_name,
        target=ctx.target_ref(),
        capture_dir=f"{HIDDEN_STATES_MOUNT}/replay/{key}",
        capture_image=image_name,
        capture_note=note,
        layer_ids=ids,
        drafters=drafters,
        prompt_sets=[
            ReplayPromptSet(name=name, rows=list(rows))
            for name, rows in ctx.asked(ReplayAsk).prompts
        ],
        max_tokens=max_tokens,
        dtype=settings.dtype,
        tensor_parallel_size=settings.gpus_per_shard,
        max_seq_len=ctx.cluster.workloads.train.max_seq_len,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        max_num_batched_tokens=settings.max_num_batched_tokens,
    )


def capture_container(
    ctx: PlanInputs, mounts: list[dict[str, Any]], env: list[dict[str, Any]]
) -> dict[str, Any]:
    """replay-capture: the serving engine with the extraction shape's GPUs and resources."""
    _, image, _ = capture_image(ctx)
    settings = ctx.cluster.workloads.extract
    return {
        "name": CAPTURE_CONTAINER,
        "image": image.reference,
        "command": ["python", "-m", "kimideploy.workloads", CAPTURE_CONTAINER, "--spec", SPEC_PATH],
        "env": env,
        "resources": pods.resources(
            settings.resources.cpu, settings.resources.memory, settings.gpus_per_shard
        ),
        "volumeMounts": mounts,
        "securityContext": pods.container_hardening(),
    }

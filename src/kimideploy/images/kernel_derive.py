"""Deriving an image's kernel plan from its pinned vLLM (plan/kernel_plan.py reads what is stored):
kernel_check.py runs with the image's vLLM, its patched sources first on the path."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from kimideploy.config.images import Image
from kimideploy.config.project import Project
from kimideploy.images.dockerfile import patchset_sha256
from kimideploy.plan.kernel_inputs import (
    DRAFTER_HEAD_SIZE,
    DRAFTER_HEADS,
    DRAFTER_KV_HEADS,
    TENSOR_PARALLEL,
    model_configs,
    model_fingerprint,
)
from kimideploy.plan.kernel_plan import forget_stored, plans_file, stored_all


def engines(project: Project, image: Image) -> dict[str, dict[str, Any]]:
    """What kernel_check.py selects for: the target's attention, an EAGLE-3 llama head's."""
    model = project.model
    found: dict[str, dict[str, Any]] = {}
    attention = model.attention
    if attention is not None:
        mla = attention.kind == "mla"
        head_size = (
            (attention.kv_lora_rank or 0) + (attention.qk_rope_head_dim or 0)
            if mla
            else attention.head_dim or 0
        )
        found["target"] = {"use_mla": mla, "head_size": head_size, "num_heads": attention.num_heads}
    found["drafter"] = {
        "use_mla": False,
        "head_size": DRAFTER_HEAD_SIZE,
        "num_heads": DRAFTER_HEADS // TENSOR_PARALLEL,
        "num_kv_heads": max(1, DRAFTER_KV_HEADS // TENSOR_PARALLEL),
    }
    return found


MOE_QUANTIZATIONS = {"int4": "w4a16", "nvfp4": "nvfp4"}
"""The checkpoint formats whose experts kernel kernel_check.py derives from vLLM's oracle."""


def moe_engines(project: Project) -> dict[str, dict[str, Any]]:
    """The target's routed experts for each quantization it is served in (the model and its
    variants), on 8 tensor-parallel GPUs: `moe-<format>` -> what vLLM's MoE oracle is asked."""
    model, moe = project.model, project.model.moe
    if moe is None:
        return {}
    intermediate = round(moe.expert_params_m * 1e6 / (3 * model.hidden_size))
    found = {}
    for quantization in {
        model.quantization,
        *(v.quantization for v in project.model_variants.values()),
    }:
        if quantization not in MOE_QUANTIZATIONS:
            continue
        found[f"moe-{quantization}"] = {
            "quantization": MOE_QUANTIZATIONS[quantization],
            "experts": moe.routed_experts,
            "experts_per_token": moe.experts_per_token,
            "hidden": model.hidden_size,
            "intermediate": intermediate,
            "group_size": moe.weight_group_size,
            "tensor_parallel": TENSOR_PARALLEL,
        }
    return dict(sorted(found.items()))


def check_spec(project: Project, image_name: str) -> dict[str, Any]:
    """What kernel_check.py is asked for an image: its architectures, the engines, the model's
    configs and whether the image bakes FlashInfer's cubins (TRT-LLM attention needs them)."""
    image = project.images[image_name]
    return {
        "archs": list(image.cuda_archs),
        "engines": engines(project, image),
        "moe": moe_engines(project) if image.vllm else {},
        "configs": model_configs(project),
        "flashinfer_cubins": image.vllm is not None and image.cuda is not None,
    }


def run_check(spec: dict[str, Any], python: Path, overlay: Path | None) -> dict[str, Any]:
    """kernel_check.py's whole answer to a spec, with the image's vLLM."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "VLLM_LOGGING_LEVEL": "ERROR"}
    if overlay is not None:
        env["PYTHONPATH"] = str(overlay)
    done = subprocess.run(
        [str(python), str(Path(__file__).with_name("kernel_check.py"))],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"kernel_check.py failed (exit {done.returncode}): {done.stderr[-800:]}")
    answer: dict[str, Any] = json.loads(lines[-1])
    return answer


def derive(project: Project, image_name: str, python: Path, overlay: Path | None) -> dict[str, Any]:
    """Run kernel_check.py with the image's vLLM: its answer for every architecture it claims."""
    derived = run_check(check_spec(project, image_name), python, overlay)
    return {**summary(derived), "model": model_fingerprint(project)}


def summary(derived: dict[str, Any]) -> dict[str, Any]:
    """What is stored: per architecture and engine, the choice and the decisive attributes."""
    archs: dict[str, dict[str, Any]] = {}
    for arch, per_engine in derived["archs"].items():
        archs[arch] = {}
        for engine, found in per_engine.items():
            chosen = found.get("selected") or {}
            archs[arch][engine] = {
                "backend": chosen.get("backend"),
                "query_len_support": chosen.get("query_len_support"),
                "cudagraph_support": chosen.get("cudagraph_support"),
                "undetermined_ahead": list(found.get("undetermined_ahead") or []),
            }
    return {
        "vllm": derived["vllm"],
        "evaluated_with": derived.get("evaluated_with", "an empty VllmConfig"),
        "archs": archs,
    }


def patchset(image: Image) -> str:
    """The patch set a plan was derived with (the sources are the wheel's plus these)."""
    return patchset_sha256(image)[:12]


def entry(image: Image, derived: dict[str, Any]) -> dict[str, Any]:
    """What docker/kernel-plans.json keeps for an image: the plan and the sources it came from."""
    return {"patchset": patchset(image), "patches": list(image.patches), **derived}


def is_stored(image_name: str, image: Image, derived: dict[str, Any]) -> bool:
    """Whether the stored plan is this derivation, from these sources."""
    return stored_all().get(image_name) == entry(image, derived)


def store(image_name: str, image: Image, derived: dict[str, Any]) -> Path:
    plans = stored_all()
    plans[image_name] = entry(image, derived)
    path = plans_file()
    path.write_text(json.dumps(plans, indent=2, sort_keys=True) + "\n")
    forget_stored()
    return path

"""`kimideploy image verify NAME`: pins resolve, patches apply and work, rendered flags accepted.

Everything runs offline after a one-time download into ~/.cache/kimideploy/: the pinned vLLM
wheel (its Python sources are what the image patches) and a virtualenv with the pinned vLLM
stack, used on CPU to build vLLM's own engine configuration from the arguments kimideploy renders.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kimideploy.config.images import Image
from kimideploy.formats.check_result import CheckResult
from kimideploy.images.cache_lock import building
from kimideploy.images.dockerfile import constraints_path, patch_files, patchset_sha256
from kimideploy.paths import cache_root, repository_root


def _pip(python: str, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-m", "pip", *args], capture_output=True, text=True, timeout=timeout
    )


# --- pins -------------------------------------------------------------------------------------

# Every tag a glibc 2.35+ x86_64 base (Ubuntu 22.04/24.04) accepts.
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(35, 4, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)


def resolve_pins(name: str, image: Image) -> CheckResult:
    """pip's resolver, for the image's Python and platform, without installing (cached by hash)."""
    pins = repository_root() / constraints_path(name)
    if not pins.is_file():
        return CheckResult("pins resolve", False, f"{constraints_path(name)} is missing")
    import hashlib

    key = hashlib.sha256(pins.read_bytes() + image.python.encode()).hexdigest()[:16]
    cached = cache_root() / "verify" / f"pins-{name}-{key}.json"
    if cached.is_file():
        return CheckResult(
            "pins resolve", True, f"{constraints_path(name)} (resolved before: {cached.name})"
        )
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            f"{tmp}/r.json",
            "--python-version",
            image.python,
            "--only-binary=:all:",
            "--target",
            f"{tmp}/t",
            "-r",
            str(pins),
        ]
        for platform in PLATFORMS:
            args += ["--platform", platform]
        done = _pip(sys.executable, *args)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            return CheckResult("pins resolve", False, " | ".join(lines[-4:]))
        report = json.loads(Path(f"{tmp}/r.json").read_text())
    installed = sorted(
        f"{i['metadata']['name']}=={i['metadata']['version']}" for i in report["install"]
    )
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(installed, indent=1))
    return CheckResult("pins resolve", True, f"{len(installed)} packages for Python {image.python}")


# --- patches ----------------------------------------------------------------------------------


def cached_wheel(distribution: str, version: str) -> Path:
    """A wheel from PyPI without its dependencies, downloaded once into the cache."""
    wheels = cache_root() / "wheels"
    pattern = f"{distribution.replace('-', '_')}-{version}-*.whl"
    found = sorted(wheels.glob(pattern))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    # Downloaded beside the cache and moved in whole: scripts/test installs in parallel, and a
    # reader must never see half a wheel (two downloads of one wheel both land the same bytes).
    with tempfile.TemporaryDirectory(prefix=".download-", dir=wheels) as partial:
        done = _pip(
            sys.executable, "download", "--no-deps", f"{distribution}=={version}", "-d", partial
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"cannot download {distribution}=={version}: {done.stderr.strip()[-400:]}"
            )
        for wheel in Path(partial).glob("*.whl"):
            wheel.replace(wheels / wheel.name)
    return sorted(wheels.glob(pattern))[0]


def vllm_wheel(version: str) -> Path:
    return cached_wheel("vllm", version)


def built_once(target: Path, marker: str, build: Callable[[Path], None]) -> Path:
    """`target`, made by `build` (given an empty folder) the first time it is asked for. Made in
    a temporary sibling and renamed in whole: test sessions run at once, and one must never read
    half a tree another is still writing, nor remove one another is reading. `marker`, a path
    inside, says a tree is complete (one without it was left by an interrupted older build)."""
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    partial.chmod(0o755)  # as a plain mkdir would: pods run as other users read it
    try:
        build(partial)
        for _attempt in range(3):
            try:
                partial.rename(target)
                break
            except OSError:
                if (target / marker).exists():  # another session's complete tree: use it
                    break
                shutil.rmtree(target, ignore_errors=True)  # a stale, incomplete one
        else:
            raise OSError(f"{target}: could not be replaced by the tree just built (three tries)")
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def vllm_sources(version: str) -> Path:
    """The Python sources of the pinned wheel (what the image patches), extracted once."""

    def extract(into: Path) -> None:
        with zipfile.ZipFile(vllm_wheel(version)) as wheel:
            for member in wheel.namelist():
                if member.startswith("vllm/") and member.endswith(".py"):
                    wheel.extract(member, into)

    return built_once(cache_root() / "vllm-src" / version, "vllm/__init__.py", extract)


def apply_patches(image: Image, tree: Path, dry_run: bool) -> list[CheckResult]:
    """`patch --forward --fuzz=0` each patch in order; a drifted one fails with patch's message."""
    steps = []
    for patch in patch_files(image):
        args = [
            "patch",
            "-p1",
            "--forward",
            "--fuzz=0",
            "--batch",
            "-i",
            str(patch),
            "-d",
            str(tree),
        ]
        if dry_run:
            args.append("--dry-run")
        done = subprocess.run(args, capture_output=True, text=True)
        output = " ".join((done.stdout + done.stderr).split())
        steps.append(
            CheckResult(f"patch {patch.name} applies", done.returncode == 0, output[-300:])
        )
        if done.returncode != 0:
            break
    return steps


def patched_overlay(image: Image, python: Path | None = None) -> Path:
    """A copy (hard links; `patch` writes new files, so the venv is untouched) of the vLLM of
    `python`'s venv (default: the official wheel's venv) with the patches applied, for
    PYTHONPATH."""
    assert image.vllm is not None
    venv = python.parent.parent if python is not None else vllm_venv(image.vllm)
    site = next(venv.glob("lib/python3*/site-packages"))
    key = f"{venv.name}-{patchset_sha256(image)[:12]}"

    def patch(into: Path) -> None:
        subprocess.run(["cp", "-al", str(site / "vllm"), str(into / "vllm")], check=True)
        failed = [s for s in apply_patches(image, into, dry_run=False) if not s.ok]
        if failed:
            raise RuntimeError(failed[0].detail)

    return built_once(cache_root() / "verify" / f"overlay-{key}", "vllm/__init__.py", patch)


def vllm_venv(version: str) -> Path:
    """A virtualenv with vllm==version and its pinned dependencies (CUDA wheels, run on CPU)."""
    venv = cache_root() / "venvs" / f"vllm-{version}"
    python = venv / "bin" / "python"
    if (venv / ".complete").is_file():
        return venv
    with building(venv):
        if (venv / ".complete").is_file():  # another session built it while this one waited
            return venv
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        done = _pip(
            str(python),
            "install",
            "--quiet",
            "--find-links",
            str(cache_root() / "wheels"),
            f"vllm=={version}",
            timeout=3600,
        )
        if done.returncode != 0:
            raise RuntimeError(f"cannot install vllm=={version}: {done.stderr.strip()[-400:]}")
        (venv / ".complete").write_text(version)
    return venv


# --- engine configuration ----------------------------------------------------------------------


TINY_MLA = {
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
}
"""Latent-attention shapes of the tiny target and the tiny MLA drafter alike."""


def tiny_target_config(project_model: Any) -> dict[str, Any]:
    """Shaped like Kimi-K2.5 (wrapper + DeepSeek-V3 text config); needs no weights."""
    text = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": project_model.num_hidden_layers,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        **TINY_MLA,
        "vocab_size": 1024,
        "max_position_embeddings": 262144,
        "rope_theta": 50000.0,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16",
        "topk_method": "noaux_tc",
        "n_group": 1,
        "topk_group": 1,
        "scoring_func": "sigmoid",
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
    }
    return {
        "architectures": [project_model.architecture],
        "model_type": project_model.model_type,
        "media_placeholder_token_id": 1000,
        "text_config": text,
        "torch_dtype": "bfloat16",
    }


KIMI_TOKENS = (
    "<|im_system|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_middle|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|media_pad|>",
)
"""What vLLM 0.32's kimi_k2 parsers and Kimi-K2.5's processor look up in the vocabulary."""
# Kimi-K2.5's vision preprocessing settings (the shape vLLM 0.32's fused processor reads); vLLM
# builds the processor while it decides what the model accepts, even for text-only serving.
TINY_PREPROCESSOR = {
    "media_proc_cfg": {
        "patch_size": 14,
        "merge_kernel_size": [2, 2],
        "temporal_merge_kernel_size": 4,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "in_patch_limit": 16384,
        "patch_limit_on_one_side": 512,
        "fixed_output_tokens": None,
    }
}


def tiny_tokenizer_files(vocab_size: int) -> dict[str, str]:
    """A word-level tokenizer (tokenizer.json written as JSON, no library needed) with Kimi's
    special tokens: vLLM 0.32 builds the --reasoning-parser and --tool-call-parser while building
    its engine configuration, and they need a real vocabulary (--skip-tokenizer-init no longer
    passes with them)."""
    vocab = {"<unk>": 0, **{token: i + 1 for i, token in enumerate(KIMI_TOKENS)}}
    vocab.update({f"w{i}": i for i in range(len(vocab), vocab_size)})
    tokenizer = {
        "version": "1.0",
        "added_tokens": [
            {
                "id": vocab[t],
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for t in KIMI_TOKENS
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "eos_token": "<|im_end|>",
        "model_max_length": 262144,
    }
    return {
        "tokenizer.json": json.dumps(tokenizer),
        "tokenizer_config.json": json.dumps(config),
        "preprocessor_config.json": json.dumps(TINY_PREPROCESSOR),
    }


def tiny_drafter_config(vllm_layer_ids: list[int], draft_vocab_size: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "num_hidden_layers": 1,
        "vocab_size": 1024,
        "draft_vocab_size": min(draft_vocab_size, 512),
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16",
        "eagle_aux_hidden_state_layer_ids": vllm_layer_ids,
        "target_hidden_size": 64,
    }


def tiny_mla_drafter_config(vllm_layer_ids: list[int], draft_vocab_size: int) -> dict[str, Any]:
    """An MLA EAGLE-3 drafter the way vLLM's Kimi-K2.5 recipe drafter is written: one DeepSeek
    decoder layer with multi-head latent attention, `model_type` kimi_k2 (the value that vLLM's
    MLA detection misses once the config is wrapped as an EAGLE config)."""
    return {
        **tiny_drafter_config(vllm_layer_ids, draft_vocab_size),
        "architectures": ["Eagle3DeepseekV2ForCausalLM"],
        "model_type": "kimi_k2",
        "rope_theta": 50000.0,
        **TINY_MLA,
    }


def run_engine_checks(
    python: Path, overlay: Path | None, cases: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Run engine_check.py with the given interpreter (and patched sources first on the path)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "cases.json"
        spec.write_text(json.dumps(cases))
        env = {
            **os.environ,
            "VLLM_TARGET_DEVICE": "cpu",
            "CUDA_VISIBLE_DEVICES": "",
            "VLLM_LOGGING_LEVEL": "ERROR",
            "TOKENIZERS_PARALLELISM": "false",
        }
        if overlay is not None:
            env["PYTHONPATH"] = str(overlay)
        script = Path(__file__).with_name("engine_check.py")
        done = subprocess.run(
            [str(python), str(script), str(spec)],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
            cwd=tmp,
        )
    for line in done.stdout.splitlines():
        if line.startswith("KIMIDEPLOY-RESULT "):
            results: list[dict[str, Any]] = json.loads(line.removeprefix("KIMIDEPLOY-RESULT "))
            return results
    raise RuntimeError(
        f"the engine check did not finish (exit {done.returncode}): {done.stderr[-800:]}"
    )

"""Will vLLM load this drafter directory, for this target, at these layers? (no torch needed)

Shared by `kimideploy drafter check --dir` (a local copy) and the serve pod's `drafter-check` init
container (the copy on the models volume, seconds before a 25-minute load). Each problem is a
CheckResult with its fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimideploy.formats.bounded_io import UnreadableFileError, read_json_object
from kimideploy.formats.check_result import CheckResult
from kimideploy.formats.extraction_engine import version_tuple
from kimideploy.formats.safetensors_files import read_headers

EAGLE3_ARCHITECTURES = {
    "LlamaForCausalLMEagle3",
    "Eagle3LlamaForCausalLM",
    "Eagle3Speculator",
    "Eagle3DraftModel",  # the speculators format (speculators_model_type eagle3), which vLLM reads
}
MLA_EAGLE3_ARCHITECTURES = {"Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM"}
"""What vLLM >= 0.32 maps to its DeepSeek (MLA) EAGLE-3 drafter model."""
MLA_KEYS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
"""The latent-attention shapes the MLA decoder layer is built from; without kv_lora_rank vLLM
does not treat the drafter as MLA at all."""
MLA_DRAFTER_MODEL_TYPES = ("axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp")
"""The model types vLLM 0.32 detects as MLA inside an EAGLE config (the list
vllm-project/vllm#45764 extends with kimi_k2; kimideploy's vLLM 0.32 patch 0001 does the same)."""
KIMI_MLA_PATCH = "0001-mla-eagle3-drafter-kimi-k2.patch"
EAGLE31_NORMS = {
    "fc_norm": "fc_norm.",
    "norm_before_fc": "input_norm.",
    "norm_output": None,
}
"""EAGLE-3.1's config flags (kimi-k2.6-eagle3.1-mla carries fc_norm and norm_output) and the tensor
names each one's weights load under (norm_output reuses the final norm: no tensor of its own). Read
in the pinned sources: vLLM 0.32's llama_eagle3.py and deepseek_eagle3.py build an RMSNorm per aux
layer for fc_norm, one over the concatenated input for norm_before_fc, and hand the post-norm
hidden state back for norm_output; vLLM 0.16's llama_eagle3.py reads none of the three."""
EAGLE31_FIRST_VLLM = (0, 32)
LINEAGE_FILE = "kimideploy-lineage.json"
"""Written by the train workload next to config.json."""


@dataclass(frozen=True)
class Expected:
    """What the registry and the target say the directory must hold."""

    target_repo: str
    target_revision: str
    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    layer_ids: list[int]
    convention: str
    vllm_layer_ids: list[int]
    draft_vocab_size: int
    num_speculative_tokens: int
    vllm_version: str = "0.32.0"
    """The vLLM of the image that will load the drafter: where it reads the ids depends on it."""
    decoder: str = "llama"
    """The registry's `decoder`: llama or mla."""
    image_patches: tuple[str, ...] = ()
    """The serving image's vLLM patches (whether a kimi_k2 MLA drafter is detected as MLA)."""


def folder_findings(expected: Expected, folder: Path) -> list[CheckResult]:
    config_file = folder / "config.json"
    if not config_file.exists() and not config_file.is_symlink():
        return [
            CheckResult(
                "config.json", False, f"{config_file} is missing", "point at a drafter checkpoint"
            )
        ]
    try:
        config = read_json_object(config_file)
    except UnreadableFileError as exc:
        return [CheckResult("config.json", False, str(exc), "copy the drafter again")]
    archs = set(config.get("architectures") or [])
    layer_config = config.get("transformer_layer_config") or {}
    hidden = (
        config.get("target_hidden_size")
        or config.get("hidden_size")
        or layer_config.get("hidden_size")
    )
    tensors, broken = read_headers(folder)
    return [
        _architecture_finding(expected, archs),
        *_mla_findings(expected, config),
        CheckResult(
            "hidden size",
            hidden == expected.hidden_size,
            f"{hidden} (target {expected.hidden_size})",
            "this drafter was built for another target; train one for this model",
        ),
        _layer_finding(expected, config),
        CheckResult(
            "weights readable",
            not broken and bool(tensors),
            "; ".join(broken) or f"{len(tensors)} tensors",
            "re-download or re-sync the drafter",
        ),
        *_vocab_findings(expected, config, tensors),
        *_norm_findings(expected, config, tensors),
        *_speculators_findings(expected, config),
        *_lineage_findings(expected, folder / LINEAGE_FILE),
    ]


def _architecture_finding(expected: Expected, archs: set[str]) -> CheckResult:
    found = ", ".join(sorted(archs)) or "none"
    if expected.decoder == "mla":
        ok = bool(archs & MLA_EAGLE3_ARCHITECTURES)
        fix = (
            "the registry says decoder: mla; this checkpoint is a Llama-layer EAGLE-3 drafter "
            "(set decoder: llama)"
            if archs & EAGLE3_ARCHITECTURES
            else "an MLA EAGLE-3 checkpoint declares Eagle3DeepseekV2ForCausalLM"
        )
        if ok and version_tuple(expected.vllm_version) < (0, 32):
            ok, fix = False, "serve it with an image whose vLLM is >= 0.32"
            found += f" (vLLM {expected.vllm_version} has no MLA EAGLE-3 model)"
        return CheckResult("architecture", ok, found, fix)
    fix = (
        "this is an MLA EAGLE-3 drafter: set decoder: mla in the registry"
        if archs & MLA_EAGLE3_ARCHITECTURES
        else "an EAGLE-3 checkpoint declares LlamaForCausalLMEagle3 (speculators writes it)"
    )
    return CheckResult("architecture", bool(archs & EAGLE3_ARCHITECTURES), found, fix)


def _mla_findings(expected: Expected, config: dict[str, Any]) -> list[CheckResult]:
    """An MLA drafter's attention shapes, and whether this vLLM will run them as MLA."""
    if expected.decoder != "mla":
        return []
    shapes = {key: config.get(key) for key in MLA_KEYS}
    missing = [k for k, v in shapes.items() if not isinstance(v, int) or v <= 0]
    heads = config.get("num_attention_heads")
    described = ", ".join(f"{k} {v}" for k, v in shapes.items()) + f", {heads} heads"
    model_type = str(config.get("model_type") or "none")
    detected = model_type in MLA_DRAFTER_MODEL_TYPES or (
        model_type == "kimi_k2" and KIMI_MLA_PATCH in expected.image_patches
    )
    return [
        CheckResult(
            "attention shapes",
            not missing and isinstance(heads, int) and heads > 0,
            described if not missing else f"{described}: {', '.join(missing)} missing or not > 0",
            "an MLA drafter's config.json sets kv_lora_rank, qk_nope_head_dim, "
            "qk_rope_head_dim, v_head_dim and num_attention_heads",
        ),
        CheckResult(
            "MLA detected",
            detected,
            f"model_type {model_type}"
            + ("" if detected else ": vLLM would run this latent attention as ordinary attention"),
            f"serve with an image carrying {KIMI_MLA_PATCH} (vllm-project/vllm#45764), or "
            'set "model_type": "deepseek_v3" in config.json',
        ),
    ]


def _eagle_config(config: dict[str, Any]) -> dict[str, Any]:
    nested = config.get("eagle_config")
    return nested if isinstance(nested, dict) else {}


def ids_vllm_reads(config: dict[str, Any], vllm_version: str) -> list[int] | None:
    """The aux layer ids the given vLLM's GPU model runner takes from a drafter's config.json (None:
    the target model's default). Read in each version's own code: vLLM 0.16-0.31
    (v1/worker/gpu_model_runner.py) read only the top-level key; 0.32's V1 runner also falls back
    to `eagle_config.eagle_aux_hidden_state_layer_ids`, but its Model Runner V2, the default on
    GPUs (v1/worker/gpu/spec_decode/eagle/eagle3_utils.py), falls back to `eagle_config.layer_ids`
    instead. Only the top-level key means the same thing to every runner."""
    top = config.get("eagle_aux_hidden_state_layer_ids")
    if top:
        return list(top)
    eagle = _eagle_config(config)
    if version_tuple(vllm_version) >= (0, 32) and eagle.get("layer_ids"):
        return list(eagle["layer_ids"])  # Model Runner V2, the GPU default
    return None


def _layer_finding(expected: Expected, config: dict[str, Any]) -> CheckResult:
    wanted, layers = expected.vllm_layer_ids, expected.num_hidden_layers
    version = expected.vllm_version
    default = [2, layers // 2, layers - 3]
    written = config.get("eagle_aux_hidden_state_layer_ids")
    eagle = _eagle_config(config)
    nested = {
        k: eagle[k] for k in ("eagle_aux_hidden_state_layer_ids", "layer_ids") if eagle.get(k)
    }
    if written:
        ok = list(written) == wanted
        detail = f"config.json says {list(written)}; trained at {wanted} in vLLM's convention"
    elif nested and version_tuple(version) >= (0, 32):
        # V1 reads eagle_config.eagle_aux_hidden_state_layer_ids, Model Runner V2 (the GPU default)
        # eagle_config.layer_ids: which ids are used would depend on the runner vLLM picks.
        ok = False
        found = ", ".join(f"eagle_config.{k} {list(v)}" for k, v in nested.items())
        detail = (
            f"config.json has no top-level eagle_aux_hidden_state_layer_ids, only {found}; vLLM "
            f"{version}'s V1 runner and Model Runner V2 (its GPU default) read different keys "
            f"there and fall back to {default}; trained at {wanted}"
        )
    else:
        ok = wanted == default
        detail = (
            f"config.json has no eagle_aux_hidden_state_layer_ids: vLLM uses its default {default}"
            f" (vLLM {version})"
        )
    if expected.convention == "sglang":
        detail += f" (record: {expected.layer_ids} in the sglang convention = {wanted} in vLLM's)"
    fix = f'set "eagle_aux_hidden_state_layer_ids": {wanted} at the top level of config.json'
    in_range = all(1 <= k <= layers - 1 for k in wanted)
    return CheckResult("layer ids", ok and in_range, detail, fix)


def _vocab_findings(
    expected: Expected, config: dict[str, Any], tensors: dict[str, Any]
) -> list[CheckResult]:
    draft_vocab = config.get("draft_vocab_size")
    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    shapes_ok = (
        d2t is not None
        and t2d is not None
        and d2t["shape"] == [draft_vocab]
        and t2d["shape"] == [expected.vocab_size]
    )
    full = draft_vocab == expected.vocab_size and d2t is None
    maps = f"d2t {d2t['shape'] if d2t else 'missing'}, t2d {t2d['shape'] if t2d else 'missing'}"
    return [
        CheckResult(
            "draft vocab size",
            draft_vocab == expected.draft_vocab_size,
            f"config.json {draft_vocab}, registry {expected.draft_vocab_size}",
            "make the registry record match the checkpoint",
        ),
        CheckResult(
            "vocab maps",
            shapes_ok or full,
            # vLLM builds no draft-to-target map when the draft vocabulary is the target's.
            f"the target's whole vocabulary ({draft_vocab}): no maps needed"
            if full
            else f"{maps} (want [{draft_vocab}] and [{expected.vocab_size}])",
            "rebuild the maps for this target with `kimideploy run vocab`",
        ),
    ]


def _norm_findings(
    expected: Expected, config: dict[str, Any], tensors: dict[str, Any]
) -> list[CheckResult]:
    """EAGLE-3.1's norms: a flag the engine does not read, or a flag and the weights that disagree,
    serves a drafter without a norm it was trained with. Nothing fails at load: vLLM 0.32's loader
    drops input_norm weights when norm_before_fc is off and leaves fc_norm at its initial ones when
    the weights lack it, and no vLLM reports norm_output at all; acceptance falls towards 1.0."""
    eagle = _eagle_config(config)
    flags = {flag: bool(eagle.get(flag, config.get(flag, False))) for flag in EAGLE31_NORMS}
    held = {
        flag: sorted(name for name in tensors if prefix and prefix in name)
        for flag, prefix in EAGLE31_NORMS.items()
    }
    if not any(flags.values()) and not any(held.values()):
        return []
    set_flags = [flag for flag, on in flags.items() if on]
    described = ", ".join(set_flags) or "no EAGLE-3.1 flag"
    if version_tuple(expected.vllm_version) < EAGLE31_FIRST_VLLM and set_flags:
        return [
            CheckResult(
                "EAGLE-3.1 norms",
                False,
                f"config.json sets {described}; vLLM {expected.vllm_version} reads none of "
                f"{', '.join(EAGLE31_NORMS)} and would serve the drafter without those norms",
                "serve it with an image whose vLLM is >= 0.32 (its llama_eagle3 and "
                "deepseek_eagle3 read all three)",
            )
        ]
    mismatched = [
        _flag_against_weights(flag, flags[flag], prefix, len(held[flag]))
        for flag, prefix in EAGLE31_NORMS.items()
        if prefix is not None and flags[flag] != bool(held[flag])
    ]
    return [
        CheckResult(
            "EAGLE-3.1 norms",
            not mismatched,
            "; ".join(mismatched) if mismatched else f"{described} (vLLM {expected.vllm_version})",
            "config.json's flags must match the weights the drafter was trained with: set the "
            "flag where its tensors are present, or take a checkpoint that has them",
        )
    ]


def _flag_against_weights(flag: str, on: bool, prefix: str, tensors: int) -> str:
    weights = f"{tensors} {prefix}* tensors" if tensors else f"no {prefix}* tensor"
    return f"{flag} {'on' if on else 'off'} but {weights}"


def _speculators_findings(expected: Expected, config: dict[str, Any]) -> list[CheckResult]:
    """In the speculators format the checkpoint names the tokens it was trained for; a mismatch
    means the registry's k is not what was trained."""
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or []
    if not methods:
        return []
    trained_k = methods[0].get("speculative_tokens")
    return [
        CheckResult(
            "trained tokens",
            trained_k == expected.num_speculative_tokens,
            f"trained for {trained_k} speculative tokens, registry serves "
            f"{expected.num_speculative_tokens}",
            f"set num_speculative_tokens to {trained_k} unless measured acceptance says otherwise",
            blocking=False,
        )
    ]


def _lineage_findings(expected: Expected, path: Path) -> list[CheckResult]:
    if not path.is_file():
        return [
            CheckResult(
                "lineage file",
                False,
                f"no {path.name}: nothing says what this drafter was trained on",
                "drafters trained by `kimideploy run train` carry one; for others, check the "
                "registry's lineage by hand",
                blocking=False,
            )
        ]
    try:
        lineage = read_json_object(path)
    except UnreadableFileError as exc:
        return [
            CheckResult(
                "lineage file",
                False,
                str(exc),
                "copy the drafter again from where it was trained (the file is written by "
                "`kimideploy run train`)",
            )
        ]
    trained = (lineage.get("trained_for"), lineage.get("trained_for_revision"))
    accuracy = (lineage.get("metrics") or {}).get("accuracy_per_position")
    short = expected.target_revision[:12]
    return [
        CheckResult(
            "lineage: target",
            trained == (expected.target_repo, expected.target_revision),
            f"trained on {trained[0]}@{str(trained[1])[:12]}, serving "
            f"{expected.target_repo}@{short} (run {lineage.get('run_id')})",
            f"train this drafter on {expected.target_repo}@{short}'s own hidden states",
        ),
        CheckResult(
            "lineage: layers",
            lineage.get("eagle_aux_hidden_state_layer_ids") == expected.vllm_layer_ids,
            f"trained on vLLM layers {lineage.get('eagle_aux_hidden_state_layer_ids')}, "
            f"registry {expected.vllm_layer_ids}",
            "make the registry's aux_layer_ids match the layers the drafter was trained on",
        ),
        CheckResult(
            "lineage: accuracy",
            bool(accuracy),
            f"training per-position accuracy {accuracy}" if accuracy else "no training metrics",
            "copy the measured per-position acceptance into the registry's `acceptance`",
            blocking=False,
        ),
        _held_out_finding(lineage),
    ]


def _held_out_finding(lineage: dict[str, Any]) -> CheckResult:
    judged = lineage.get("held_out")
    if not isinstance(judged, dict):
        judged = {}
    lengths = judged.get("mean_acceptance_length")
    selected = lineage.get("selected_checkpoint") or {}
    if lengths is None or lengths == {}:
        return CheckResult(
            "lineage: held-out",
            False,
            "no held-out judgement: trained without held-out samples (train.held_out_fraction "
            "0) or by an older kimideploy; its last checkpoint was written",
            "train again with train.held_out_fraction > 0 to know its acceptance before serving",
            blocking=False,
        )
    try:
        ordered = sorted((int(k), float(v)) for k, v in lengths.items())
    except (AttributeError, TypeError, ValueError):
        ordered = []
    by_k = judged.get("by_k") or {}
    if not ordered or not isinstance(selected, dict) or not isinstance(by_k, dict):
        return CheckResult(
            "lineage: held-out",
            False,
            f"held_out has the wrong shape (mean_acceptance_length {str(lengths)[:60]}, by_k "
            f"{str(by_k)[:40]}): "
            "not what training writes",
            "restore the lineage training wrote, or train again",
        )
    shown = ", ".join(f"k={k} {lengths.get(str(k), lengths.get(k))}" for k, _ in ordered)
    return CheckResult(
        "lineage: held-out",
        True,
        f"held-out mean acceptance length {shown} on {judged.get('samples')} samples never "
        f"trained on; written: {selected.get('reason', 'step ' + str(selected.get('step')))}",
        "",
        blocking=False,
    )


def read_lineage(path: Path) -> dict[str, Any] | None:
    """The lineage file as an object, or None when there is none or it cannot be read (the
    folder's checks report why)."""
    try:
        return read_json_object(path)
    except UnreadableFileError:
        return None

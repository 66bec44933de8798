"""`kimideploy drafter check`: will vLLM load this drafter, for this target, at these layers?

Offline and in seconds, before a 25-minute load: the drafter's config.json and the safetensors
headers of its weights (read without torch) against the registry record and the target model.
Every problem says how to fix it. The team's 15% / 0.66x drafter would have failed three of these.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimideploy.config.drafters import Drafter, to_vllm_layer_ids
from kimideploy.config.project import Project
from kimideploy.plan import speedup
from kimideploy.services.data import safetensors_problem

EAGLE3_ARCHITECTURES = {
    "LlamaForCausalLMEagle3",
    "Eagle3LlamaForCausalLM",
    "Eagle3Speculator",
    "Eagle3DraftModel",  # the speculators format (speculators_model_type eagle3), which vLLM reads
}
LINEAGE_FILE = "kimideploy-lineage.json"
"""Written by the train workload next to config.json."""


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str
    fix: str = ""
    blocking: bool = True

    @property
    def status(self) -> str:
        return "pass" if self.ok else ("FAIL" if self.blocking else "warn")


def _headers(folder: Path) -> tuple[dict[str, Any], list[str]]:
    """Tensor name -> {dtype, shape} across the folder's safetensors files; and broken files."""
    import struct

    tensors: dict[str, Any] = {}
    broken = []
    for path in sorted(folder.glob("*.safetensors")):
        problem, _ = safetensors_problem(path)
        if problem:
            broken.append(f"{path.name}: {problem}")
            continue
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        tensors.update({k: v for k, v in header.items() if k != "__metadata__"})
    return tensors, broken


def record_findings(project: Project, name: str, drafter: Drafter) -> list[Finding]:
    """What the registry alone says (no files needed)."""
    model = project.model
    findings = []
    trained_for = drafter.lineage.trained_for
    same_model = trained_for == model.repo
    findings.append(
        Finding(
            "trained for this target",
            same_model,
            f"lineage: {trained_for}",
            f"train a drafter on {model.repo}'s own outputs (kimideploy run train)",
            blocking=False,
        )
    )
    revision = drafter.lineage.trained_for_revision
    if same_model and revision and revision != model.revision:
        findings.append(
            Finding(
                "target revision",
                False,
                f"trained on {revision[:12]}, serving {model.short_revision}",
                "retrain or confirm the revisions share weights",
                blocking=False,
            )
        )
    findings += _token_findings(project, drafter)
    return findings


def _token_findings(project: Project, drafter: Drafter) -> list[Finding]:
    k = drafter.num_speculative_tokens
    cluster = project.clusters[project.default_cluster]
    if not drafter.acceptance:
        return [
            Finding(
                "speculative tokens",
                k <= 3,
                f"{k} tokens, no measured acceptance",
                "published Kimi EAGLE-3 recipes use 3; measure before going higher",
                blocking=False,
            )
        ]
    cost = cluster.step_cost_per_token
    best_k = max(range(1, 17), key=lambda n: speedup.estimate(drafter.acceptance, n, cost).speedup)
    chosen = speedup.estimate(drafter.acceptance, k, cost)
    return [
        Finding(
            "speculative tokens",
            k == best_k
            or abs(chosen.speedup - speedup.estimate(drafter.acceptance, best_k, cost).speedup)
            < 0.01,
            f"k={k} predicts {chosen.describe()}",
            f"set num_speculative_tokens to {best_k}",
            blocking=False,
        ),
        Finding(
            "predicted speedup",
            chosen.speedup > 1,
            chosen.describe(),
            "do not serve it speculatively; improve the drafter or the verify path",
        ),
    ]


def folder_findings(project: Project, drafter: Drafter, folder: Path) -> list[Finding]:
    """config.json and weights against the record and the target."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        return [
            Finding(
                "config.json",
                False,
                f"{config_file} is missing",
                "point source at a drafter checkpoint",
            )
        ]
    config = json.loads(config_file.read_text())
    model = project.model
    findings = []
    archs = set(config.get("architectures") or [])
    findings.append(
        Finding(
            "architecture",
            bool(archs & EAGLE3_ARCHITECTURES),
            ", ".join(sorted(archs)) or "none",
            "an EAGLE-3 checkpoint declares LlamaForCausalLMEagle3 (speculators writes it)",
        )
    )
    layer_config = config.get("transformer_layer_config") or {}
    hidden = (
        config.get("target_hidden_size")
        or config.get("hidden_size")
        or layer_config.get("hidden_size")
    )
    findings.append(
        Finding(
            "hidden size",
            hidden == model.hidden_size,
            f"{hidden} (target {model.hidden_size})",
            "this drafter was built for another target; train one for this model",
        )
    )
    findings += _layer_findings(model.num_hidden_layers, drafter, config)
    tensors, broken = _headers(folder)
    findings.append(
        Finding(
            "weights readable",
            not broken and bool(tensors),
            "; ".join(broken) or f"{len(tensors)} tensors",
            "re-download or re-sync the drafter",
        )
    )
    findings += _vocab_findings(model.vocab_size, drafter, config, tensors)
    findings += _speculators_findings(drafter, config)
    findings += _lineage_findings(project, drafter, folder / LINEAGE_FILE)
    return findings


def _speculators_findings(drafter: Drafter, config: dict[str, Any]) -> list[Finding]:
    """In the speculators format, vLLM takes num_speculative_tokens from the checkpoint unless
    the serve flags say otherwise; a mismatch means the registry's k is not what was trained."""
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or []
    if not methods:
        return []
    trained_k = methods[0].get("speculative_tokens")
    return [
        Finding(
            "trained tokens",
            trained_k == drafter.num_speculative_tokens,
            f"trained for {trained_k} speculative tokens, registry serves "
            f"{drafter.num_speculative_tokens}",
            f"set num_speculative_tokens to {trained_k} unless measured acceptance says otherwise",
            blocking=False,
        )
    ]


def _lineage_findings(project: Project, drafter: Drafter, path: Path) -> list[Finding]:
    if not path.is_file():
        return [
            Finding(
                "lineage file",
                False,
                f"no {path.name}: nothing says what this drafter was trained on",
                "drafters trained by `kimideploy run train` carry one; for others, check the "
                "registry's lineage by hand",
                blocking=False,
            )
        ]
    lineage = json.loads(path.read_text())
    model = project.model
    trained = (lineage.get("trained_for"), lineage.get("trained_for_revision"))
    wanted_ids = to_vllm_layer_ids(drafter.aux_layer_ids, drafter.layer_id_convention)
    metrics = lineage.get("metrics") or {}
    accuracy = metrics.get("accuracy_per_position")
    return [
        Finding(
            "lineage: target",
            trained == (model.repo, model.revision),
            f"trained on {trained[0]}@{str(trained[1])[:12]}, serving "
            f"{model.repo}@{model.short_revision} (run {lineage.get('run_id')})",
            f"train this drafter on {model.repo}@{model.short_revision}'s own hidden states",
        ),
        Finding(
            "lineage: layers",
            lineage.get("eagle_aux_hidden_state_layer_ids") == wanted_ids,
            f"trained on vLLM layers {lineage.get('eagle_aux_hidden_state_layer_ids')}, "
            f"registry {wanted_ids}",
            "make the registry's aux_layer_ids match the layers the drafter was trained on",
        ),
        Finding(
            "lineage: accuracy",
            bool(accuracy),
            f"training per-position accuracy {accuracy}" if accuracy else "no training metrics",
            "copy the measured per-position acceptance into the registry's `acceptance`",
            blocking=False,
        ),
    ]


def _layer_findings(layers: int, drafter: Drafter, config: dict[str, Any]) -> list[Finding]:
    wanted = to_vllm_layer_ids(drafter.aux_layer_ids, drafter.layer_id_convention)
    written = config.get("eagle_aux_hidden_state_layer_ids")
    default = [2, layers // 2, layers - 3]
    if written is None:
        ok = wanted == default
        detail = (
            f"config.json has no eagle_aux_hidden_state_layer_ids: vLLM uses its default {default}"
        )
    else:
        ok = list(written) == wanted
        detail = f"config.json says {list(written)}; trained at {wanted} in vLLM's convention"
    if drafter.layer_id_convention == "sglang":
        detail += (
            f" (record: {drafter.aux_layer_ids} in the sglang convention = {wanted} in vLLM's)"
        )
    fix = f'set "eagle_aux_hidden_state_layer_ids": {wanted} at the top level of config.json'
    in_range = all(1 <= k <= layers - 1 for k in wanted)
    return [Finding("layer ids", ok and in_range, detail, fix)]


def _vocab_findings(
    vocab: int, drafter: Drafter, config: dict[str, Any], tensors: dict[str, Any]
) -> list[Finding]:
    draft_vocab = config.get("draft_vocab_size")
    findings = [
        Finding(
            "draft vocab size",
            draft_vocab == drafter.draft_vocab_size,
            f"config.json {draft_vocab}, registry {drafter.draft_vocab_size}",
            "make the registry record match the checkpoint",
        )
    ]
    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    shapes_ok = (
        d2t is not None
        and t2d is not None
        and d2t["shape"] == [draft_vocab]
        and t2d["shape"] == [vocab]
    )
    findings.append(
        Finding(
            "vocab maps",
            shapes_ok,
            f"d2t {d2t['shape'] if d2t else 'missing'}, t2d {t2d['shape'] if t2d else 'missing'} "
            f"(want [{draft_vocab}] and [{vocab}])",
            "rebuild the maps for this target with `kimideploy run vocab`",
        )
    )
    return findings


def check(project: Project, name: str, folder: Path | None) -> list[Finding]:
    drafter = project.drafters[name]
    findings = record_findings(project, name, drafter)
    if folder is not None:
        findings = folder_findings(project, drafter, folder) + findings
    return findings

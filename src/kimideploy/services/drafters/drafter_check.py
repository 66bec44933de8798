"""`kimideploy drafter check`: will vLLM load this drafter, for this target, at these layers?

Offline and in seconds, before a 25-minute load: the drafter's config.json and the safetensors
headers of its weights (read without torch) against the registry record and the target model.
Every problem says how to fix it. The team's 15% / 0.66x drafter would have failed three of these.
"""

from __future__ import annotations

from pathlib import Path

from kimideploy.config.drafters import Drafter, to_vllm_layer_ids
from kimideploy.config.project import Project, variant_mismatch
from kimideploy.formats.check_result import CheckResult
from kimideploy.formats.drafter_files import Expected
from kimideploy.formats.drafter_files import folder_findings as files_findings
from kimideploy.plan.calibration import CostModel, DefaultCost, drafter_speedup


def serving_vllm(project: Project, cluster: str | None) -> str:
    """The vLLM version of the image that would load the drafter on this cluster."""
    profile = project.clusters[cluster or project.default_cluster]
    return project.images[profile.images.serve].vllm or "0.32.0"


def expected_files(project: Project, drafter: Drafter, cluster: str | None = None) -> Expected:
    model = project.model_for(cluster or project.default_cluster)
    return Expected(
        target_repo=model.repo,
        target_revision=model.revision,
        hidden_size=model.hidden_size,
        vocab_size=model.vocab_size,
        num_hidden_layers=model.num_hidden_layers,
        layer_ids=list(drafter.aux_layer_ids),
        convention=drafter.layer_id_convention,
        vllm_layer_ids=to_vllm_layer_ids(drafter.aux_layer_ids, drafter.layer_id_convention),
        draft_vocab_size=drafter.draft_vocab_size,
        num_speculative_tokens=drafter.num_speculative_tokens,
        vllm_version=serving_vllm(project, cluster),
    )


def record_findings(
    project: Project,
    name: str,
    drafter: Drafter,
    cluster: str | None = None,
    costs: CostModel | None = None,
    concurrency: int = 1,
) -> list[CheckResult]:
    """What the registry alone says (no files needed)."""
    cluster_name = cluster or project.default_cluster
    model = project.model_for(cluster_name)
    findings = []
    trained_for = drafter.lineage.trained_for
    same_model = trained_for in project.model_repos()
    findings.append(
        CheckResult(
            "trained for this target",
            same_model,
            f"lineage: {trained_for}",
            f"train a drafter on {model.repo}'s own outputs (kimideploy run train)",
            blocking=False,
        )
    )
    mismatch = variant_mismatch(project, drafter, cluster_name)
    findings.append(
        CheckResult(
            "model variant",
            mismatch is None,
            mismatch or f"trained and served on {model.repo}",
            "measure it on this checkpoint (`kimideploy run bench`), or train on it",
            blocking=False,
        )
    )
    revision = drafter.lineage.trained_for_revision
    if same_model and mismatch is None and revision and revision != model.revision:
        findings.append(
            CheckResult(
                "target revision",
                False,
                f"trained on {revision[:12]}, serving {model.short_revision}",
                "retrain or confirm the revisions share weights",
                blocking=False,
            )
        )
    findings += _token_findings(project, drafter, cluster, costs, concurrency)
    return findings


def _token_findings(
    project: Project,
    drafter: Drafter,
    cluster_name: str | None,
    costs: CostModel | None,
    concurrency: int,
) -> list[CheckResult]:
    """k and the predicted speedup, from the measured step cost when `costs` is one."""
    k = drafter.num_speculative_tokens
    cluster = project.clusters[cluster_name or project.default_cluster]
    if not drafter.acceptance:
        return [
            CheckResult(
                "speculative tokens",
                k <= 3,
                f"{k} tokens, no measured acceptance",
                "published Kimi EAGLE-3 recipes use 3; measure before going higher",
                blocking=False,
            )
        ]
    costs = costs or DefaultCost(
        cluster.step_cost_per_token, cluster_name or project.default_cluster
    )
    at, source = concurrency, costs.source

    def predicted(n: int) -> float:
        return drafter_speedup(costs, list(drafter.acceptance), n, at)

    best_k = max(range(1, 17), key=predicted)
    chosen = predicted(k)
    verdict = "faster" if chosen > 1 else "SLOWER than no speculation"
    describe = f"{chosen:.2f}x ({verdict}) at c={at}; step cost: {source}"
    return [
        CheckResult(
            "speculative tokens",
            k == best_k or abs(chosen - predicted(best_k)) < 0.01,
            f"k={k} predicts {describe}",
            f"set num_speculative_tokens to {best_k}",
            blocking=False,
        ),
        CheckResult(
            "predicted speedup",
            chosen > 1,
            describe,
            "do not serve it speculatively; improve the drafter or the verify path",
        ),
    ]


def check(
    project: Project,
    name: str,
    folder: Path | None,
    cluster: str | None = None,
    costs: CostModel | None = None,
    concurrency: int = 1,
) -> list[CheckResult]:
    """Registry findings for serving on `cluster` (default: the default cluster), and the files'
    when a local copy is given, judged by the vLLM of that cluster's serve image."""
    drafter = project.drafters[name]
    findings = record_findings(project, name, drafter, cluster, costs, concurrency)
    if folder is not None:
        findings = files_findings(expected_files(project, drafter, cluster), folder) + findings
    return findings

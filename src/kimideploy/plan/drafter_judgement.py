"""Is this drafter worth serving on this cluster, from its registry record alone?

One judgement, made by the resolver for every speculative serve plan (with the cost model the plan
predicts with: the cluster's measured step cost when stored) and read by `up` (which refuses a
blocking failure), `render` (warnings) and `drafter check` (which adds the files' checks).
"""

from __future__ import annotations

from kimideploy.config.drafters import (
    Drafter,
    HeldOutAcceptance,
    ModelFreeMethod,
    SuffixMethod,
    to_vllm_layer_ids,
)
from kimideploy.config.images import SERVE_ROLE, Image
from kimideploy.config.project import Project, variant_mismatch
from kimideploy.formats.check_result import CheckResult
from kimideploy.formats.drafter_files import Expected
from kimideploy.plan.acceptance import Evidence, all_evidence
from kimideploy.plan.calibration import CostModel, drafter_speedup, speedup
from kimideploy.plan.inputs import drafter_path
from kimideploy.plan.step_cost import uncalibrated


def serving_image(project: Project, cluster: str | None = None) -> Image:
    """The image that would load the drafter on this cluster (its serve image)."""
    return project.images[project.clusters[project.cluster_name(cluster)].images.serve]


def serving_vllm(project: Project, cluster: str | None) -> str:
    """The vLLM version of the image that would load the drafter on this cluster."""
    profile = project.clusters[project.cluster_name(cluster)]
    return project.images[profile.images.serve].vllm or "0.32.0"


def expected_files(project: Project, drafter: Drafter, cluster: str | None = None) -> Expected:
    model = project.model_for(project.cluster_name(cluster))
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
        decoder=drafter.decoder,
        image_patches=tuple(serving_image(project, cluster).patches),
    )


def registry_findings(
    project: Project,
    name: str,
    drafter: Drafter,
    cluster: str | None = None,
    *,
    costs: CostModel | None = None,
    concurrency: int = 1,
    held_out: HeldOutAcceptance | None = None,
) -> list[CheckResult]:
    """What the registry alone says about serving the drafter on `cluster` (no files needed),
    with the step cost `costs` measures there (else the cluster's constant). `held_out` is the
    drafter's own lineage file's judgement, used when the registry records none."""
    findings = lineage_findings(project, drafter, cluster)
    findings += _token_findings(
        project, drafter, cluster, costs, concurrency=concurrency, held_out=held_out
    )
    return findings + _record_findings(name, drafter)


def method_findings(
    project: Project,
    name: str,
    method: ModelFreeMethod,
    cluster: str | None = None,
    *,
    costs: CostModel | None = None,
    concurrency: int = 1,
) -> list[CheckResult]:
    """A model-free method on `cluster`: what its serve image must carry, and the speedup its
    measured acceptance predicts (none is known before it has served: it has no training)."""
    cluster_name = project.cluster_name(cluster)
    profile = project.clusters[cluster_name]
    image_name = profile.images.serve
    image = project.images[image_name]
    if isinstance(method, SuffixMethod):
        carried = image.arctic_inference is not None
        having = [
            n for n, i in project.images.items() if i.role == SERVE_ROLE and i.arctic_inference
        ]
        image_finding = CheckResult(
            "serve image",
            carried,
            f"{image_name} carries Arctic Inference {image.arctic_inference}"
            if carried
            else f"{image_name} has no Arctic Inference: vLLM refuses suffix decoding",
            f"set clusters.{cluster_name}.images.serve: {' or '.join(having)}"
            if having
            else "set images.<name>.arctic_inference on a serve image and rebuild it",
        )
    else:
        image_finding = CheckResult(
            "serve image",
            image.vllm is not None,
            f"{image_name}: vLLM {image.vllm}",
            "serve with an image that has vLLM",
        )
    k = method.num_speculative_tokens
    found = all_evidence(method, k)
    if not found:
        costs = costs or uncalibrated(project, cluster_name)
        even = costs.cost(k, concurrency)
        return [
            image_finding,
            CheckResult(
                "acceptance",
                True,
                f"model-free: known only once served; at k={k} it pays above mean acceptance "
                f"length {even:.2f} at c={concurrency} ({costs.source})"
                + (
                    " (suffix drafts vary up to k, so this bar is an upper bound)"
                    if isinstance(method, SuffixMethod)
                    else ""
                ),
                f"measure it: kimideploy run bench --drafters none,{name}",
                blocking=False,
            ),
        ]
    costs = costs or uncalibrated(project, cluster_name)
    shown = CheckResult("acceptance", True, f"{found[0].label()} at k={k}", "", blocking=False)
    return [image_finding, shown, *_speedup_findings(found[0], k, costs, concurrency)]


def lineage_findings(project: Project, drafter: Drafter, cluster: str | None) -> list[CheckResult]:
    """Whether the drafter was trained for the checkpoint this cluster serves (serving it, or
    fine-tuning from it, on another target wastes the run)."""
    cluster_name = project.cluster_name(cluster)
    model = project.model_for(cluster_name)
    findings = []
    trained_for = drafter.lineage.trained_for
    same_model = trained_for in project.model_repos()
    findings.append(
        CheckResult(
            "trained for this target",
            same_model,
            f"trained for {trained_for}"
            if same_model
            else f"trained for {trained_for}, not {model.repo}",
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
    return findings


def _record_findings(name: str, drafter: Drafter) -> list[CheckResult]:
    """What the record itself flags: ids a config.json must translate, a rejected status."""
    vllm_ids = to_vllm_layer_ids(drafter.aux_layer_ids, drafter.layer_id_convention)
    sglang = drafter.layer_id_convention != "vllm"
    return [
        CheckResult(
            "layer convention",
            not sglang,
            (
                f"ids {drafter.aux_layer_ids} are in the sglang convention; "
                f"{drafter_path(name, drafter)}/config.json must carry a top-level "
                f"eagle_aux_hidden_state_layer_ids of {vllm_ids}"
            )
            if sglang
            else f"ids {vllm_ids} in vLLM's convention",
            f"`kimideploy drafter check {name} --dir COPY` reads that config.json",
            blocking=False,
        ),
        CheckResult(
            "registry status",
            drafter.status != "rejected",
            f"is marked {drafter.status} in the registry",
            "serve another drafter, or measure it again (`kimideploy run bench`)",
            blocking=False,
        ),
    ]


def serving_warnings(findings: list[CheckResult], name: str) -> list[str]:
    """The failed findings as the plan's warnings (the same judgement `up` refuses on)."""
    return [
        f"drafter {name} {f.detail}" + (f"; {f.fix}" if f.fix else "") for f in findings if not f.ok
    ]


def _token_findings(
    project: Project,
    drafter: Drafter,
    cluster_name: str | None,
    costs: CostModel | None,
    *,
    concurrency: int,
    held_out: HeldOutAcceptance | None = None,
) -> list[CheckResult]:
    """k and the predicted speedup from the most trusted acceptance there is (measured, then
    held-out, then a published prior), each figure shown with its label. Measured and held-out
    acceptance below break-even block `up` (a prior does not: it was measured elsewhere)."""
    k = drafter.num_speculative_tokens
    found = all_evidence(drafter, k, held_out)
    if not found:
        return [
            CheckResult(
                "speculative tokens",
                k <= 3,
                f"drafts {k} tokens with no measured, held-out or published acceptance",
                "published Kimi EAGLE-3 recipes use 3; measure before going higher",
                blocking=False,
            )
        ]
    costs = costs or uncalibrated(project, project.cluster_name(cluster_name))
    shown = CheckResult(
        "acceptance",
        True,
        "; ".join(e.label() for e in found) + f" at k={k}",
        "",
        blocking=False,
    )
    return [shown, *_speedup_findings(found[0], k, costs, concurrency)]


def _speedup_findings(best: Evidence, k: int, costs: CostModel, at: int) -> list[CheckResult]:
    even = costs.cost(k, at)
    length = best.length
    rates = list(best.per_position or ())

    def predicted(n: int) -> float:
        """At the drafter's own k its length as measured; other k from per-position rates."""
        if n == k or not rates:
            return speedup(costs, k, length, at)
        return drafter_speedup(costs, rates, n, at)

    best_k = max(range(1, 17), key=predicted) if rates else k
    chosen = predicted(k)
    verdict = "faster" if chosen > 1 else "SLOWER than no speculation"
    describe = (
        f"{chosen:.2f}x ({verdict}) at c={at}: {best.source} mean acceptance length "
        f"{length:.2f} at k={k}, break-even {even:.2f}; step cost: {costs.source}"
    )
    findings = []
    if best.per_position:
        findings.append(
            CheckResult(
                "speculative tokens",
                k == best_k or abs(chosen - predicted(best_k)) < 0.01,
                f"k={k} predicts {chosen:.2f}x at c={at}; k={best_k} predicts "
                f"{predicted(best_k):.2f}x ({best.source} acceptance)",
                f"set num_speculative_tokens to {best_k}",
                blocking=False,
            )
        )
    fix = (
        "do not serve it speculatively; improve the drafter or the verify path"
        if best.source == "measured"
        else "train it further or on more data (its held-out length is below break-even), "
        "or pass --force to measure it anyway"
        if best.source == "held-out"
        else "measure it here (`kimideploy run bench`) before relying on the prior"
    )
    if best.interval is not None and best.source == "held-out":
        findings.append(_interval_finding(best, k, even, describe))
        return findings
    findings.append(
        CheckResult(
            "predicted speedup", chosen > 1, describe, fix, blocking=best.source != "published"
        )
    )
    return findings


def _interval_finding(best: Evidence, k: int, even: float, describe: str) -> CheckResult:
    """Held-out figures with their interval: refuse only when even its upper bound is below
    break-even; when the interval straddles break-even, say serving may not pay (a warning)."""
    assert best.interval is not None
    low, high = best.interval
    where = f"its 95% interval {low:.2f}-{high:.2f} at k={k} against break-even {even:.2f}"
    if high < even:
        return CheckResult(
            "predicted speedup",
            False,
            f"{describe}; {where}: below break-even however the held-out turns are sampled",
            "train it further or on more data, or pass --force to measure it anyway",
        )
    if low < even:
        return CheckResult(
            "predicted speedup",
            False,
            f"{describe}; {where}: it may not pay",
            "measure it where it will serve (`kimideploy run bench`, or `drafter check --replay` "
            "on your prompts) before relying on it",
            blocking=False,
        )
    return CheckResult("predicted speedup", True, f"{describe}; {where}", "", blocking=False)

"""resolve(project, request) -> Plan: the one place where every deployment decision is made."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kimideploy.config.drafters import NO_DRAFTER, to_vllm_layer_ids
from kimideploy.config.loading import LoadedProject
from kimideploy.config.project import Project
from kimideploy.config.specs import WorkloadSpec
from kimideploy.config.workloads import GPU_WORKLOADS, WORKLOAD_NAMES
from kimideploy.errors import UsageError
from kimideploy.plan import jobs, online, serve, speedup
from kimideploy.plan.claims import HiddenStateEstimate, claim_objects, estimate_hidden_states
from kimideploy.plan.context import Context, deterministic_run_id, drafter_path
from kimideploy.plan.model import Plan, PlanRequest
from kimideploy.plan.overrides import apply_overrides
from kimideploy.plan.storage import human_bytes

PIPELINE_WORKLOADS = ("datagen", "extract", "vocab", "train")
"""These build the train drafter's data, so they default to (and need) a drafter record."""


def resolve(loaded: LoadedProject, request: PlanRequest) -> Plan:
    """Turn the config and the user's request into a frozen Plan, or explain what is wrong."""
    if request.workload not in WORKLOAD_NAMES:
        raise UsageError(
            f"unknown workload '{request.workload}' (valid: {', '.join(WORKLOAD_NAMES)})"
        )
    ctx = _context(loaded, request)
    estimate = estimate_hidden_states(ctx.project, ctx)
    spec = _spec(ctx, estimate)
    spec_json = json.dumps(spec.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    spec_sha256 = hashlib.sha256(spec_json.encode()).hexdigest()
    if ctx.workload == "serve":
        objects = serve.serve_objects(ctx, spec_json, spec_sha256)
    else:
        objects = jobs.job_objects(ctx, spec, spec_json)
    return Plan(
        workload=ctx.workload,
        cluster=ctx.cluster_name,
        drafter=ctx.drafter_name,
        namespace=ctx.namespace,
        release=ctx.release,
        run_id=ctx.run_id,
        config_sha256=ctx.config_sha256,
        kubernetes_version=ctx.cluster.kubernetes_version,
        image=ctx.image.reference,
        objects=(*claim_objects(ctx, estimate), *objects),
        facts=tuple(_facts(ctx, estimate)),
        warnings=tuple(_warnings(ctx, estimate)),
        inputs=_inputs(ctx, request),
    )


def _context(loaded: LoadedProject, request: PlanRequest) -> Context:
    project = loaded.project
    cluster_name = request.cluster or project.default_cluster
    if cluster_name not in project.clusters:
        raise UsageError(
            f"--cluster: unknown cluster '{cluster_name}' "
            f"(valid: {', '.join(sorted(project.clusters))})",
            hint=f"clusters are defined under 'clusters:' in {loaded.path.name}",
        )
    project = apply_overrides(project, cluster_name, request.overrides)
    cluster = project.clusters[cluster_name]
    drafter_name = _drafter_name(project, cluster_name, request)
    image_name = getattr(cluster.images, request.workload)
    run_id = None
    if request.workload != "serve":
        run_id = request.run_id or deterministic_run_id(
            loaded.sha256, request.workload, cluster_name, drafter_name, request.overrides
        )
    return Context(
        project=project,
        config_sha256=loaded.sha256,
        workload=request.workload,
        cluster_name=cluster_name,
        cluster=cluster,
        drafter_name=drafter_name,
        drafter=project.drafters.get(drafter_name),
        image_name=image_name,
        image=project.images[image_name],
        run_id=run_id,
        overrides=request.overrides,
        namespace_override=request.namespace,
        monitoring_crd=request.monitoring_crd,
    )


def _drafter_name(project: Project, cluster: str, request: PlanRequest) -> str:
    """serve and bench default to no drafter; the data pipeline defaults to the train drafter."""
    pipeline = request.workload in PIPELINE_WORKLOADS
    default = project.clusters[cluster].workloads.train.drafter if pipeline else NO_DRAFTER
    name = request.drafter or default
    valid = [NO_DRAFTER, *sorted(project.drafters)]
    if name != NO_DRAFTER and name not in project.drafters:
        raise UsageError(
            f"--drafter: unknown drafter '{name}' (valid: {', '.join(valid)})",
            hint="`kimideploy drafter list` shows the registry",
        )
    if pipeline and name == NO_DRAFTER:
        raise UsageError(
            f"--drafter none: {request.workload} builds data for a drafter and needs its layer ids",
            hint=f"pass one of {', '.join(sorted(project.drafters))}",
        )
    return name


def _spec(ctx: Context, estimate: HiddenStateEstimate) -> WorkloadSpec:
    run_id = ctx.run_id or "serve"
    builders: dict[str, Any] = {
        "serve": lambda: serve.serve_spec(ctx),
        "datagen": lambda: jobs.datagen_spec(ctx, run_id),
        "extract": lambda: jobs.extract_spec(ctx, run_id, estimate),
        "vocab": lambda: jobs.vocab_spec(ctx, run_id),
        "train": lambda: jobs.train_spec(ctx, run_id),
        "bench": lambda: jobs.bench_spec(ctx, run_id),
    }
    spec: WorkloadSpec = builders[ctx.workload]()
    return spec


def _facts(ctx: Context, estimate: HiddenStateEstimate) -> list[tuple[str, str]]:
    image = ctx.image
    contents = ", ".join(
        f"{k} {v}" for k, v in (("vLLM", image.vllm), ("speculators", image.speculators)) if v
    )
    facts = [
        ("namespace", ctx.namespace),
        ("image", f"{image.reference} ({ctx.image_name}{': ' + contents if contents else ''})"),
    ]
    if image.patches:
        facts.append(("patches", ", ".join(image.patches)))
    if ctx.workload in GPU_WORKLOADS:
        gpu = ctx.cluster.gpu
        facts.append(("GPUs", f"{gpu.per_node} x {gpu.product} ({gpu.arch}) per pod"))
    if ctx.workload == "serve":
        facts += _serve_facts(ctx)
    if online.is_online(ctx):
        scratch = ctx.cluster.workloads.train.online.scratch_size
        facts += [
            ("online", online.check(ctx).describe()),
            ("hidden states", f"computed per sample by the target server, never stored "
                              f"(pod-local scratch {scratch})"),
        ]  # fmt: skip
    elif ctx.workload in ("extract", "train", "datagen"):
        facts.append(("hidden states", estimate.describe()))
    datasets = _datasets_fact(ctx)
    if datasets:
        facts.append(("datasets", datasets))
    if ctx.run_id:
        facts.append(("run id", ctx.run_id))
    return facts


def _datasets_fact(ctx: Context) -> str:
    """Which dataset folders the run reads and writes: each is named by its fingerprint, so a
    changed input shows here as a new folder before anything runs."""
    dirs = jobs.data_dirs(ctx)
    reads_features = "conversations" if online.is_online(ctx) else "hidden_states"
    flow = {
        "datagen": ([], ["conversations"]),
        "extract": (["conversations"], ["hidden_states"]),
        "vocab": (["conversations"], ["vocab"]),
        "train": ([reads_features, "vocab"], []),
    }.get(ctx.workload)
    if flow is None:
        return ""
    reads, writes = flow
    parts = [f"reads {dirs[name]}" for name in reads] + [f"writes {dirs[name]}" for name in writes]
    return "; ".join(parts) + " (folders named by what makes them: `kimideploy data inspect`)"


def _pod_monitor_fact(ctx: Context) -> str:
    setting = ctx.cluster.workloads.serve.pod_monitor
    if serve.wants_pod_monitor(ctx):
        return f"PodMonitor rendered ({setting})"
    if setting == "auto" and ctx.monitoring_crd is None:
        return "auto: `up` adds a PodMonitor when the cluster serves monitoring.coreos.com/v1"
    return f"none ({setting})"


def _serve_facts(ctx: Context) -> list[tuple[str, str]]:
    serve_settings = ctx.cluster.workloads.serve
    _, strategy = serve.rollout_strategy(ctx)
    facts = [
        ("replicas", str(serve_settings.replicas)),
        ("tensor parallel", str(ctx.cluster.gpu.per_node)),
        ("rollout", strategy),
        ("startup budget", f"{serve_settings.startup_budget_s // 60} min (probe on /v1/models)"),
        ("pod monitor", _pod_monitor_fact(ctx)),
    ]
    spec = serve.speculative_config(ctx)
    if spec is None:
        return [*facts, ("speculative", "off (no drafter)")]
    drafter = ctx.drafter
    assert drafter is not None
    vllm_ids = to_vllm_layer_ids(drafter.aux_layer_ids, drafter.layer_id_convention)
    aux = f"{drafter.aux_layer_ids} ({drafter.layer_id_convention}) = {vllm_ids} in vLLM"
    facts += [("speculative", json.dumps(spec)), ("aux layers", aux)]
    cost, k = ctx.cluster.step_cost_per_token, drafter.num_speculative_tokens
    if drafter.acceptance:
        predicted = speedup.estimate(drafter.acceptance, k, cost).describe()
    else:
        even = speedup.break_even_rate(k, cost)
        predicted = (
            f"unknown: no measured acceptance; break-even acceptance rate {even:.1%} (k={k})"
        )
    gate = ctx.cluster.gate
    levels = ",".join(map(str, gate.concurrency or ctx.cluster.workloads.bench.concurrency))
    policy = (
        f"with --gate: keep only at >= {gate.min_speedup:.2f}x output tokens/s over no drafter "
        f"at c={levels}, else roll back to no drafter"
    )
    return [*facts, ("predicted", predicted), ("gate", policy)]


def _warnings(ctx: Context, estimate: HiddenStateEstimate) -> list[str]:
    warnings: list[str] = []
    drafter, project = ctx.drafter, ctx.project
    if drafter is not None and ctx.workload in ("serve", "train"):
        name = ctx.drafter_name
        if drafter.lineage.trained_for != project.model.repo:
            warnings.append(
                f"drafter {name} was trained for {drafter.lineage.trained_for}, "
                f"not {project.model.repo}"
            )
        if ctx.workload == "serve" and drafter.layer_id_convention != "vllm":
            vllm_ids = to_vllm_layer_ids(drafter.aux_layer_ids, drafter.layer_id_convention)
            warnings.append(
                f"drafter {name} ids {drafter.aux_layer_ids} are in the sglang convention; "
                f"{drafter_path(name, drafter)}/config.json must carry a top-level "
                f"eagle_aux_hidden_state_layer_ids of {vllm_ids} "
                f"(`kimideploy drafter check {name}`)"
            )
        if ctx.workload == "serve" and drafter.num_speculative_tokens > 3:
            warnings.append(
                f"drafter {name} drafts {drafter.num_speculative_tokens} tokens; published Kimi "
                "EAGLE-3 recipes use 3, and a weak drafter pays for every extra draft pass"
            )
        if ctx.workload == "serve" and drafter.status == "rejected":
            warnings.append(f"drafter {name} is marked rejected in the registry")
    stores = ctx.workload == "extract" or (ctx.workload == "train" and not online.is_online(ctx))
    if stores and estimate.claim_bytes < estimate.total_bytes:
        warnings.append(
            f"the hidden-state claim ({estimate.claim_size}) is smaller than the "
            f"{human_bytes(estimate.total_bytes)} extraction will write"
        )
    return warnings


def _inputs(ctx: Context, request: PlanRequest) -> dict[str, Any]:
    """What a release record stores to re-render or explain this plan later."""
    return {
        "workload": ctx.workload,
        "cluster": ctx.cluster_name,
        "drafter": ctx.drafter_name,
        "image": ctx.image.reference,
        "image_name": ctx.image_name,
        "overrides": list(request.overrides),
        "namespace": ctx.namespace,
        "config_sha256": ctx.config_sha256,
    }

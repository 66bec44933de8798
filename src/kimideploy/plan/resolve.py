"""resolve(project, request) -> Plan: the one place where every deployment decision is made."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import Any

from kimideploy.config.drafters import NO_DRAFTER, SuffixMethod, to_vllm_layer_ids
from kimideploy.config.images import SERVE_ROLE
from kimideploy.config.loading import LoadedProject
from kimideploy.config.project import Project
from kimideploy.config.specs import PullSpec, WorkloadSpec
from kimideploy.config.workload_names import WORKLOAD_NAMES
from kimideploy.errors import MethodNotServedError, UsageError
from kimideploy.formats.check_result import CheckResult
from kimideploy.formats.drafter_swap import SPECULATION_SWITCH_PATCH
from kimideploy.formats.extraction_engine import version_tuple
from kimideploy.plan import (
    acceptance,
    analysis,
    calibration,
    data_layout,
    estimates,
    gateway,
    jobs,
    memory,
    model_runner,
    node_probe,
    online,
    page_cache,
    publish,
    replay,
    serve,
    stack,
    weights,
)
from kimideploy.plan.asks import BenchAsk, PublishAsk, PullAsk, ServeAsk, SyntheticAcceptance
from kimideploy.plan.calibration import Calibration, CostModel, MeasuredCost
from kimideploy.plan.claims import HiddenStateEstimate, claim_objects, estimate_hidden_states
from kimideploy.plan.drafter_judgement import (
    lineage_findings,
    method_findings,
    registry_findings,
    serving_warnings,
)
from kimideploy.plan.inputs import (
    PlanInputs,
    deterministic_run_id,
    gate_threshold,
    gated_levels,
    is_speculative,
)
from kimideploy.plan.kinds import KINDS, WorkloadKind
from kimideploy.plan.model import (
    OFFLINE,
    ClusterAnswers,
    EngineStart,
    ObjectPlan,
    Plan,
    PlanRequest,
)
from kimideploy.plan.overrides import apply_overrides
from kimideploy.plan.storage import human_bytes


def resolve(loaded: LoadedProject, request: PlanRequest, answers: ClusterAnswers = OFFLINE) -> Plan:
    """Turn the config, the user's request and the cluster's answers into a frozen Plan, or
    explain what is wrong."""
    if request.workload not in WORKLOAD_NAMES:
        raise UsageError(
            f"unknown workload '{request.workload}' (valid: {', '.join(WORKLOAD_NAMES)})"
        )
    ctx = _plan_inputs(loaded, request, answers)
    estimate = estimate_hidden_states(ctx.project, ctx)
    spec = _spec(ctx, estimate)
    spec_json = json.dumps(spec.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    # Everything the spec ConfigMap holds: a changed NCCL topology rolls the serve pods too.
    spec_sha256 = hashlib.sha256(
        (spec_json + (ctx.cluster.network.nccl_topology or "")).encode()
    ).hexdigest()
    if ctx.kind.release:
        objects = [
            *serve.serve_objects(ctx, spec_json, spec_sha256),
            *gateway.routing_objects(ctx),
        ]
    else:
        objects = jobs.job_objects(ctx, spec, spec_json)
    stage = None if ctx.kind.release else estimates.estimate(ctx, ctx.rates)
    price = ctx.cluster.price_per_gpu_hour
    # Computed once: the facts, their values and the plan all show them.
    engines = memory.memory_plans(ctx)
    gitops = tuple(analysis.gitops_objects(ctx)) if ctx.kind.release else ()
    facts = _facts(ctx, estimate, engines, gitops)
    values = _fact_values(ctx, estimate, engines)
    if stage is not None:
        facts.append(("estimate", stage.line(price)))
    return Plan(
        workload=ctx.workload,
        project=ctx.project.name,
        cluster=ctx.cluster_name,
        drafter=ctx.drafter_name,
        namespace=ctx.namespace,
        release=ctx.release,
        run_id=ctx.run_id,
        config_sha256=ctx.config_sha256,
        kubernetes_version=ctx.cluster.kubernetes_version,
        image=ctx.image.reference,
        objects=(*claim_objects(ctx, estimate), *objects),
        spec=spec,
        drafter_findings=_drafter_findings(ctx),
        facts=tuple(facts),
        fact_values=values,
        warnings=tuple(_warnings(ctx, estimate)),
        inputs=_inputs(ctx, request),
        break_even=_break_even(ctx),
        gitops=gitops,
        preflight=tuple(
            p
            for p in (
                weights.probe(ctx),
                page_cache.local_copy_job(ctx),
                page_cache.warmer_job(ctx),
            )
            if p is not None
        ),
        gpu_probe=node_probe.allreduce_job(ctx) if ctx.kind.release else None,
        engine_start=_engine_start(ctx),
        stage_estimate=stage,
        price_per_gpu_hour=price,
        engine_start_estimate_s=estimates.engine_start_s(ctx, ctx.workload)[0],
        storage_probe=page_cache.storage_probe_job(ctx) if ctx.kind.release else None,
        measure_storage_first=ctx.kind.release and page_cache.needs_measurement(ctx),
    )


def _engine_start(ctx: PlanInputs) -> EngineStart | None:
    """Where a run's vLLM logs its start-up: online training's target server, or the main
    container of a run whose kind starts an engine (a serve release reports its own)."""
    if online.is_online(ctx):
        return EngineStart(online.SERVER_CONTAINER)
    if ctx.kind.engine is not None and not ctx.kind.release:
        return EngineStart()
    return None


def _break_even(ctx: PlanInputs) -> dict[str, Any]:
    k = ctx.speculative_tokens
    if not ctx.kind.release or k is None or ctx.synthetic_k is not None:
        return {}
    levels = gated_levels(ctx)
    costs = ctx.cost_model
    return {
        "source": _cost_source(ctx),
        "measured": isinstance(costs, MeasuredCost),
        "k": k,
        "rate": {str(c): round(calibration.break_even_rate(costs, k, c), 4) for c in levels},
        "length": {str(c): round(calibration.break_even_length(costs, k, c), 4) for c in levels},
    }


def plan_inputs(
    loaded: LoadedProject, request: PlanRequest, answers: ClusterAnswers = OFFLINE
) -> PlanInputs:
    """What the resolver decides from, for a plan's companions built outside it (the datasets
    upload Job of `data put`)."""
    return _plan_inputs(loaded, request, answers)


def _plan_inputs(
    loaded: LoadedProject, request: PlanRequest, answers: ClusterAnswers
) -> PlanInputs:
    project = loaded.project
    cluster_name = project.cluster_name(request.cluster)
    project = apply_overrides(project, cluster_name, request.overrides)
    cluster = project.clusters[cluster_name]
    kind = KINDS[request.workload]
    _check_ask(request, kind)
    drafter_name = _drafter_name(project, cluster_name, request, kind)
    image_name = _image_name(project, cluster_name, request, kind)
    run_id = None
    if not kind.release:
        run_id = request.run_id or deterministic_run_id(
            loaded.sha256, request.workload, cluster_name, drafter_name, request.overrides
        )
    ctx = PlanInputs(
        project=project,
        config_sha256=loaded.sha256,
        workload=request.workload,
        cluster_name=cluster_name,
        cluster=cluster,
        drafter_name=drafter_name,
        drafter=project.eagle_drafters.get(drafter_name),
        model_free=project.model_free_methods.get(drafter_name),
        image_name=image_name,
        image=project.images[image_name],
        run_id=run_id,
        overrides=request.overrides,
        namespace_override=answers.namespace,
        monitoring_crd=answers.monitoring_crd,
        storage_read_gbps=answers.storage_read_gbps,
        rates=answers.rates,
        ask=request.ask,
    )
    _check_method_on_image(ctx)
    _check_capacity(ctx)
    moe_refusal = serve.moe_backend_refusal(ctx) if ctx.kind.release else None
    if moe_refusal:
        raise UsageError(
            f"nothing was created: {moe_refusal}",
            hint="moe_backend: auto (vLLM picks Marlin there) or marlin",
        )
    refusal = gateway.canary_refusal(ctx)
    if refusal is not None:
        raise refusal
    if _synthetic(request) is not None:
        ctx = _with_synthetic(ctx, request)
    costs, note = _cost_model(ctx, answers.calibrations)
    return dataclasses.replace(ctx, costs=costs, costs_note=note)


def serve_cost_model(
    loaded: LoadedProject, cluster: str | None, calibrations: tuple[Any, ...]
) -> tuple[CostModel, str, int]:
    """The cost model serving on `cluster` predicts with, where it comes from, and the lowest
    gated concurrency (what `drafter check` predicts at)."""
    request = PlanRequest("serve", cluster, NO_DRAFTER)
    ctx = _plan_inputs(loaded, request, ClusterAnswers(calibrations=calibrations))
    levels = gated_levels(ctx)
    return ctx.cost_model, _cost_source(ctx), min(levels)


def _image_name(project: Project, cluster: str, request: PlanRequest, kind: WorkloadKind) -> str:
    asked = request.asked(ServeAsk).image
    if asked is None:
        images = project.clusters[cluster].images
        return next(str(name) for entry in kind.images if (name := getattr(images, entry)))
    serving = sorted(n for n, image in project.images.items() if image.role == SERVE_ROLE)
    if asked not in serving:
        raise UsageError(
            f"--image: '{asked}' is not a serve image of this project "
            f"(serve images: {', '.join(serving)})",
            hint="images are defined under 'images:' with role: serve",
        )
    return asked


def _synthetic(request: PlanRequest) -> SyntheticAcceptance | None:
    """`run calibrate`'s synthetic acceptance: asked of its serve revision and of its bench."""
    return request.ask.synthetic if isinstance(request.ask, ServeAsk | BenchAsk) else None


def _check_ask(request: PlanRequest, kind: WorkloadKind) -> None:
    if request.ask is not None and (kind.ask is None or not isinstance(request.ask, kind.ask)):
        raise TypeError(
            f"a {type(request.ask).__name__} is not what workload {kind.name} takes "
            f"({kind.ask.__name__ if kind.ask else 'no ask'})"
        )


def _serve_view(ctx: PlanInputs) -> PlanInputs:
    """The cluster's serve configuration seen from any plan (train asks what serving will cost)."""
    if ctx.kind.release:
        return ctx
    name = ctx.cluster.images.serve
    return dataclasses.replace(ctx, image_name=name, image=ctx.project.images[name])


def _cost_model(
    ctx: PlanInputs, calibrations: tuple[Calibration, ...]
) -> tuple[CostModel | None, str]:
    """The newest stored calibration measured on this serve configuration; else the default
    constant, with the reason the newest one of the cluster does not apply."""
    # Complete calibrations before partial ones (a new one being measured, or interrupted).
    mine = sorted(
        (c for c in calibrations if c.cluster == ctx.cluster_name),
        key=lambda c: (c.complete, c.measured_at),
    )
    if not mine:
        return None, ""
    view = _serve_view(ctx)
    image, fingerprint = view.image.reference, serve.config_fingerprint(view)
    for stored in reversed(mine):
        if calibration.unusable_because(stored, ctx.cluster_name, image, fingerprint) is None:
            return MeasuredCost(stored), ""
    return None, calibration.unusable_because(mine[-1], ctx.cluster_name, image, fingerprint) or ""


SYNTHETIC_MIN_VLLM = (0, 32)


MLA_DRAFTER_MIN_VLLM = (0, 32)
"""The first vLLM whose model registry maps Eagle3DeepseekV2ForCausalLM (MLA EAGLE-3 drafters)."""


def _check_capacity(ctx: PlanInputs) -> None:
    """What the cluster's nodes can never hold, refused before any cluster is contacted: the
    replicas would stay Pending (train.nodes is checked with the config)."""
    cluster, gpus = ctx.cluster, ctx.cluster.gpu.per_node
    where = f"cluster {ctx.cluster_name} has {cluster.nodes} node(s) of {gpus} GPUs"
    if ctx.kind.release:
        replicas = cluster.workloads.serve.replicas
        if replicas * gpus > cluster.total_gpus:
            raise UsageError(
                f"serve.replicas {replicas} needs {replicas * gpus} GPUs ({gpus} each); {where}",
                hint=f"at most serve.replicas={cluster.total_gpus // gpus} there, or raise "
                f"clusters.{ctx.cluster_name}.nodes if it has more",
            )


def _serve_image_hint(ctx: PlanInputs, having: list[str]) -> str:
    """The fix, in the option every command has: `up` takes no --image (a release serves its
    cluster's image); `run bench` and `run calibrate` do."""
    return (
        f"set clusters.{ctx.cluster_name}.images.serve: {' or '.join(having)} "
        "(`run bench` and `run calibrate` also take --image)"
    )


def _check_method_on_image(ctx: PlanInputs) -> None:
    """What the serve image must carry for the method named: refused here, not after a load."""
    if not ctx.kind.release:
        return
    images = ctx.project.images
    where = f"image {ctx.image_name} (serve on {ctx.cluster_name})"
    if isinstance(ctx.model_free, SuffixMethod) and ctx.image.arctic_inference is None:
        having = sorted(n for n, i in images.items() if i.role == SERVE_ROLE and i.arctic_inference)
        raise MethodNotServedError(
            f"--drafter {ctx.drafter_name}: suffix decoding needs Arctic Inference and {where} "
            "has none",
            hint=_serve_image_hint(ctx, having)
            if having
            else "set images.<name>.arctic_inference on a serve image and rebuild it",
        )
    drafter = ctx.drafter
    vllm = ctx.image.vllm
    too_old = vllm is None or version_tuple(vllm) < MLA_DRAFTER_MIN_VLLM
    if drafter is not None and drafter.decoder == "mla" and too_old:
        having = sorted(
            n
            for n, i in images.items()
            if i.role == SERVE_ROLE and i.vllm and version_tuple(i.vllm) >= MLA_DRAFTER_MIN_VLLM
        )
        raise MethodNotServedError(
            f"--drafter {ctx.drafter_name}: an MLA EAGLE-3 drafter needs vLLM >= 0.32 "
            f"(Eagle3DeepseekV2ForCausalLM); {where} has vLLM {vllm}",
            hint=_serve_image_hint(ctx, having)
            if having
            else "add a serve image with vLLM >= 0.32",
        )


def _with_synthetic(ctx: PlanInputs, request: PlanRequest) -> PlanInputs:
    """Checked here, before anything is created: a drafter, lengths vLLM accepts for k, and (on
    serve) an image whose vLLM has synthetic rejection sampling."""
    synthetic = _synthetic(request)
    assert synthetic is not None
    k = synthetic.num_speculative_tokens
    if ctx.drafter is None:
        raise UsageError(
            "calibration serves a drafter's draft passes; name one with --drafter",
            hint=f"any drafter of the target's shape: {', '.join(sorted(ctx.project.drafters))}",
        )
    if not 1 <= k <= 16 or not synthetic.acceptance_lengths:
        raise UsageError(f"--k: {k} must be in 1..16, with at least one acceptance length")
    bad = [length for length in synthetic.acceptance_lengths if not 1 <= length <= k + 1]
    if bad:
        raise UsageError(
            f"--acceptance-length: {bad} outside [1, {k + 1}], the range vLLM accepts for k={k}"
        )
    if ctx.kind.release:
        found = ctx.image.vllm
        if found is None or version_tuple(found) < SYNTHETIC_MIN_VLLM:
            having = sorted(
                name
                for name, image in ctx.project.images.items()
                if image.role == SERVE_ROLE
                and image.vllm
                and version_tuple(image.vllm) >= SYNTHETIC_MIN_VLLM
            )
            raise UsageError(
                f"cluster {ctx.cluster_name} serves image {ctx.image_name} (vLLM {found}), "
                "which has no synthetic rejection sampling (vLLM >= 0.32)"
                + (f"; {', '.join(having)} has it" if having else ""),
                hint=(
                    f"--image {having[0]} calibrates that stack instead"
                    if having
                    else "add a serve image with vLLM >= 0.32 under 'images:'"
                ),
            )
    return dataclasses.replace(
        ctx, synthetic_k=k, synthetic_lengths=tuple(synthetic.acceptance_lengths)
    )


def _drafter_name(project: Project, cluster: str, request: PlanRequest, kind: WorkloadKind) -> str:
    """serve and bench default to no drafter; the data pipeline (and publishing and judging what
    it makes) defaults to the train drafter (kinds.py: default_drafter)."""
    if kind.default_drafter == "pulled":
        return _pulled_drafters(project, request)[0]
    if kind.default_drafter == "never":
        return NO_DRAFTER
    train_drafter = project.clusters[cluster].workloads.train.drafter
    default = train_drafter if kind.default_drafter == "train drafter" else NO_DRAFTER
    name = request.drafter or default
    valid = [NO_DRAFTER, *sorted(project.drafters)]
    if name != NO_DRAFTER and name not in project.drafters:
        raise UsageError(
            f"--drafter: unknown drafter '{name}' (valid: {', '.join(valid)})",
            hint="`kimideploy drafter list` shows the registry; a drafter a training run will "
            f"write is declared first: `kimideploy drafter new {name}`",
        )
    if kind.model_free_refusal is not None and name not in project.eagle_drafters:
        reason, hint = kind.model_free_refusal
        raise UsageError(f"drafter {name}: {reason}", hint=hint)
    if kind.for_eagle_drafter and name not in project.eagle_drafters:
        raise UsageError(
            f"--drafter {name}: {request.workload} builds data for an EAGLE-3 drafter and needs "
            "its layer ids",
            hint=f"pass one of {', '.join(sorted(project.eagle_drafters))}",
        )
    return name


def _pulled_drafters(project: Project, request: PlanRequest) -> tuple[str, ...]:
    """pull fetches drafters pinned by digest; anything else is refused before a Job starts."""
    names = request.asked(PullAsk).drafters or ((request.drafter,) if request.drafter else ())
    if not names:
        raise UsageError("pull needs a drafter: `kimideploy drafter pull NAME --cluster C`")
    for name in names:
        drafter = project.eagle_drafters.get(name)
        if drafter is None:
            raise UsageError(
                f"drafter {name}: not an EAGLE-3 drafter of the registry (drafters: "
                f"{', '.join(sorted(project.eagle_drafters))})",
                hint="`kimideploy drafter list` shows the registry",
            )
        if drafter.source.oci is None:
            where = "the hub" if drafter.source.hub is not None else "a cluster's volume"
            how = f"publish it first: `kimideploy drafter publish {name} --cluster CLUSTER`"
            if drafter.source.hub is not None:
                how = "`kimideploy host sync-model` downloads hub drafters"
            raise UsageError(
                f"drafter {name} comes from {where}, not from a published artifact: there is "
                "no digest to pull",
                hint=how,
            )
    return names


SPEC_BUILDERS: dict[str, Callable[[PlanInputs, str, HiddenStateEstimate], WorkloadSpec]] = {
    "serve": lambda ctx, run_id, estimate: serve.serve_spec(ctx),
    "datagen": lambda ctx, run_id, estimate: jobs.datagen_spec(ctx, run_id),
    "extract": jobs.extract_spec,
    "vocab": lambda ctx, run_id, estimate: jobs.vocab_spec(ctx, run_id),
    "train": lambda ctx, run_id, estimate: jobs.train_spec(ctx, run_id),
    "bench": lambda ctx, run_id, estimate: jobs.bench_spec(ctx, run_id),
    "publish": lambda ctx, run_id, estimate: publish.publish_spec(
        ctx, run_id, ctx.asked(PublishAsk).to
    ),
    "replay": lambda ctx, run_id, estimate: replay.replay_spec(ctx, run_id),
    "pull": lambda ctx, run_id, estimate: PullSpec(
        run_id=run_id, cluster=ctx.cluster_name, target=ctx.target_ref()
    ),
    "weights": lambda ctx, run_id, estimate: jobs.weights_spec(ctx, run_id),
}
"""Per kind, how its spec (what the pod reads from /etc/kimideploy/spec.json) is built."""


def _spec(ctx: PlanInputs, estimate: HiddenStateEstimate) -> WorkloadSpec:
    spec = SPEC_BUILDERS[ctx.workload](ctx, ctx.run_id or "serve", estimate)
    # What the pod's artifact-pull init container fetches (the same list it mounts volumes for).
    return spec.model_copy(update={"pulls": publish.pulls(ctx)})


def _facts(
    ctx: PlanInputs,
    estimate: HiddenStateEstimate,
    engines: list[memory.MemoryPlan],
    gitops: tuple[ObjectPlan, ...],
) -> list[tuple[str, str]]:
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
    if ctx.kind.gpus:
        gpu = ctx.cluster.gpu
        facts.append(("GPUs", f"{gpu.per_node} x {gpu.product} ({gpu.arch}) per pod"))
    if ctx.kind.release:
        facts += _serve_facts(ctx)
    facts += [("memory", found.describe()) for found in engines]
    if ctx.kind.release:
        gate = analysis.describe(ctx, list(gitops))
        facts += [("gitops gate", gate)] if gate else []
    runners = model_runner.plan_fact(ctx)
    if runners is not None:
        facts.append(("model runner", runners))
    serves = ctx.kind.release and ctx.image.vllm is not None
    if serves or (ctx.kind.trains_for_serving and ctx.drafter is not None):
        facts.append(("kernels", stack.kernels_fact(ctx)))
    elif ctx.workload == "bench":  # what its figures will be measured on, kept with them
        facts.append(("kernels", stack.kernels_fact(ctx, speculative=is_speculative(ctx))))
    if online.is_online(ctx):
        scratch = ctx.cluster.workloads.train.online.scratch_size
        facts += [
            ("online", online.check(ctx).describe()),
            (
                "hidden states",
                f"computed per sample by the target server, never stored "
                f"(pod-local scratch {scratch})",
            ),
        ]
    elif ctx.kind.plans_hidden_states:
        facts.append(("hidden states", estimate.describe()))
    if ctx.kind.trains_for_serving and ctx.drafter is not None:
        key, text, _ = _training_target_fact(ctx)
        facts.append((key, text))
    if (
        ctx.kind.trains
        and ctx.cluster.workloads.train.nodes > 1
        and (ctx.cluster.network.rdma_resource)
    ):
        facts.append(
            (
                "locked memory",
                "NCCL over InfiniBand pins its buffers: the node's container runtime must give "
                "pods an unlimited RLIMIT_MEMLOCK (LimitMEMLOCK=infinity; IPC_LOCK does not "
                "reach the non-root trainer); the pods' first init container checks it in "
                "seconds (`host check` reads it, `host provision` sets it)",
            )
        )
    datasets = _datasets_fact(ctx)
    if datasets:
        facts.append(("datasets", datasets))
    if ctx.run_id:
        facts.append(("run id", ctx.run_id))
    return facts


def _fact_values(
    ctx: PlanInputs, estimate: HiddenStateEstimate, engines: list[memory.MemoryPlan]
) -> dict[str, Any]:
    """The facts a script reads as values (numbers, lists), keyed by the labels of `_facts`."""
    image = ctx.image
    values: dict[str, Any] = {
        "namespace": ctx.namespace,
        "image": {
            "name": ctx.image_name,
            "reference": image.reference,
            "vllm": image.vllm,
            "speculators": image.speculators,
            "patches": list(image.patches),
        },
    }
    if ctx.kind.gpus:
        gpu = ctx.cluster.gpu
        values["GPUs"] = {"per_pod": gpu.per_node, "product": gpu.product, "arch": gpu.arch}
    if engines:
        values["memory"] = [
            {**dataclasses.asdict(found), "concurrent_max_length": found.concurrent_max_length}
            for found in engines
        ]
    runners = model_runner.engine_runners(ctx)
    if runners:
        values["model runner"] = {engine: runner.runner for engine, runner in runners}
    if ctx.kind.plans_hidden_states and not online.is_online(ctx):
        values["hidden states"] = dataclasses.asdict(estimate)
    if ctx.run_id:
        values["run id"] = ctx.run_id
    return values


def _datasets_fact(ctx: PlanInputs) -> str:
    """Which dataset folders the run reads and writes: each is named by its fingerprint, so a
    changed input shows here as a new folder before anything runs."""
    reads, writes = data_layout.data_flow(ctx)
    if not reads and not writes:
        return ""
    dirs = data_layout.data_dirs(ctx)
    parts = [f"reads {dirs[name]}" for name in reads] + [f"writes {dirs[name]}" for name in writes]
    return "; ".join(parts) + " (folders named by what makes them: `kimideploy data inspect`)"


def _pod_monitor_fact(ctx: PlanInputs) -> str:
    setting = ctx.cluster.workloads.serve.pod_monitor
    if serve.wants_pod_monitor(ctx):
        return f"PodMonitor rendered ({setting})"
    if setting == "auto" and ctx.monitoring_crd is None:
        return "auto: `up` adds a PodMonitor when the cluster serves monitoring.coreos.com/v1"
    return f"none ({setting})"


def _serve_facts(ctx: PlanInputs) -> list[tuple[str, str]]:
    serve_settings = ctx.cluster.workloads.serve
    _, strategy = serve.rollout_strategy(ctx)
    facts = [
        ("replicas", str(serve_settings.replicas)),
        ("tensor parallel", str(ctx.cluster.gpu.per_node)),
        ("rollout", strategy),
        ("startup budget", f"{serve_settings.startup_budget_s // 60} min (probe on /v1/models)"),
        ("pod monitor", _pod_monitor_fact(ctx)),
        ("page cache", page_cache.page_cache_plan(ctx).describe()),
        ("weights reader", page_cache.load_plan(ctx, ctx.storage_read_gbps).reason),
        ("CUDA graphs", serve.capture_size(ctx)[1]),
    ]
    spec = serve.speculative_config(ctx)
    if spec is None:
        return [*facts, ("speculative", "off (no drafter)")]
    facts.append(("speculation off", _switch_fact(ctx)))
    drafter = ctx.drafter
    if drafter is not None:
        vllm_ids = to_vllm_layer_ids(drafter.aux_layer_ids, drafter.layer_id_convention)
        drafts_from = (
            f"{drafter.aux_layer_ids} ({drafter.layer_id_convention}) = {vllm_ids} in vLLM"
        )
        drafts_key = "aux layers"
    else:
        drafts_key, drafts_from = "drafts from", "the request's own tokens (model-free: no weights)"
    counted = (
        "per request: the bench counts only its own requests (--per-request-spec-decode-metrics)"
        if serve.counts_per_request(ctx)
        else "server counters: the bench's window includes any other traffic on the release"
    )
    facts += [
        ("speculative", json.dumps(spec)),
        (drafts_key, drafts_from),
        ("acceptance counted", counted),
    ]
    k = ctx.speculative_tokens
    assert k is not None
    threshold = gate_threshold(ctx)
    gated = gated_levels(ctx)
    levels = ",".join(map(str, gated))
    policy = (
        f"with --gate: keep only at >= {threshold:.2f}x output tokens/s over no drafter "
        f"at c={levels}, else roll back to no drafter"
    )
    if ctx.synthetic_k is not None:
        lengths = ", ".join(map(str, ctx.synthetic_lengths))
        what = (
            f"synthetic acceptance, k={k}, lengths {lengths}; dev endpoints open for the "
            "bench (calibration revisions only)"
        )
        return [*facts, ("calibration", what)]
    judged = ctx.drafter or ctx.model_free
    found = acceptance.evidence(judged, k) if judged is not None else None
    if found is not None:
        below = [
            c for c in gated if calibration.speedup(ctx.cost_model, k, found.length, c) < threshold
        ]
        if below:
            policy += (
                f"; predicted below {threshold:.2f}x at c={','.join(map(str, below))}: "
                "the gate would roll it back there (speculation loses as the batch grows; gate "
                "where it can pay: gate.concurrency)"
            )
    return [*facts, *prediction_facts(ctx, k, gated), ("gate", policy)]


def _switch_fact(ctx: PlanInputs) -> str:
    """How `rollback serve --no-spec` turns this release's speculation off, and what staying
    ready for it costs."""
    if serve.switches_speculation(ctx):
        staying = next((m.staying_ready() for m in memory.memory_plans(ctx)), "")
        return (
            "in seconds: the running engine is switched off (patch 0002), the pods stay; " + staying
        )
    if not serve.swaps_drafters(ctx):
        why = "the server is not started able to swap drafters"
        if ctx.model_free is not None:
            why = "a model-free method has no keeper"
    else:
        why = f"the image's vLLM lacks {SPECULATION_SWITCH_PATCH}"
    return f"a restart (a new load of the target): {why}"


def prediction_facts(ctx: PlanInputs, k: int, levels: list[int]) -> list[tuple[str, str]]:
    """Predicted speedup per gated concurrency, saying which cost model it comes from."""
    drafter = ctx.drafter or ctx.model_free
    assert drafter is not None
    costs = ctx.cost_model
    found = acceptance.evidence(drafter, k)
    if found is not None:
        at = ", ".join(
            f"c={c} {calibration.speedup(costs, k, found.length, c):.2f}x" for c in levels
        )
        predicted = f"{at} (k={k}, {found.label()})"
    else:
        even = ", ".join(f"c={c} {calibration.break_even_length(costs, k, c):.2f}" for c in levels)
        predicted = f"unknown: no measured acceptance; break-even acceptance length {even} (k={k})"
    facts = [("predicted", predicted), ("step cost", _cost_source(ctx))]
    if ctx.drafter is None:
        return facts
    schedule = serve.k_schedule(ctx)
    if ctx.drafter.k_schedule == "auto" or schedule.ranges:
        facts.append(("k schedule", schedule.describe()))
    return facts


def _cost_source(ctx: PlanInputs) -> str:
    source = ctx.cost_model.source
    return f"{source}; {ctx.costs_note}, so not used" if ctx.costs_note else source


def _training_target_fact(ctx: PlanInputs) -> tuple[str, str, str | None]:
    """What acceptance length the drafter must reach to pass the gate on this cluster."""
    drafter = ctx.drafter
    assert drafter is not None
    threshold, k = gate_threshold(ctx), drafter.num_speculative_tokens
    levels = gated_levels(ctx)
    costs = ctx.cost_model
    needed = {c: calibration.required_length(costs, k, c, threshold) for c in levels}
    text = (
        f"to pass the gate ({threshold:.2f}x at k={k}) the drafter needs acceptance length "
        + ", ".join(f"c={c} {v:.2f}" for c, v in needed.items())
        + f" ({_cost_source(ctx)})"
    )
    impossible = [c for c, v in needed.items() if v > k + 1]
    warning = None
    if impossible:
        warning = (
            f"no acceptance length up to k+1 = {k + 1} meets the gate's {threshold:.2f}x "
            f"at c={','.join(map(str, impossible))} on cluster {ctx.cluster_name}: a drafter "
            "trained here cannot pass the gate there"
        )
    return "acceptance needed", text, warning


def _drafter_findings(ctx: PlanInputs) -> tuple[CheckResult, ...]:
    """The registry judgement of a drafter served on this plan's cluster, with the cost model the
    plan predicts with; none for a calibration, whose acceptance is synthetic."""
    if not ctx.kind.release or ctx.synthetic_k is not None:
        return ()
    on_stack = [f for f in (stack.stack_finding(ctx),) if f is not None]
    if ctx.model_free is not None:
        found = method_findings(
            ctx.project, ctx.drafter_name, ctx.model_free, ctx.cluster_name, costs=ctx.cost_model
        )
        return (*on_stack, *found)
    if ctx.drafter is None:
        return ()
    found = registry_findings(
        ctx.project, ctx.drafter_name, ctx.drafter, ctx.cluster_name, costs=ctx.cost_model
    )
    return (*on_stack, *found)


def _warnings(ctx: PlanInputs, estimate: HiddenStateEstimate) -> list[str]:
    warnings: list[str] = []
    drafter, project = ctx.drafter, ctx.project
    if drafter is not None and ctx.kind.trains:
        found = lineage_findings(project, drafter, ctx.cluster_name)
        warnings += serving_warnings(found, ctx.drafter_name)
    warnings += serving_warnings(list(_drafter_findings(ctx)), ctx.drafter_name)
    if ctx.kind.trains_for_serving and drafter is not None:
        _, _, impossible = _training_target_fact(ctx)
        if impossible:
            warnings.append(impossible)
        why = stack.cannot_pay(ctx)
        if why:
            warnings.append(f"a drafter trained for {ctx.cluster_name} would be wasted: {why}")
    if ctx.kind.release:
        cache = page_cache.page_cache_plan(ctx)
        if cache.worth_a_warning:
            warnings.append(f"{cache.describe()}: every restart reads the storage again")
    reads, writes = data_layout.data_flow(ctx)
    if "hidden_states" in (*reads, *writes) and estimate.claim_bytes < estimate.total_bytes:
        warnings.append(
            f"the hidden-state claim ({estimate.claim_size}) is smaller than the "
            f"{human_bytes(estimate.total_bytes)} extraction will write"
        )
    return warnings


def _inputs(ctx: PlanInputs, request: PlanRequest) -> dict[str, Any]:
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
        **(
            {"serve_fingerprint": serve.config_fingerprint(_serve_view(ctx))}
            if ctx.kind.measures_serving
            else {}
        ),
        **(
            {"synthetic": {"k": ctx.synthetic_k, "acceptance_lengths": list(ctx.synthetic_lengths)}}
            if ctx.synthetic_k is not None
            else {}
        ),
        **(
            {"bench_concurrency": list(levels)}
            if (levels := ctx.asked(BenchAsk).concurrency)
            else {}
        ),
        **(
            {"canary_percent": share}
            if (share := ctx.asked(ServeAsk).canary_percent) is not None
            else {}
        ),
    }

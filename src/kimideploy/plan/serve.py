"""The serve release: vLLM arguments, rollout strategy, probes and the objects that carry them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any

from kimideploy.config.drafters import (
    NO_DRAFTER,
    Drafter,
    ModelFreeMethod,
    NgramMethod,
    SuffixMethod,
)
from kimideploy.config.images import SUFFIX_SELFCHECK
from kimideploy.config.specs import (
    SPEC_PATH,
    SYNTHETIC_CONTROL_EXTENSION,
    ServeSpec,
)
from kimideploy.formats.drafter_swap import (
    DEV_ROUTES_GUARD,
    DRAFTER_FILES_BACKEND,
    DRAFTER_KEEPER,
    DRAFTERS_ROOT_ENV,
    SPECULATION_SWITCH_ENV,
    SPECULATION_SWITCH_PATCH,
    STARTED_WITH_ENV,
    WANTED_SPEC_ENV,
    drafter_version,
)
from kimideploy.formats.extraction_engine import version_tuple
from kimideploy.plan import capture, model_runner, page_cache, pods, publish, stack
from kimideploy.plan.asks import ServeAsk
from kimideploy.plan.claims import workload_claims
from kimideploy.plan.dashboard import dashboard_object
from kimideploy.plan.inputs import (
    MODELS_MOUNT,
    PlanInputs,
    drafter_path,
    is_speculative,
    target_model_path,
)
from kimideploy.plan.k_schedule import KSchedule, choose_schedule
from kimideploy.plan.model import ObjectPlan
from kimideploy.plan.vllm_server import (
    HEALTH_PATH,
    READY_PATH,
    ServerBase,
    base_args,
    http_probe,
    liveness_probe,
)

# The worker extension `run calibrate` serves with (kimideploy is in every serve image), and the
# environment that opens vLLM's /collective_rpc for it; only calibration revisions get either.
DEV_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}


def speculative_config(ctx: PlanInputs) -> dict[str, Any] | None:
    """The --speculative-config value vLLM parses as JSON; None for non-speculative serving."""
    if not is_speculative(ctx):
        return None
    if ctx.model_free is not None:
        return model_free_config(ctx.model_free)
    drafter = ctx.drafter
    assert drafter is not None
    config: dict[str, Any] = {
        "method": drafter.method,
        "model": drafter_path(ctx.drafter_name, drafter),
        "num_speculative_tokens": ctx.synthetic_k or drafter.num_speculative_tokens,
    }
    if drafter.draft_tensor_parallel_size is not None:
        config["draft_tensor_parallel_size"] = drafter.draft_tensor_parallel_size
    if ctx.synthetic_k is not None:
        config["rejection_sample_method"] = "synthetic"
        config["synthetic_acceptance_length"] = ctx.synthetic_lengths[0]
        return config
    schedule = k_schedule(ctx)
    if schedule.ranges:
        config["num_speculative_tokens_per_batch_size"] = [list(r) for r in schedule.ranges]
    return config


def model_free_config(method: ModelFreeMethod) -> dict[str, Any]:
    """A model-free method's keys under vLLM's names (vllm/config/speculative.py)."""
    config: dict[str, Any] = {
        "method": method.method,
        "num_speculative_tokens": method.num_speculative_tokens,
    }
    if isinstance(method, NgramMethod):
        config["prompt_lookup_min"] = method.prompt_lookup_min
        config["prompt_lookup_max"] = method.prompt_lookup_max
        return config
    config.update(
        suffix_decoding_max_tree_depth=method.max_tree_depth,
        suffix_decoding_max_cached_requests=method.max_cached_requests,
        suffix_decoding_max_spec_factor=method.max_spec_factor,
        suffix_decoding_min_token_prob=method.min_token_prob,
    )
    return config


def k_schedule(ctx: PlanInputs) -> KSchedule:
    """`drafters.<d>.k_schedule: auto`: k by batch size from the measured step cost and the
    drafter's measured acceptance; `fixed` (or anything missing) keeps one k."""
    drafter = ctx.drafter
    assert drafter is not None
    return choose_schedule(
        drafter.k_schedule,
        ctx.cost_model,
        list(drafter.acceptance),
        drafter.num_speculative_tokens,
        max_num_seqs=ctx.cluster.workloads.serve.max_num_seqs,
        vllm=ctx.image.vllm,
    )


def config_fingerprint(ctx: PlanInputs) -> str:
    """What a calibration must have been measured on to predict for this serve configuration: the
    image, the non-speculative `vllm serve` arguments, replicas, GPUs and the pods' NCCL env."""
    plain = dataclasses.replace(
        ctx,
        workload="serve",
        drafter_name=NO_DRAFTER,
        drafter=None,
        run_id=None,
        synthetic_k=None,
        synthetic_lengths=(),
    )
    serve = ctx.cluster.workloads.serve
    relevant = {
        "image": ctx.image.reference,
        # How the weights are read changes the start, not a decode step.
        "args": _without(vllm_args(plain), LOAD_FLAGS),
        "replicas": serve.replicas,
        "gpus": f"{ctx.cluster.gpu.per_node} x {ctx.cluster.gpu.product}",
        "env": dict(sorted(ctx.cluster.env.items())),  # NCCL settings change the verify step
    }
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


LOAD_FLAGS = frozenset({"--safetensors-load-strategy", "--safetensors-prefetch-num-threads"})


def _without(args: list[str], flags: frozenset[str]) -> list[str]:
    """`args` without each of `flags` and the value after it."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        else:
            out.append(arg)
    return out


DEFAULT_CAPTURE_CAP = {"sm_100": 1024, "sm_103": 1024}
"""vLLM 0.32's default ceiling of its CUDA-graph capture sizes: 1024 tokens on the sm_100
family, 512 elsewhere (config/vllm.py, `default_max_graph_size`)."""
OTHER_CAPTURE_CAP = 512


def capture_size(ctx: PlanInputs) -> tuple[int | None, str]:
    """(--max-cudagraph-capture-size, why): the widest decode step is max_num_seqs x (1 + k)
    tokens. Left to vLLM where its default covers it: set explicitly, vLLM 0.32 drops the
    decode-aligned sizes it otherwise adds (each tier's request counts x its query length,
    patch 0002's k = 0 tier included) and captures its token-strided grid instead."""
    serve = ctx.cluster.workloads.serve
    k = max((r[2] for r in k_schedule(ctx).ranges), default=0) if ctx.drafter else 0
    k = max(k, ctx.speculative_tokens or 0)
    widest = serve.max_num_seqs * (1 + k)
    cap = DEFAULT_CAPTURE_CAP.get(ctx.cluster.gpu.arch, OTHER_CAPTURE_CAP)
    if widest <= cap:
        return None, (
            f"vLLM's default (up to {cap} tokens on {ctx.cluster.gpu.arch}) covers the widest "
            f"decode step, {serve.max_num_seqs} requests x {1 + k} tokens = {widest}"
        )
    return widest, (
        f"--max-cudagraph-capture-size {widest}: {serve.max_num_seqs} requests x {1 + k} "
        f"tokens, above vLLM's default of {cap} on {ctx.cluster.gpu.arch} (wider steps would "
        "run without CUDA graphs)"
    )


def vllm_args(ctx: PlanInputs) -> list[str]:
    """`vllm serve` arguments after the model path; no speculative flag at all without a drafter."""
    model, serve = ctx.model, ctx.cluster.workloads.serve
    server = ServerBase(
        served_name=model.served_name,
        port=capture.engine_port(ctx),
        tensor_parallel_size=ctx.cluster.gpu.per_node,
        max_model_len=model.max_model_len,
        gpu_memory_utilization=serve.gpu_memory_utilization,
        trust_remote_code=model.trust_remote_code,
    )
    args = base_args(server, "--max-num-seqs", str(serve.max_num_seqs))
    if serve.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", serve.kv_cache_dtype]
    if serve.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(serve.max_num_batched_tokens)]
    if model.multimodal:
        args += ["--mm-encoder-tp-mode", serve.mm_encoder_tp_mode]
    if serve.attention_backend is not None:
        args += ["--attention-backend", serve.attention_backend]
    if serve.moe_backend != "auto":
        args += ["--moe-backend", serve.moe_backend]
    if model.reasoning_parser:
        args += ["--reasoning-parser", model.reasoning_parser]
    if model.tool_call_parser:
        args += ["--tool-call-parser", model.tool_call_parser, "--enable-auto-tool-choice"]
    args += page_cache.load_plan(ctx, ctx.storage_read_gbps).args()
    size, _ = capture_size(ctx)
    if size is not None:
        args += ["--max-cudagraph-capture-size", str(size)]
    spec = speculative_config(ctx)
    if spec is not None:
        args += ["--speculative-config", json.dumps(spec)]
    if ctx.synthetic_k is not None:
        args += ["--worker-extension-cls", SYNTHETIC_CONTROL_EXTENSION]
    if spec is not None and counts_per_request(ctx):
        args += ["--per-request-spec-decode-metrics", "summary"]
    if swaps_drafters(ctx):
        args += ["--weight-transfer-config", json.dumps({"backend": DRAFTER_FILES_BACKEND})]
        args += ["--middleware", DEV_ROUTES_GUARD, "--middleware", DRAFTER_KEEPER]
    # Every value here is the user's or derived from it; none refers to a pod variable.
    return [pods.literal(a) for a in [*args, *serve.extra_args]]


SPEC_SHA256_ANNOTATION = f"{pods.LABEL_PREFIX}/spec-sha256"
"""On the serve pod template: the hash of spec.json, so a changed spec rolls the pods and the
gate can tell which render a live Deployment is."""

PER_REQUEST_SPEC_METRICS_VLLM = (0, 32)
"""The first vLLM with `metrics.speculative_decoding` in its responses."""


DRAFTER_SWAP_VLLM = (0, 32)
"""The first vLLM whose engine replaces a running server's draft weights
(`start_draft_weight_update`, vllm/v1/worker/gpu_worker.py)."""


def swaps_drafters(ctx: PlanInputs) -> bool:
    """Whether this release starts able to take another drafter without a reload: a drafter
    model is served (model-free methods have no weights; calibration's synthetic serves are
    short-lived), serve.drafter_swap is on and the image's vLLM has the draft weight update.
    The server then runs in vLLM's development mode with kimideploy's files backend, and
    DEV_ROUTES_GUARD answers the development routes only inside the container, with its token;
    DRAFTER_KEEPER swaps in the drafter the mounted spec names (keeper_env)."""
    vllm = ctx.image.vllm
    return bool(
        is_speculative(ctx)
        and ctx.model_free is None
        and ctx.synthetic_k is None
        and ctx.cluster.workloads.serve.drafter_swap
        and vllm
        and version_tuple(vllm) >= DRAFTER_SWAP_VLLM
    )


def switches_speculation(ctx: PlanInputs) -> bool:
    """Whether this release starts able to switch speculation off and on without a reload: it
    can swap drafters (the keeper runs) and its image's vLLM carries patch 0002, the engine's
    switch. A non-speculative revision of such a server is then the same pods with speculation
    switched off (`rollback serve --no-spec` in seconds); the drafter's weights and its share
    of the KV cache stay allocated (the memory plan's "staying ready" line)."""
    return swaps_drafters(ctx) and SPECULATION_SWITCH_PATCH in ctx.image.patches


def keeper_env(ctx: PlanInputs) -> dict[str, str]:
    """What the drafter keeper reads: the drafter this container's `--speculative-config` loads
    (the label vLLM's "default" weight version stands for) and the mounted spec it keeps to;
    and, where the engine can switch, what makes it capture the k = 0 decode graphs too."""
    if not swaps_drafters(ctx):
        return {}
    env = {
        STARTED_WITH_ENV: drafter_version(ctx.drafter_name),
        WANTED_SPEC_ENV: SPEC_PATH,
        DRAFTERS_ROOT_ENV: MODELS_MOUNT,
    }
    if switches_speculation(ctx):
        env[SPECULATION_SWITCH_ENV] = "1"
    return env


FLASHINFER_INT4_MOE_ARCHS = frozenset({"sm_100", "sm_103"})
"""FlashInfer's TRT-LLM INT4 experts kernel runs on the sm_100 family only (vLLM 0.32,
fused_moe/experts/trtllm_mxint4_moe.py)."""


def runner_env(ctx: PlanInputs) -> dict[str, str]:
    runner = model_runner.served(ctx)
    return runner.env() if runner is not None else {}


def moe_env(ctx: PlanInputs) -> dict[str, str]:
    """The variable FlashInfer's INT4 experts kernel needs besides --moe-backend: without it the
    kernel reports the device unsupported and vLLM fails at the load (vLLM 0.32,
    quantization/utils/flashinfer_mxint4_moe.py)."""
    serve = ctx.cluster.workloads.serve
    if serve.moe_backend == "flashinfer_trtllm" and ctx.model.quantization == "int4":
        return {"VLLM_USE_FLASHINFER_MOE_INT4": "1"}
    return {}


def moe_backend_refusal(ctx: PlanInputs) -> str | None:
    """Why the configured experts kernel cannot serve this checkpoint on this GPU (None: it can
    as far as the plan can tell), said before a load that would fail at its end."""
    serve, arch = ctx.cluster.workloads.serve, ctx.cluster.gpu.arch
    if (
        serve.moe_backend == "flashinfer_trtllm"
        and ctx.model.quantization == "int4"
        and arch not in FLASHINFER_INT4_MOE_ARCHS
    ):
        return (
            f"clusters.{ctx.cluster_name}.workloads.serve.moe_backend: flashinfer_trtllm runs "
            f"INT4 experts on the sm_100 family only, and {ctx.cluster_name} is {arch}"
        )
    return None


def counts_per_request(ctx: PlanInputs) -> bool:
    """Whether the responses carry each request's own acceptance (serve.per_request_spec_metrics
    on an image whose vLLM has them)."""
    vllm = ctx.image.vllm
    return bool(
        ctx.cluster.workloads.serve.per_request_spec_metrics
        and vllm
        and version_tuple(vllm) >= PER_REQUEST_SPEC_METRICS_VLLM
    )


def rollout_strategy(ctx: PlanInputs) -> tuple[dict[str, Any], str]:
    """Rolling (maxUnavailable 0) when the cluster holds one replica more, else Recreate."""
    serve, gpus = ctx.cluster.workloads.serve, ctx.cluster.gpu.per_node
    needed = (serve.replicas + 1) * gpus
    fits = ctx.cluster.total_gpus >= needed
    choice = ctx.cluster.rollout
    if choice == "recreate" or (choice == "auto" and not fits):
        why = f"{ctx.cluster.total_gpus} GPUs cannot hold {serve.replicas + 1} copies of {gpus}"
        return {"type": "Recreate"}, f"Recreate ({why})" if not fits else "Recreate (configured)"
    rolling = {"maxUnavailable": 0, "maxSurge": 1}
    return {"type": "RollingUpdate", "rollingUpdate": rolling}, (
        f"RollingUpdate, maxUnavailable 0 ({ctx.cluster.total_gpus} GPUs hold {needed})"
    )


def probes(ctx: PlanInputs) -> dict[str, Any]:
    """Startup covers the whole weight load; readiness on /v1/models; liveness on /health.

    With an API key vLLM answers /v1 only with the key, which a probe cannot take from a Secret;
    /health, which vLLM's HTTP server offers only once the engine is built, stands in."""
    serve = ctx.cluster.workloads.serve
    period = serve.probe_period_s
    port = capture.engine_port(ctx)  # vLLM's own, never a sidecar's in front of it
    ready = HEALTH_PATH if serve.api_key else READY_PATH
    return {
        "startupProbe": http_probe(
            ready, port, period, 5, failures=math.ceil(serve.startup_budget_s / period)
        ),
        "readinessProbe": http_probe(ready, port, period, 5, failures=3),
        "livenessProbe": liveness_probe(port),
    }


def serve_spec(ctx: PlanInputs) -> ServeSpec:
    drafter: Drafter | None = ctx.drafter
    return ServeSpec(
        run_id="serve",
        cluster=ctx.cluster_name,
        target=ctx.target_ref(),
        drafter=ctx.drafter_name,
        drafter_path=drafter_path(ctx.drafter_name, drafter) if drafter else None,
        layers=ctx.layers() if drafter else None,
        num_speculative_tokens=ctx.speculative_tokens,
        draft_vocab_size=drafter.draft_vocab_size if drafter else None,
        decoder=drafter.decoder if drafter else "llama",
        image_patches=list(ctx.image.patches),
        image_cuda_archs=list(ctx.image.cuda_archs),
        vllm_version=ctx.image.vllm,
        speculation=not ctx.asked(ServeAsk).speculation_off,
        drafter_sha256=drafter_sha256(drafter) if drafter else {},
        capture=capture.capture_spec(ctx),
    )


def drafter_sha256(drafter: Drafter) -> dict[str, str]:
    """The files a swap reads (config.json and the safetensors) by the sha256 the project
    recorded for them: a published drafter's artifact files, else `sha256` of model.safetensors."""
    oci = drafter.source.oci
    if oci is not None and oci.files:
        return {
            name: digest
            for name, digest in sorted(oci.files.items())
            if name == "config.json" or name.endswith(".safetensors")
        }
    return {"model.safetensors": drafter.sha256} if drafter.sha256 else {}


MODEL_MARKER = ".kimideploy-complete"
GPU_CHECK_ALLREDUCE_TIMEOUT_S = 60
"""A healthy all-reduce of 256 MiB over 8 GPUs takes well under a second once NCCL has set up
its connections (seconds); a blocked peer-to-peer path hangs for ever."""


def gpu_probes(ctx: PlanInputs, gpus: int) -> list[str]:
    """The GPU check's device probes for this image: the kernel that serves the routed experts
    where vLLM is (Marlin at Kimi-K2.5's INT4 expert shapes where the kernel plan says Marlin;
    else vLLM's fused-MoE Triton kernel, a check that vLLM's kernels launch at all), the
    all-reduce where there is more than one GPU to reduce across."""
    probes = ["torch-arch", "triton"]
    if ctx.image.vllm:
        probes.append("marlin-moe" if experts_on_marlin(ctx) else "moe")
    if gpus > 1:
        probes.append("allreduce")
    return probes


def experts_on_marlin(ctx: PlanInputs) -> bool:
    """Whether INT4 routed experts run on Marlin here: chosen (serve.moe_backend) or as the
    image's vLLM picks it (its kernel plan). The probe packs INT4 only: NVFP4 experts on
    Marlin are another kernel path."""
    if ctx.model.quantization != "int4":
        return False
    chosen = ctx.cluster.workloads.serve.moe_backend
    if chosen != "auto":
        return chosen == "marlin"
    found = stack.kernel_plan(ctx)
    experts = found.experts.get("int4") if found is not None else None
    return experts is not None and experts.backend == "MARLIN"


def served_target_path(ctx: PlanInputs) -> str:
    """Where the serve container reads the target: the models claim, or the node-local copy."""
    if page_cache.load_plan(ctx, ctx.storage_read_gbps).local_copy:
        return page_cache.local_target_path(ctx)
    return target_model_path(ctx.model)


def init_containers(ctx: PlanInputs) -> list[dict[str, Any]]:
    """Seconds-long checks before a 25-minute load: GPU architecture and driver, synced model."""
    gpus = ctx.cluster.gpu.per_node
    hardened = pods.container_hardening()
    model_dir = served_target_path(ctx)
    local = page_cache.load_plan(ctx, ctx.storage_read_gbps).local_copy
    local_mounts = [page_cache.node_local_mount(True)] if local else []
    script = (
        f'test -f "$MODEL_DIR/{MODEL_MARKER}" || {{ echo "model not synced: $MODEL_DIR has no '
        f'{MODEL_MARKER}; run: kimideploy host sync-model --cluster {ctx.cluster_name}" >&2; '
        "exit 1; }"
    )
    gpu_check = pods.gpu_check_command(ctx, gpu_probes(ctx, gpus), GPU_CHECK_ALLREDUCE_TIMEOUT_S)
    small = pods.resources("100m", "256Mi", 0)
    _, shm_mount = pods.shm_volume(ctx.cluster.workloads.serve.shm_size)
    _, spec_mount = pods.spec_volume(ctx.object_name)
    _, writable = pods.writable_volumes()
    drafter_check = (
        [
            {
                # The drafter on the models volume, checked as `drafter check --dir` would.
                "name": "drafter-check",
                "image": ctx.image.reference,
                "command": [
                    "python",
                    "-m",
                    "kimideploy.workloads",
                    "drafter-check",
                    "--spec",
                    SPEC_PATH,
                ],
                "resources": small,
                "volumeMounts": [
                    {"name": "models", "mountPath": "/models", "readOnly": True},
                    spec_mount,
                    *writable,
                ],
                "securityContext": hardened,
            }
        ]
        if ctx.drafter
        else []
    )
    if isinstance(ctx.model_free, SuffixMethod):
        # Suffix decoding has no files to check; what it needs is Arctic Inference in the image.
        drafter_check = [
            {
                "name": "drafter-check",
                "image": ctx.image.reference,
                "command": ["python", "-m", "kimideploy.images.selfcheck", SUFFIX_SELFCHECK],
                "resources": small,
                "volumeMounts": writable,
                "securityContext": hardened,
            }
        ]
    return [
        *publish.pull_container(ctx, publish.pulls(ctx), spec_mount, writable),
        {
            "name": "gpu-check",
            "image": ctx.image.reference,
            "command": gpu_check,
            # The probes run one process per GPU (torch, NCCL) with the cluster's NCCL settings;
            # an init container's request only sets a floor under the serve container's.
            "env": pods.env(ctx, gpus, pods.compile_cache_env(ctx.image)),
            "resources": pods.resources(str(gpus), f"{4 * gpus}Gi", gpus),
            "volumeMounts": [*writable, shm_mount, pods.compile_cache_mount()],
            "securityContext": hardened,
        },
        {
            "name": "model-check",
            "image": ctx.image.reference,
            "command": ["sh", "-c", script],
            "env": [{"name": "MODEL_DIR", "value": model_dir}],
            "resources": pods.resources("100m", "64Mi", 0),
            "volumeMounts": [
                {"name": "models", "mountPath": "/models", "readOnly": True},
                *local_mounts,
                *writable,
            ],
            "securityContext": hardened,
        },
        *drafter_check,
    ]


def serve_objects(ctx: PlanInputs, spec_json: str, spec_sha256: str) -> list[ObjectPlan]:
    serve, gpus = ctx.cluster.workloads.serve, ctx.cluster.gpu.per_node
    labels = pods.standard_labels(ctx)
    engine_claims = {
        claim: read_only
        for claim, read_only in workload_claims(ctx).items()
        if claim not in capture.SIDECAR_CLAIMS
    }
    claim_vols, claim_mounts = pods.claim_volumes(ctx, engine_claims)
    shm_vol, shm_mount = pods.shm_volume(serve.shm_size)
    spec_vol, spec_mount = pods.spec_volume(ctx.object_name)
    writable_vols, writable_mounts = pods.writable_volumes()
    strategy, _ = rollout_strategy(ctx)
    local = page_cache.load_plan(ctx, ctx.storage_read_gbps).local_copy
    local_vols = [page_cache.node_local_volume(ctx)] if local else []
    local_mounts = [page_cache.node_local_mount(True)] if local else []
    sidecars, sidecar_volumes = capture.sidecar(ctx)
    common = {"name": ctx.object_name, "namespace": ctx.namespace, "labels": labels}
    deployment = {
        **common,
        "annotations": pods.object_annotations(ctx),
        # A canary is one pod: the share of the route it takes is what is judged, not its size.
        "replicas": serve.replicas if ctx.asked(ServeAsk).canary_percent is None else 1,
        "selector": pods.selector_labels(ctx),
        "strategy": strategy,
        # The Deployment must not declare failure while a replica is still inside its load budget.
        "progress_deadline_s": serve.startup_budget_s + 600,
        "pod_labels": {**labels},
        "pod_annotations": {**serve.pod_annotations, SPEC_SHA256_ANNOTATION: spec_sha256},
        "node_selector": pods.node_selector(ctx, gpus),
        "tolerations": pods.tolerations(ctx),
        "security": pods.pod_security(ctx),
        "priority_class": pods.priority_class(ctx),
        "image": ctx.image.reference,
        "command": ["vllm", "serve", served_target_path(ctx)],
        "args": vllm_args(ctx),
        "env": [
            *pods.env(
                ctx,
                gpus,
                {
                    "HF_HUB_OFFLINE": "1",
                    **pods.compile_cache_env(ctx.image),
                    **(DEV_MODE_ENV if ctx.synthetic_k is not None or swaps_drafters(ctx) else {}),
                    **keeper_env(ctx),
                    **moe_env(ctx),
                    **runner_env(ctx),
                },
            ),
            *pods.api_key_env(ctx, "VLLM_API_KEY"),
        ],
        "resources": pods.resources(
            serve.resources.cpu,
            serve.resources.memory,
            gpus,
            memory_limit=page_cache.memory_limit(ctx),
        ),
        "port": capture.engine_port(ctx),
        "port_name": capture.engine_port_name(ctx),
        "sidecars": sidecars,
        "probes": probes(ctx),
        "init_containers": init_containers(ctx),
        "volumes": [
            *claim_vols,
            shm_vol,
            spec_vol,
            *writable_vols,
            *publish.pull_volumes(ctx, publish.pulls(ctx)),
            *local_vols,
            *sidecar_volumes,
        ],
        "volume_mounts": [*claim_mounts, shm_mount, spec_mount, *writable_mounts, *local_mounts],
        "security_context": pods.container_hardening(),
    }
    service = {**common, "selector": pods.selector_labels(ctx), "port": serve.port}
    config_map = {**common, "data": pods.spec_data(ctx, spec_json)}
    objects = [
        ObjectPlan("configmap-serve", config_map),
        ObjectPlan("service-serve", service),
        ObjectPlan("deployment-serve", deployment),
    ]
    if ctx.cluster.network_policy.enabled:
        ingress = pods.serve_ingress(ctx, serve.port)
        policy = pods.network_policy(ctx, pods.selector_labels(ctx), ingress)
        objects.append(ObjectPlan("networkpolicy", policy))
    dashboard = dashboard_object(ctx, common)
    if dashboard is not None:
        objects.append(dashboard)
    if wants_pod_monitor(ctx):
        monitor = {
            **common,
            "selector": pods.selector_labels(ctx),
            "interval": f"{serve.scrape_interval_s}s",
            # vLLM labels its series with model_name only; these say which drafter produced them.
            "pod_target_labels": [f"{pods.LABEL_PREFIX}/drafter", f"{pods.LABEL_PREFIX}/cluster"],
        }
        objects.append(ObjectPlan("podmonitor-serve", monitor))
    return objects


def wants_pod_monitor(ctx: PlanInputs) -> bool:
    setting = ctx.cluster.workloads.serve.pod_monitor
    return setting == "always" or (setting == "auto" and bool(ctx.monitoring_crd))

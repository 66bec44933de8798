"""Job workloads: datagen, extract, vocab, train and bench, each a new immutable Job per run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kimideploy.config.clusters import KUEUE_QUEUE_LABEL
from kimideploy.config.drafters import Drafter
from kimideploy.config.specs import (
    API_KEY_ENV,
    SPEC_PATH,
    BenchSpec,
    DatagenSpec,
    ExtractSpec,
    NetworkCheck,
    SyntheticSweep,
    TrainSpec,
    VocabSpec,
    WeightsSpec,
    WeightsTarget,
    WorkloadExit,
    WorkloadSpec,
)
from kimideploy.config.workloads import DatagenSettings, WorkloadSettings
from kimideploy.errors import ConfigError, UsageError
from kimideploy.plan import model_runner, online, pods, publish, replay, stack
from kimideploy.plan.asks import BenchAsk
from kimideploy.plan.claims import HiddenStateEstimate, workload_claims
from kimideploy.plan.data_layout import data_dirs, dataset_fingerprints, published_conversations
from kimideploy.plan.inputs import (
    DATASETS_MOUNT,
    PlanInputs,
    drafter_path,
    is_speculative,
    target_model_path,
    trained_path,
)
from kimideploy.plan.model import ObjectPlan

RESUMABLE_EXIT_CODE = int(WorkloadExit.INTERRUPTED)
BAD_INPUT_EXIT_CODE = int(WorkloadExit.BAD_INPUT)
"""Workloads exit 75 (EX_TEMPFAIL) after a SIGTERM drain: the pod is replaced, not failed."""
FINISHED_JOB_TTL_S = 7 * 24 * 3600
INDEX_ANNOTATION = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def serve_endpoint(ctx: PlanInputs) -> str:
    port = ctx.cluster.workloads.serve.port
    return f"http://{ctx.project.release_name('serve')}.{ctx.namespace}.svc:{port}"


SpecT = TypeVar("SpecT", bound=WorkloadSpec)


def spec_from(spec_type: type[SpecT], settings: WorkloadSettings, **derived: Any) -> SpecT:
    """The spec with every field the settings also have, under the same name, copied as is, and
    the rest given (paths, the target, values the plan derives): a new knob is declared in the
    settings and the spec and read by the pod, with no copy here."""
    own = type(settings).model_fields
    copied = {
        n: getattr(settings, n) for n in spec_type.model_fields if n in own and n not in derived
    }
    return spec_type(**copied, **derived)


def datagen_spec(ctx: PlanInputs, run_id: str) -> DatagenSpec:
    settings = ctx.cluster.workloads.datagen
    published = published_conversations(ctx)
    if published:
        raise UsageError(
            f"cluster {ctx.cluster_name} takes its conversations from the published dataset "
            f"{published[0]} ({published[1].samples:,} samples): there is nothing to generate",
            hint=f"run extract (or train online) next; to generate here, remove "
            f"clusters.{ctx.cluster_name}.workloads.train.conversations",
        )
    endpoint = serve_endpoint(ctx) if settings.asks_the_serve_release else settings.endpoint
    return spec_from(
        DatagenSpec,
        settings,
        run_id=run_id,
        cluster=ctx.cluster_name,
        target=ctx.target_ref(),
        prompts=f"{DATASETS_MOUNT}/{settings.prompts}",
        output_dir=data_dirs(ctx)["conversations"],
        endpoint=endpoint,
        fingerprint=dataset_fingerprints(ctx)["conversations"],
        concurrency=datagen_concurrency(ctx),
    )


DATAGEN_OWN_ENDPOINT_CONCURRENCY = 32
"""Per shard, for an endpoint kimideploy does not size (not the serve release)."""


def datagen_concurrency(ctx: PlanInputs) -> int:
    """Requests in flight per shard: what the serve release holds at once (replicas x
    max_num_seqs) shared over the shards. More would only queue in vLLM, where the wait counts
    against each request's timeout: the tail times out, is retried, and is dropped."""
    settings, serve = ctx.cluster.workloads.datagen, ctx.cluster.workloads.serve
    if not settings.asks_the_serve_release:
        return settings.concurrency or DATAGEN_OWN_ENDPOINT_CONCURRENCY
    capacity = serve.replicas * serve.max_num_seqs
    share = max(1, capacity // settings.shards)
    if settings.concurrency is None:
        return share
    if settings.concurrency * settings.shards > capacity:
        where = f"clusters.{ctx.cluster_name}.workloads"
        raise ConfigError(
            f"{where}.datagen.concurrency: {settings.shards} shards x {settings.concurrency} = "
            f"{settings.shards * settings.concurrency} requests in flight, but the serve release "
            f"holds {capacity} at once ({serve.replicas} replicas x max_num_seqs "
            f"{serve.max_num_seqs}); the rest would wait in vLLM's queue and time out",
            hint=f"leave datagen.concurrency unset (it is then {share}), lower it to {share}, or "
            "serve more replicas",
        )
    return settings.concurrency


def weights_spec(ctx: PlanInputs, run_id: str) -> WeightsSpec:
    """The cluster's pinned checkpoint (its model variant) and the hub drafters, each into the
    folder of the models claim the pods read it from."""
    if ctx.cluster.weights_via != "job":
        raise UsageError(
            f"cluster {ctx.cluster_name}: its models volume is its hosts' "
            f"host_setup.model_path (workloads.weights.via resolves to host), which `host "
            "sync-model` fills over SSH; a download Job is for a shared models claim",
            hint=f"`kimideploy host sync-model --cluster {ctx.cluster_name}`, or set "
            f"clusters.{ctx.cluster_name}.workloads.weights.via: job",
        )
    model = ctx.model
    targets = [WeightsTarget(repo=model.repo, revision=model.revision,
                             dest=target_model_path(model))]  # fmt: skip
    for name, drafter in sorted(ctx.project.eagle_drafters.items()):
        hub = drafter.source.hub
        if hub is not None:
            targets.append(
                WeightsTarget(
                    repo=hub.repo, revision=hub.revision, dest=drafter_path(name, drafter)
                )
            )
    settings = ctx.cluster.workloads.weights
    return WeightsSpec(
        run_id=run_id,
        cluster=ctx.cluster_name,
        target=ctx.target_ref(),
        targets=targets,
        endpoint=settings.endpoint,
        streams=settings.streams,
        token_file=f"{HF_TOKEN_MOUNT}/token" if ctx.model.hf_token else None,
    )


def extract_spec(ctx: PlanInputs, run_id: str, estimate: HiddenStateEstimate) -> ExtractSpec:
    settings = ctx.cluster.workloads.extract
    dirs = data_dirs(ctx)
    return spec_from(
        ExtractSpec,
        settings,
        run_id=run_id,
        cluster=ctx.cluster_name,
        target=ctx.target_ref(),
        conversations_dir=dirs["conversations"],
        output_dir=dirs["hidden_states"],
        layers=ctx.layers(),
        tensor_parallel_size=settings.gpus_per_shard,
        expected_bytes=estimate.total_bytes,
        fingerprint=dataset_fingerprints(ctx)["hidden_states"],
        max_model_len=ctx.model.max_model_len,
        scratch_dir=EXTRACT_SCRATCH_MOUNT,
    )


HF_TOKEN_MOUNT = "/var/run/secrets/kimideploy/hub"
"""The weights download reads the hub token here: a Secret as a file, never an environment
variable (whatever the pod prints or dumps, its environment included, leaks no token)."""
EXTRACT_SCRATCH_MOUNT = "/scratch/hidden-states"
EXTRACT_SCRATCH_VOLUME = "hidden-states-scratch"


def extract_scratch_volume(ctx: PlanInputs) -> tuple[dict[str, Any], dict[str, Any]]:
    """The node-local folder the extraction engine's connector writes to."""
    size = ctx.cluster.workloads.extract.scratch_size
    volume = {"name": EXTRACT_SCRATCH_VOLUME, "emptyDir": {"sizeLimit": size}}
    return volume, {"name": EXTRACT_SCRATCH_VOLUME, "mountPath": EXTRACT_SCRATCH_MOUNT}


def vocab_spec(ctx: PlanInputs, run_id: str) -> VocabSpec:
    assert ctx.drafter is not None
    dirs = data_dirs(ctx)
    return VocabSpec(
        run_id=run_id,
        cluster=ctx.cluster_name,
        target=ctx.target_ref(),
        conversations_dir=dirs["conversations"],
        output_dir=dirs["vocab"],
        draft_vocab_size=ctx.drafter.draft_vocab_size,
        fingerprint=dataset_fingerprints(ctx)["vocab"],
    )


def train_spec(ctx: PlanInputs, run_id: str) -> TrainSpec:
    settings, drafter = ctx.cluster.workloads.train, ctx.drafter
    assert drafter is not None
    if drafter.source.oci is not None:
        raise UsageError(
            f"drafter {ctx.drafter_name} is published ({drafter.source.oci.reference}): training "
            "it again would put other weights under a name that is pinned to these",
            hint=f"name a new drafter in clusters.{ctx.cluster_name}.workloads.train.drafter "
            f"(with base_drafter: {ctx.drafter_name} to start from it)",
        )
    base = settings.base_drafter
    dirs = data_dirs(ctx)
    gpus, online_spec = ctx.cluster.gpu.per_node, None
    if online.is_online(ctx):
        gpus = online.check(ctx).trainer_gpus
        online_spec = online.online_spec(ctx, dirs["conversations"])
    return spec_from(
        TrainSpec,
        settings,
        run_id=run_id,
        cluster=ctx.cluster_name,
        shards=settings.nodes,
        target=ctx.target_ref(),
        drafter=ctx.drafter_name,
        base_drafter_path=drafter_path(base, ctx.project.eagle_drafter(base)) if base else None,
        hidden_states_dir=dirs["hidden_states"],
        vocab_dir=dirs["vocab"],
        checkpoint_dir=f"{dirs['checkpoints']}/{run_id}",
        output_dir=trained_path(ctx.drafter_name, drafter),
        layers=ctx.layers(),
        draft_vocab_size=drafter.draft_vocab_size,
        num_speculative_tokens=drafter.num_speculative_tokens,
        gpus_per_node=gpus,
        resume_dir=f"{dirs['checkpoints']}/{settings.resume_run}" if settings.resume_run else None,
        online=online_spec,
        ttt_steps=train_depth(settings.ttt_steps, drafter),
        data_fingerprint=dataset_fingerprints(ctx)[
            "conversations" if online_spec else "hidden_states"
        ],
        conversations_dir=dirs["conversations"],
        network_check=(
            NetworkCheck(min_bus_gbps=ctx.cluster.network.min_bus_gbps)
            if settings.nodes > 1
            else None
        ),
    )


def train_depth(ttt_steps: int | None, drafter: Drafter) -> int:
    """train.ttt_steps, else the drafter's k but at least speculators' default of 3."""
    return ttt_steps or max(drafter.num_speculative_tokens, 3)


def bench_spec(ctx: PlanInputs, run_id: str) -> BenchSpec:
    settings = ctx.cluster.workloads.bench
    endpoint = serve_endpoint(ctx)
    concurrency = ctx.asked(BenchAsk).concurrency or settings.concurrency
    return spec_from(
        BenchSpec,
        settings,
        run_id=run_id,
        cluster=ctx.cluster_name,
        target=ctx.target_ref(),
        endpoint=endpoint,
        metrics_url=f"{endpoint}/metrics",
        drafter=ctx.drafter_name,
        concurrency=sorted(concurrency),
        prompt_files={
            n: f"{DATASETS_MOUNT}/{path}"
            for n, path in settings.prompt_files.items()
            if n in settings.prompt_sets
        },
        results_dir=f"{data_dirs(ctx)['bench']}/{run_id}",
        baseline_path=(
            f"{data_dirs(ctx)['bench']}/{settings.baseline_run}/result.json"
            if settings.baseline_run
            else None
        ),
        synthetic=synthetic_sweep(ctx, endpoint),
        kernels=stack.kernels_fact(ctx, speculative=is_speculative(ctx)),
    )


def synthetic_sweep(ctx: PlanInputs, endpoint: str) -> SyntheticSweep | None:
    """`run calibrate`'s bench: the lengths to set, through the calibration revision's endpoints."""
    if ctx.synthetic_k is None:
        return None
    return SyntheticSweep(
        num_speculative_tokens=ctx.synthetic_k,
        acceptance_lengths=list(ctx.synthetic_lengths),
        control_url=f"{endpoint}/collective_rpc",
        reset_prefix_cache_url=f"{endpoint}/reset_prefix_cache",
    )


@dataclass(frozen=True)
class JobShape:
    """Per-workload decisions: GPUs, indexes, parallelism, retries and the entrypoint."""

    cpu: str
    memory: str
    command: list[str]
    args: list[str]
    completions: int
    parallelism: int
    retries: int
    gpus: int = 0
    shm: str = "1Gi"
    subdomain: str = ""
    port: int = 0
    env: dict[str, str] = field(default_factory=dict)
    """What its main container's engine is told besides the common env (the model runner)."""


DISRUPTED = [{"type": "DisruptionTarget", "status": "True"}]


def pod_failure_rules(container: str, gang: bool) -> list[dict[str, Any]]:
    """How the Job controller treats a failed pod.

    A gang (multi-node training: every rank in one collective) fails whole and at once when a
    rank died or was evicted: it cannot rejoin, and the others would wait out the NCCL timeout and
    the start-up budget on rented GPUs; the next run resumes from the last checkpoint
    (train.resume_run). The retry code is the exception: a rank exits with it when its target
    server dropped and did not come back in its budget, and the others when their collective with
    it fails, so every index starts again and they resume together. Independent indexes retry
    alone (backoffLimitPerIndex); an eviction and
    a checkpoint-then-exit on SIGTERM (RESUMABLE_EXIT_CODE) do not count as failures; a
    workload that exits BAD_INPUT_EXIT_CODE (bad spec, data or credentials: a retry would fail
    the same way) fails its index at once instead of spending the retries' back-off."""
    resumable = {"containerName": container, "operator": "In", "values": [RESUMABLE_EXIT_CODE]}
    if gang:
        any_failure = {"containerName": container, "operator": "NotIn", "values": [0]}
        return [
            {"action": "FailJob", "onPodConditions": DISRUPTED},
            # Every rank exits with the retry code when one of them (its server, its peers)
            # stopped for a reason a restart mends: all indexes start again and resume together.
            {"action": "Ignore", "onExitCodes": resumable},
            {"action": "FailJob", "onExitCodes": any_failure},
        ]
    bad_input = {"containerName": container, "operator": "In", "values": [BAD_INPUT_EXIT_CODE]}
    return [
        {"action": "Ignore", "onPodConditions": DISRUPTED},
        {"action": "Ignore", "onExitCodes": resumable},
        {"action": "FailIndex", "onExitCodes": bad_input},
    ]


def job_objects(ctx: PlanInputs, spec: WorkloadSpec, spec_json: str) -> list[ObjectPlan]:
    """The spec ConfigMap, the Job, and for multi-node training its headless Service."""
    shape = _job_shape(ctx, spec)
    labels = pods.standard_labels(ctx)
    common = {"name": ctx.object_name, "namespace": ctx.namespace, "labels": labels}
    # Kueue reads the queue from the Job (not its pods) and unsuspends it once admitted.
    queue = {KUEUE_QUEUE_LABEL: ctx.cluster.kueue.local_queue} if ctx.cluster.kueue else {}
    claim_vols, claim_mounts = pods.claim_volumes(ctx, workload_claims(ctx))
    spec_vol, spec_mount = pods.spec_volume(f"{ctx.object_name}-spec")
    writable_vols, writable_mounts = pods.writable_volumes()
    volumes = [*claim_vols, spec_vol, *writable_vols]
    mounts = [*claim_mounts, spec_mount, *writable_mounts]
    if shape.gpus:
        shm_vol, shm_mount = pods.shm_volume(shape.shm)
        volumes, mounts = [*volumes, shm_vol], [*mounts, shm_mount]
    artifacts = publish.pulls(ctx)
    init_containers = publish.pull_container(ctx, artifacts, spec_mount, writable_mounts)
    volumes = [*volumes, *publish.pull_volumes(ctx, artifacts)]
    own = _POD_PARTS.get(ctx.workload, _no_pod_parts)(ctx)
    volumes, mounts = [*volumes, *own.volumes], [*mounts, *own.mounts]
    if own.pulls_itself:
        init_containers = []
    if online.is_online(ctx):
        scratch_vol, scratch_mount = online.scratch_volume(ctx)
        volumes, mounts = [*volumes, scratch_vol], [*mounts, scratch_mount]
        init_containers.append(online.server_container(ctx, online.check(ctx)))
    security_context = pods.container_hardening()
    pod_annotations = dict(_settings(ctx).pod_annotations)
    resources = pods.resources(shape.cpu, shape.memory, shape.gpus)
    env = [*_job_env(ctx, shape.gpus), *({"name": k, "value": v} for k, v in shape.env.items())]
    host_network = False
    if shape.subdomain:  # ranks on several nodes: NCCL crosses the fabric
        crossing = pods.multi_node_pod(ctx)
        security_context = pods.container_hardening(tuple(crossing["capabilities"]))
        pod_annotations.update(crossing["annotations"])
        resources = pods.resources(shape.cpu, shape.memory, shape.gpus, crossing["resources"])
        env += [{"name": k, "value": v} for k, v in sorted(crossing["env"].items())]
        host_network = crossing["host_network"]
        if ctx.cluster.network.rdma_resource:
            # First of all: seconds, before the target server's ~25-minute load.
            check = pods.memlock_check_container(ctx.image.reference, security_context, mounts)
            init_containers = [check, *init_containers]
    if ctx.workload == "train" and shape.gpus:
        # The trainer's own kernels on these GPUs (FlexAttention's backward among them) before
        # the target server loads: init containers run in order, so after the locked memory.
        at = 1 if init_containers and init_containers[0]["name"] == "memlock-check" else 0
        init_containers.insert(at, train_gpu_check(ctx, shape.gpus, mounts))
    job = {
        **common,
        "labels": {**labels, **queue},
        "annotations": pods.object_annotations(ctx),
        "completions": shape.completions,
        "parallelism": shape.parallelism,
        "backoff_limit_per_index": shape.retries,
        "pod_failure_rules": pod_failure_rules(ctx.workload, gang=bool(shape.subdomain)),
        "suspend": ctx.cluster.kueue is not None,
        "ttl_s": FINISHED_JOB_TTL_S,
        "subdomain": shape.subdomain,
        "pod_labels": labels,
        "pod_annotations": pod_annotations,
        "host_network": host_network,
        "node_selector": pods.node_selector(ctx, shape.gpus),
        "tolerations": pods.tolerations(ctx),
        "security": pods.pod_security(ctx),
        "priority_class": pods.priority_class(ctx),
        "image": ctx.image.reference,
        "command": shape.command,
        "args": shape.args,
        "env": env,
        "resources": resources,
        "volumes": volumes,
        "volume_mounts": mounts,
        "security_context": security_context,
        "init_containers": init_containers,
    }
    spec_map = {**common, "name": f"{ctx.object_name}-spec", "data": pods.spec_data(ctx, spec_json)}
    stages = _STAGES.get(ctx.workload, _one_stage)
    objects = [ObjectPlan("configmap-spec", spec_map), *stages(ctx, job)]
    if shape.subdomain:
        objects.append(ObjectPlan("service-train", {**common, "port": shape.port}))
    if ctx.cluster.network_policy.enabled:
        for one in (o for o in objects if o.template.startswith("job-")):
            policy = _job_policy(ctx, one.values["name"], bool(shape.subdomain))
            objects.append(ObjectPlan("networkpolicy", policy))
    return objects


ENGINE_SHM = "64Gi"
"""/dev/shm of a pod whose vLLM engine spans the node's GPUs (NCCL's shared-memory transport)."""
AFTER_ANNOTATION = f"{pods.LABEL_PREFIX}/after"
"""On a Job of a run that is created only once the named Job of the same run has succeeded."""
STAGE_LABEL = f"{pods.LABEL_PREFIX}/stage"


@dataclass(frozen=True)
class PodParts:
    """What a kind's pods mount besides what every Job's pods mount."""

    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    pulls_itself: bool = False
    """The Job's own container is the artifact pull: no init container pulls before it."""


def _no_pod_parts(ctx: PlanInputs) -> PodParts:
    return PodParts()


def _pull_parts(ctx: PlanInputs) -> PodParts:
    # The pull is the Job's own container: the same command, Secret and CA as the init one.
    registry = publish.require_registry(ctx, "a published drafter is pulled")
    return PodParts(
        mounts=publish.secret_volumes(registry, registry.pull_secret)[1], pulls_itself=True
    )


def _weights_parts(ctx: PlanInputs) -> PodParts:
    # The one pod that downloads from the hub is the one that gets the token.
    token = ctx.model.hf_token
    if token is None:
        return PodParts()
    secret = {"secretName": token.name, "items": [{"key": token.key, "path": "token"}]}
    return PodParts(
        volumes=[{"name": "hub-token", "secret": secret}],
        mounts=[{"name": "hub-token", "mountPath": HF_TOKEN_MOUNT, "readOnly": True}],
    )


def _extract_parts(ctx: PlanInputs) -> PodParts:
    scratch_vol, scratch_mount = extract_scratch_volume(ctx)
    return PodParts(volumes=[scratch_vol], mounts=[scratch_mount])


def _publish_parts(ctx: PlanInputs) -> PodParts:
    registry = publish.require_registry(ctx, "publishing")
    auth_vols, auth_mounts = publish.secret_volumes(registry, registry.push_secret)
    return PodParts(volumes=auth_vols, mounts=auth_mounts)


_POD_PARTS: dict[str, Callable[[PlanInputs], PodParts]] = {
    "pull": _pull_parts,
    "weights": _weights_parts,
    "extract": _extract_parts,
    "publish": _publish_parts,
}
"""Per kind, the pods' own volumes and mounts; a kind not named mounts nothing more."""


def _one_stage(ctx: PlanInputs, job: dict[str, Any]) -> list[ObjectPlan]:
    return [ObjectPlan(f"job-{ctx.workload}", job)]


def _replay_jobs(ctx: PlanInputs, judge: dict[str, Any]) -> list[ObjectPlan]:
    """The replay as two Jobs, each holding only what it uses: the capture on the serving engine
    (the extraction shape's GPUs) and, created once it has succeeded, the judgement on one GPU.
    One pod with the capture as an init container would hold all the capture's GPUs for the
    judgement too: an init container's request counts for the whole pod."""
    name, image = f"{ctx.object_name}-capture", replay.capture_image(ctx)[1]
    gpus = ctx.cluster.workloads.extract.gpus_per_shard
    runner = model_runner.pinned(image, replay.capture_image(ctx)[0])
    capture_env = pods.env(
        ctx,
        gpus,
        {"KIMIDEPLOY_SPEC": SPEC_PATH, **pods.compile_cache_env(image), **runner.env()},
    )
    container = replay.capture_container(ctx, judge["volume_mounts"], capture_env)
    shm, _ = pods.shm_volume(ENGINE_SHM)
    capture = {
        **judge,
        "name": name,
        "volumes": [shm if v["name"] == shm["name"] else v for v in judge["volumes"]],
        "labels": {**judge["labels"], STAGE_LABEL: "capture"},
        "pod_labels": {**judge["pod_labels"], STAGE_LABEL: "capture"},
        "node_selector": pods.node_selector(ctx, gpus),
        "image": container["image"],
        "command": container["command"],
        "args": [],
        "env": container["env"],
        "resources": container["resources"],
    }
    judged = {
        **judge,
        "labels": {**judge["labels"], STAGE_LABEL: "judge"},
        "pod_labels": {**judge["pod_labels"], STAGE_LABEL: "judge"},
        "annotations": {**judge["annotations"], AFTER_ANNOTATION: name},
        # The capture's init containers pulled what both read onto the models volume.
        "init_containers": [],
    }
    return [ObjectPlan("job-replay", capture), ObjectPlan("job-replay", judged)]


_STAGES: dict[str, Callable[[PlanInputs, dict[str, Any]], list[ObjectPlan]]] = {
    "replay": _replay_jobs,
}
"""Per kind, the Jobs one run is made of; a kind not named is one Job."""


def _settings(ctx: PlanInputs) -> Any:
    """The kind's cluster settings (kinds.py: settings); the replay runs in the extraction's
    shape, a pull in publish's (both move an artifact between a volume and the registry)."""
    return getattr(ctx.cluster.workloads, ctx.kind.settings)


JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
"""Set by the Job controller on every pod of a Job."""


def _job_policy(ctx: PlanInputs, job: str, multi_node: bool) -> dict[str, Any]:
    """No pod reaches a batch pod, except the ranks of one multi-node training Job each other
    (the rendezvous and NCCL's sockets, whose ports are not fixed). One per Job of the run."""
    own = {JOB_NAME_LABEL: job}
    ingress = [{"from": [{"podSelector": {"matchLabels": own}}]}] if multi_node else []
    return {**pods.network_policy(ctx, own, ingress), "name": job}


def _job_env(ctx: PlanInputs, gpus: int) -> list[dict[str, Any]]:
    caches = pods.compile_cache_env(ctx.image) if "compile_cache" in workload_claims(ctx) else {}
    entries = pods.env(ctx, gpus, {"KIMIDEPLOY_SPEC": SPEC_PATH, **caches})

    # The bench measures the serve release; datagen asks it when it is the endpoint.
    settings = _settings(ctx)
    asks = isinstance(settings, DatagenSettings) and settings.asks_the_serve_release
    if ctx.kind.measures_serving or asks:
        entries += pods.api_key_env(ctx, API_KEY_ENV)
    # Declared explicitly so `$(JOB_COMPLETION_INDEX)` in the launcher's arguments always expands.
    index = {"fieldRef": {"fieldPath": INDEX_ANNOTATION}}
    return [*entries, {"name": "JOB_COMPLETION_INDEX", "valueFrom": index}]


def _job_shape(ctx: PlanInputs, spec: WorkloadSpec) -> JobShape:
    return _SHAPES.get(ctx.workload, _cpu_shape)(ctx, spec)


WORKLOADS_ENTRYPOINT = ["python", "-m", "kimideploy.workloads"]


def _cpu_shape(ctx: PlanInputs, spec: WorkloadSpec) -> JobShape:
    """datagen, vocab, bench and publish: CPU-only, one index per shard; datagen retries most
    (its requests are idempotent), publish too (a push skips the blobs already there)."""
    res = _settings(ctx).resources
    args = [ctx.workload, "--spec", SPEC_PATH]
    retries = ctx.kind.retries
    return JobShape(res.cpu, res.memory, WORKLOADS_ENTRYPOINT, args, spec.shards, spec.shards,
                    retries)  # fmt: skip


def _extract_shape(ctx: PlanInputs, spec: WorkloadSpec) -> JobShape:
    extract = ctx.cluster.workloads.extract
    gpus = extract.gpus_per_shard
    copies = max(1, ctx.cluster.total_gpus // gpus)
    args = [ctx.workload, "--spec", SPEC_PATH]
    return JobShape(
        extract.resources.cpu,
        extract.resources.memory,
        WORKLOADS_ENTRYPOINT,
        args,
        spec.shards,
        min(spec.shards, copies),
        ctx.kind.retries,
        gpus=gpus,
        shm=ENGINE_SHM,
        env=model_runner.pinned(ctx.image, ctx.image_name).env() if ctx.image.vllm else {},
    )


def _replay_shape(ctx: PlanInputs, spec: WorkloadSpec) -> JobShape:
    # The judgement: the drafters and the target's head on one GPU (the capture container
    # before it held the extraction shape's). Retried once: both stages resume.
    res = ctx.cluster.workloads.train.resources
    args = ["replay-judge", "--spec", SPEC_PATH]
    return JobShape(res.cpu, res.memory, WORKLOADS_ENTRYPOINT, args, 1, 1, ctx.kind.retries,
                    gpus=1, shm="16Gi")  # fmt: skip


def _weights_shape(ctx: PlanInputs, spec: WorkloadSpec) -> JobShape:
    # Retried like a pull: the downloader resumes every piece from its journal.
    res = _settings(ctx).resources
    args = [ctx.workload, "--spec", SPEC_PATH]
    return JobShape(res.cpu, res.memory, WORKLOADS_ENTRYPOINT, args, 1, 1, ctx.kind.retries)


def _pull_shape(ctx: PlanInputs, spec: WorkloadSpec) -> JobShape:
    # Retried like a push: ORAS resumes from the blobs already there; bad input fails at once.
    res = _settings(ctx).resources
    args = ["artifact-pull", "--spec", SPEC_PATH]
    return JobShape(res.cpu, res.memory, WORKLOADS_ENTRYPOINT, args, 1, 1, ctx.kind.retries)


TRAIN_GPU_PROBES = ["torch-arch", "flex-attention"]
"""The train image's GPU check: its torch runs on these GPUs, and the attention kernel training
runs compiles and runs forward and backward (workloads/gpucheck.py)."""
TRAIN_GPU_CHECK_TIMEOUT_S = 60


def train_gpu_check(ctx: PlanInputs, gpus: int, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    writable = [m for m in mounts if m["name"] in ("tmp", "home")]
    return {
        "name": "gpu-check",
        "image": ctx.image.reference,
        "command": pods.gpu_check_command(
            ctx, TRAIN_GPU_PROBES, TRAIN_GPU_CHECK_TIMEOUT_S, gpus=gpus
        ),
        "resources": pods.resources("1", "8Gi", gpus),
        "volumeMounts": writable,
        "securityContext": pods.container_hardening(),
    }


TRAIN_LAUNCHER = ["python", "-m", "kimideploy.workloads.launch"]
"""One worker per GPU with the variables torchrun would set, and their exit code passed to the
Job (workloads/launch.py): torchrun turns a rank's 75 or 2 into 1, which the podFailurePolicy's
resume and bad-input rules never match."""


def _train_shape(ctx: PlanInputs, spec: WorkloadSpec) -> JobShape:
    """The launcher: one node alone; static ranks from the completion index across nodes."""
    train, gpus = ctx.cluster.workloads.train, ctx.cluster.gpu.per_node
    if online.is_online(ctx):
        gpus = online.check(ctx).trainer_gpus  # the target server holds the others
    tail = ["--", "-m", "kimideploy.workloads", "train", "--spec", SPEC_PATH]
    args = [f"--nproc-per-node={gpus}"]
    subdomain = ""
    if train.nodes == 1:
        args += ["--nnodes=1", "--master-addr=127.0.0.1", f"--master-port={train.rendezvous_port}"]
    else:
        subdomain = ctx.object_name
        master = f"{ctx.object_name}-0.{subdomain}.{ctx.namespace}.svc"
        args += [
            f"--nnodes={train.nodes}",
            "--node-rank=$(JOB_COMPLETION_INDEX)",
            f"--master-addr={master}",
            f"--master-port={train.rendezvous_port}",
        ]
    return JobShape(
        train.resources.cpu,
        train.resources.memory,
        TRAIN_LAUNCHER,
        args + tail,
        completions=train.nodes,
        parallelism=train.nodes,
        retries=ctx.kind.retries,
        gpus=gpus,
        shm=train.shm_size,
        subdomain=subdomain,
        port=train.rendezvous_port,
    )


_SHAPES: dict[str, Callable[[PlanInputs, WorkloadSpec], JobShape]] = {
    "train": _train_shape,
    "extract": _extract_shape,
    "replay": _replay_shape,
    "weights": _weights_shape,
    "pull": _pull_shape,
}
"""Per kind, its Job's shape; a kind not named is a CPU Job with one index per shard."""

"""train.mode online: the target server beside each trainer, and how a node's GPUs are split.

Each trainer pod runs the target in vLLM (pinned: 0.32) as a native sidecar (an init container with
restartPolicy Always, Kubernetes >= 1.29): the trainer starts beside it and waits for it to answer
(at most the startup budget, then the pod fails and the Job's retry limit applies), it restarts on
its own if it dies, and it stops when the trainer finishes, so nothing outlives the Job. It serves
on the pod's own network and writes each request's hidden states to a pod-local emptyDir the
trainer reads and empties; nothing crosses the network or lands on a volume (300K samples
stored would be ~25 TB; docs/reference/domain.md §5). Several nodes: one server per node, each
trainer rank asks its own node's server.

The node's GPUs are split: the server takes the fewest of 1, 2, 4, 8 (its tensor parallel size)
that hold the weights plus `kv_headroom_gb` each, the trainer the rest. A target that needs every
GPU of a node (595 GB on 8 x 96 GB) cannot train online there, which is said before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimideploy.config.images import Image
from kimideploy.config.specs import OnlineTrainSpec
from kimideploy.errors import ConfigError
from kimideploy.formats import extraction_engine
from kimideploy.plan import model_runner, pods
from kimideploy.plan.inputs import PlanInputs, target_model_path
from kimideploy.plan.vllm_server import (
    READY_PATH,
    ServerBase,
    base_args,
    http_probe,
    liveness_probe,
)

SERVER_CONTAINER = "target-server"
SCRATCH_VOLUME = "hidden-states-scratch"
SCRATCH_MOUNT = "/scratch/hidden-states"
TENSOR_PARALLEL_CHOICES = (1, 2, 4, 8, 16)
MIN_KUBERNETES = (1, 29)
"""Native sidecars (initContainers with restartPolicy Always) are on by default from 1.29."""


@dataclass(frozen=True)
class OnlineLayout:
    server_gpus: int
    trainer_gpus: int
    weights_per_gpu_gb: float
    usable_per_gpu_gb: float

    def describe(self) -> str:
        return (
            f"target server on {self.server_gpus} GPUs per node (tensor parallel "
            f"{self.server_gpus}, {self.weights_per_gpu_gb:.0f} of {self.usable_per_gpu_gb:.0f} "
            f"GB each for weights), trainer on {self.trainer_gpus}"
        )


def is_online(ctx: PlanInputs) -> bool:
    return ctx.kind.trains and ctx.cluster.workloads.train.mode == "online"


def _where(ctx: PlanInputs, field: str) -> str:
    return f"clusters.{ctx.cluster_name}.workloads.train.{field}"


def layout(ctx: PlanInputs) -> OnlineLayout:
    """The GPU split of one node, or a ConfigError that says why online training cannot fit."""
    online, gpu = ctx.cluster.workloads.train.online, ctx.cluster.gpu
    weights = ctx.model.weights_gb
    usable = gpu.memory_gb * online.gpu_memory_utilization

    def fits(tp: int) -> bool:
        return weights / tp + online.kv_headroom_gb <= usable

    need = f"{weights:g} GB of weights + {online.kv_headroom_gb:g} GB headroom per GPU"
    if online.server_gpus is not None:
        tp = online.server_gpus
        if tp not in TENSOR_PARALLEL_CHOICES or tp >= gpu.per_node:
            raise ConfigError(
                f"{_where(ctx, 'online.server_gpus')}: {tp} must be one of "
                f"{', '.join(map(str, TENSOR_PARALLEL_CHOICES))} and leave the trainer at least "
                f"one of the node's {gpu.per_node} GPUs",
                hint="leave it unset to take the fewest GPUs that hold the target",
            )
        if not fits(tp):
            raise ConfigError(
                f"{_where(ctx, 'online.server_gpus')}: {tp} x {gpu.memory_gb:g} GB "
                f"({usable:.0f} GB usable each) cannot hold {need}",
                hint="raise server_gpus or leave it unset",
            )
    else:
        fitting = [t for t in TENSOR_PARALLEL_CHOICES if t <= gpu.per_node and fits(t)]
        tp = fitting[0] if fitting else gpu.per_node
        if not fitting or tp >= gpu.per_node:
            raise ConfigError(
                f"{_where(ctx, 'mode')}: online training cannot fit on {ctx.cluster_name}: the "
                f"target needs {tp if fitting else 'more than ' + str(gpu.per_node)} of the "
                f"node's {gpu.per_node} x {gpu.memory_gb:g} GB GPUs ({need}, "
                f"{online.gpu_memory_utilization:.0%} usable), leaving none for the trainer",
                hint="train offline here (`kimideploy run extract`, then train.mode: offline), "
                "or online on a cluster with larger GPUs",
            )
    return OnlineLayout(tp, gpu.per_node - tp, weights / tp, usable)


def check(ctx: PlanInputs) -> OnlineLayout:
    """Everything that must hold before an online run is rendered, checked from the config."""
    train = ctx.cluster.workloads.train
    found = extraction_engine.version_tuple(ctx.cluster.kubernetes_version)
    if found < MIN_KUBERNETES:
        raise ConfigError(
            f"clusters.{ctx.cluster_name}.kubernetes_version: {ctx.cluster.kubernetes_version} "
            "has no native sidecar containers, which online training runs its target server as",
            hint="online training needs Kubernetes >= 1.29; train offline on this cluster",
        )
    image_name = ctx.cluster.images.extract
    model = ctx.model
    problem = extraction_engine.image_problem(
        server_image(ctx).vllm, model.text_model_type or model.model_type
    )
    if problem:
        raise ConfigError(
            f"clusters.{ctx.cluster_name}.images.extract: {image_name} {problem} (the target "
            "server of online training runs extract_hidden_states)",
            hint="point images.extract at a vLLM 0.32 image such as vllm-0.32-kimi",
        )
    if train.max_seq_len + 2 > model.max_model_len:
        raise ConfigError(
            f"{_where(ctx, 'max_seq_len')}: {train.max_seq_len} tokens plus the one sampled "
            f"token exceed the model's max_model_len {model.max_model_len}",
            hint=f"lower train.max_seq_len to at most {model.max_model_len - 2}",
        )
    return layout(ctx)


def server_image(ctx: PlanInputs) -> Image:
    return ctx.project.images[ctx.cluster.images.extract]


def server_args(
    server: ServerBase, *, dtype: str, vllm_ids: list[int], num_hidden_layers: int, storage: str
) -> list[str]:
    """`vllm serve MODEL` arguments of the target server (the pipeline tier runs them): the base
    both servers share, the dtype, and the hidden-state extraction of layers `vllm_ids`."""
    flags = [
        *base_args(server, "--dtype", dtype),
        *extraction_engine.serve_flags(vllm_ids, num_hidden_layers, storage),
    ]
    return [pods.literal(a) for a in flags]


def server_container(ctx: PlanInputs, split: OnlineLayout) -> dict[str, Any]:
    train, model = ctx.cluster.workloads.train, ctx.model
    online = train.online
    image = server_image(ctx)
    runner = model_runner.pinned(image, ctx.cluster.images.extract)
    server = ServerBase(
        served_name=model.served_name,
        port=online.port,
        tensor_parallel_size=split.server_gpus,
        max_model_len=train.max_seq_len + 2,
        gpu_memory_utilization=online.gpu_memory_utilization,
        trust_remote_code=model.trust_remote_code,
    )
    args = server_args(
        server,
        dtype=ctx.cluster.workloads.extract.dtype,
        vllm_ids=ctx.layers().vllm_ids,
        num_hidden_layers=model.num_hidden_layers,
        storage=SCRATCH_MOUNT,
    )
    period = 10
    _, claim_mounts = pods.claim_volumes(ctx, {"models": True, "compile_cache": False})
    _, scratch_mount = scratch_volume(ctx)
    _, shm_mount = pods.shm_volume(train.shm_size)
    return {
        "name": SERVER_CONTAINER,
        "image": image.reference,
        "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        "command": ["vllm", "serve", target_model_path(ctx.model)],
        "args": args,
        "env": pods.env(
            ctx,
            split.server_gpus,
            {"HF_HUB_OFFLINE": "1", **pods.compile_cache_env(image), **runner.env()},
        ),
        "ports": [{"name": "http", "containerPort": online.port, "protocol": "TCP"}],
        "resources": pods.resources(
            online.server_resources.cpu, online.server_resources.memory, split.server_gpus
        ),
        # No startupProbe: on a sidecar it would hold the trainer back, and a server that never
        # loads would then restart forever in a pod that never fails. The trainer waits for the
        # server itself (OnlineTrainSpec.server_wait_s = startup_budget_s) and exits 1 when the
        # budget runs out, so the Job's retry limit bounds a broken server. Readiness only tells
        # `kimideploy run` that the load is done; liveness starts once the budget has passed.
        "readinessProbe": http_probe(READY_PATH, online.port, period, 5, failures=1),
        "livenessProbe": liveness_probe(online.port, initial_delay_s=online.startup_budget_s),
        "volumeMounts": [*claim_mounts, scratch_mount, shm_mount, *pods.writable_volumes()[1]],
        "securityContext": pods.container_hardening(
            runAsUser=image.run_as_user, runAsGroup=image.run_as_user
        ),
    }


def scratch_volume(ctx: PlanInputs) -> tuple[dict[str, Any], dict[str, Any]]:
    size = ctx.cluster.workloads.train.online.scratch_size
    volume = {"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": size}}
    return volume, {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_MOUNT}


def online_spec(ctx: PlanInputs, conversations_dir: str) -> OnlineTrainSpec:
    online, model = ctx.cluster.workloads.train.online, ctx.model
    return OnlineTrainSpec(
        endpoint=f"http://127.0.0.1:{online.port}/v1",
        storage_dir=SCRATCH_MOUNT,
        conversations_dir=conversations_dir,
        aux_layer_ids=extraction_engine.aux_layer_ids(
            ctx.layers().vllm_ids, model.num_hidden_layers
        ),
        request_timeout_s=online.request_timeout_s,
        max_retries=online.max_retries,
        server_wait_s=online.startup_budget_s,
        concurrency=online.concurrency,
    )

"""The host side of a serve start: can a restart find the checkpoint in the page cache, and which
reader vLLM uses for the storage it is on.

vLLM 0.32's default loader (model_executor/model_loader/weight_utils.py) maps every safetensors
file on every tensor-parallel rank; it prefetches into the page cache only on nfs/nfs4/lustre,
and only when the checkpoint fits 90% of the RAM its cgroup has left. A page read by the serve
container is charged to the container's memory cgroup, so a pod whose limit is below the
checkpoint (the PCIe host's 384Gi against 595 GB) evicts its own pages while it loads, and a
restart reads the storage again, however much RAM the node has. Pages charged elsewhere are not
reclaimed by the pod's limit and are hits for its reads.

So, where the limit cannot hold the checkpoint and the node has the RAM:
- raise-limit: the serve container's limit becomes what it needs (the checkpoint, vLLM's own
  processes, /dev/shm); its request stays as configured;
- warmer: a Job on every GPU node reads the checkpoint under a limit of its own before the serve
  pod starts (workloads/page_cache.py); when it ends its pages stay cached, charged to the
  node's parent cgroup, and the serve pod's reads hit them.
Neither fits: a warning with the numbers (every restart reads the storage).

The reader: prefetch (each rank reads its share of the files into the page cache with several
threads, then maps them) where the cache can hold the checkpoint; lazy (map and read on demand)
where it cannot, since a prefetch would evict its own pages. On a shared filesystem whose
measured read bandwidth (the storage probe) is below workloads.serve.load.min_read_gbps, the
weights are copied once to each node's local NVMe (storage.node_local) and served from there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from kimideploy.config.base import quantity_to_float
from kimideploy.formats.extraction_engine import version_tuple
from kimideploy.plan import pods
from kimideploy.plan.inputs import MODELS_MOUNT, PlanInputs, target_model_path
from kimideploy.plan.model import ObjectPlan

GIB = 2**30
PROCESS_BYTES_PER_RANK = 8 * GIB
"""Host memory of one vLLM worker process besides the mapped checkpoint (CUDA context, pinned
staging buffers, Python): a planning prior, conservative by design."""
PROCESS_BYTES_BASE = 8 * GIB
"""The API server and the engine core."""
NODE_RESERVED_BYTES = 32 * GIB
"""What the node keeps for itself (kubelet, the runtime, the OS) out of its RAM."""
WARM_WORTH_BYTES = 10 * 10**9
"""Below this the checkpoint reads in seconds anyway: a cold restart is said, not warned of."""
SHARED_PREFETCH_THREADS = 16
LOCAL_PREFETCH_THREADS = 4


@dataclass(frozen=True)
class PageCachePlan:
    """Whether a restart of the serve pods can be warm, and what the plan did for it."""

    checkpoint_bytes: int
    limit_bytes: int
    """The serve container's memory limit as configured."""
    needed_bytes: int
    """The checkpoint, the processes and /dev/shm: what a limit must hold for a warm restart."""
    node_bytes: int | None
    decision: str
    """"fits" (warm under the configured limit), "raise-limit", "warmer", "never" (no restart
    can be warm: a warning), "unknown" (node RAM unknown: a warning), "off" (as configured)."""
    limit_after_bytes: int
    """The serve container's limit the plan renders."""

    @property
    def warm(self) -> bool:
        return self.decision in ("fits", "raise-limit", "warmer")

    @property
    def worth_a_warning(self) -> bool:
        """Cold restarts of a checkpoint a start reads noticeably long (WARM_WORTH_BYTES)."""
        return not self.warm and self.checkpoint_bytes >= WARM_WORTH_BYTES

    def describe(self) -> str:
        checkpoint, limit = _gb(self.checkpoint_bytes), _gib(self.limit_bytes)
        node = f"{self.node_bytes / 1e9:.0f} GB" if self.node_bytes else "unknown"
        needed = _gib(self.needed_bytes)
        return {
            "fits": f"warm restarts: the checkpoint ({checkpoint}) stays in the page cache "
            f"under the serve container's {limit} limit (it needs {needed})",
            "raise-limit": f"the serve container's memory limit is raised from {limit} to "
            f"{_gib(self.limit_after_bytes)} so its page cache holds the checkpoint "
            f"({checkpoint}) across restarts (the node has {node})",
            "warmer": f"a page-cache warmer Job reads the checkpoint ({checkpoint}) on every "
            f"GPU node before the serve pod starts; the pod keeps its {limit} limit (the node "
            f"has {node})",
            "never": f"no restart can be warm: the checkpoint ({checkpoint}) and the serve "
            f"pod ({needed} with it) do not fit the node's {node} RAM",
            "unknown": f"restarts are cold: the serve container's {limit} limit cannot hold "
            f"the checkpoint ({checkpoint}, {needed} with the processes), and the node's RAM "
            "is unknown",
            "off": f"restarts are cold: the serve container's {limit} limit cannot hold the "
            f"checkpoint ({checkpoint}); page_cache is off",
        }[self.decision]


@dataclass(frozen=True)
class LoadPlan:
    """How vLLM reads the weights: its strategy and threads, from where, and why."""

    strategy: str
    """lazy, eager or prefetch (the --safetensors-load-strategy value)."""
    threads: int | None
    local_copy: bool
    reason: str

    def args(self) -> list[str]:
        args = ["--safetensors-load-strategy", self.strategy]
        if self.strategy == "prefetch" and self.threads is not None:
            args += ["--safetensors-prefetch-num-threads", str(self.threads)]
        return args


def _gb(value: float) -> str:
    return f"{value / 1e9:.0f} GB"


def _gib(value: float) -> str:
    return f"{math.ceil(value / GIB)}Gi"


def page_cache_plan(ctx: PlanInputs) -> PageCachePlan:
    """The serve pods' page cache against the checkpoint: warm restarts, and how."""
    serve = ctx.cluster.workloads.serve
    checkpoint = int(ctx.model.weights_gb * 1e9)
    limit = int(quantity_to_float(serve.resources.memory))
    ranks = ctx.cluster.gpu.per_node
    # /dev/shm's size is a cap NCCL uses little of, not a use: it is not counted.
    needed = checkpoint + PROCESS_BYTES_BASE + ranks * PROCESS_BYTES_PER_RANK
    node = int(ctx.cluster.node_memory_gb * 1e9) if ctx.cluster.node_memory_gb else None
    usable = node - NODE_RESERVED_BYTES if node else None
    choice = serve.load.page_cache

    def planned(decision: str, after: int = limit) -> PageCachePlan:
        return PageCachePlan(checkpoint, limit, needed, node, decision, after)

    if limit >= needed:
        return planned("fits")
    if choice == "off":
        return planned("off")
    if usable is None:
        return planned("unknown")
    if choice in ("auto", "raise-limit") and usable >= needed:
        return planned("raise-limit", math.ceil(needed / GIB) * GIB)
    # auto prefers the raised limit: one pod, nothing to run first.
    # Warmed outside the pod, the checkpoint's pages and what the pod itself uses (not its whole
    # limit: the pages are reclaimed before an allocation fails) share the node.
    if choice in ("auto", "warmer") and usable >= needed:
        return planned("warmer")
    return planned("never")


def memory_limit(ctx: PlanInputs) -> str:
    """The serve container's memory limit as rendered: the configured one, or the raised one."""
    cache = page_cache_plan(ctx)
    if cache.decision == "raise-limit":
        return f"{cache.limit_after_bytes // GIB}Gi"
    return ctx.cluster.workloads.serve.resources.memory


def needs_measurement(ctx: PlanInputs) -> bool:
    """Whether the reader waits on a storage measurement this cluster lacks: a shared models
    claim, a node-local folder to copy to, local_copy auto, nothing measured yet."""
    load, storage = ctx.cluster.workloads.serve.load, ctx.cluster.storage
    return (
        storage.node_local is not None
        and load.local_copy == "auto"
        and storage.models.access_mode == "ReadWriteMany"
        and ctx.storage_read_gbps is None
    )


def load_plan(ctx: PlanInputs, read_gbps: float | None) -> LoadPlan:
    """The reader for this cluster's storage; `read_gbps` is the models claim's measured read
    bandwidth (the storage probe), None where it was never measured."""
    load = ctx.cluster.workloads.serve.load
    storage = ctx.cluster.storage
    shared = storage.models.access_mode == "ReadWriteMany"
    slow = read_gbps is not None and read_gbps < load.min_read_gbps
    copy = storage.node_local is not None and (
        load.local_copy == "always" or (load.local_copy == "auto" and shared and slow)
    )
    on_shared = shared and not copy
    threads = load.prefetch_threads or (
        SHARED_PREFETCH_THREADS if on_shared else LOCAL_PREFETCH_THREADS
    )
    where = (
        "node-local NVMe (a copy)" if copy else "a shared filesystem" if shared else "local storage"
    )
    measured = f", measured {read_gbps:.1f} GB/s" if read_gbps is not None else ""
    engine = ctx.image.vllm
    has_prefetch = engine is None or version_tuple(engine) >= PREFETCH_MIN_VLLM
    if load.strategy != "auto":
        configured_threads = threads if has_prefetch else None
        return LoadPlan(
            load.strategy, configured_threads, copy, f"{load.strategy} as configured ({where})"
        )
    cache = page_cache_plan(ctx)
    if cache.warm and not has_prefetch:
        reason = (
            f"lazy: vLLM {engine} has no prefetch strategy (vLLM "
            f"{'.'.join(map(str, PREFETCH_MIN_VLLM))} has); weights mapped and read on demand "
            f"from {where}{measured}, from the page cache once it is warm"
        )
        return LoadPlan("lazy", None, copy, reason)
    if cache.warm:
        reason = (
            f"prefetch: the weights are on {where}{measured}; each rank reads its share of the "
            f"files into the page cache with {threads} threads, which can hold them"
        )
        return LoadPlan("prefetch", threads, copy, reason)
    reason = (
        f"lazy: the page cache cannot hold the checkpoint (see page cache), so a prefetch "
        f"would evict its own pages; weights mapped and read on demand from {where}{measured}"
    )
    return LoadPlan("lazy", None, copy, reason)


PREFETCH_MIN_VLLM = (0, 32)
"""The first pinned vLLM read with --safetensors-load-strategy prefetch and
--safetensors-prefetch-num-threads (0.16 rejects the threads flag: tests/images)."""

WARMER = "page-cache-warmer"
STORAGE_PROBE = "storage-probe"
LOCAL_COPY = "local-copy"
PROBE_CONTAINER = "probe"
LOCAL_MOUNT = "/node-local"
"""Where the node-local NVMe folder (storage.node_local) is mounted in the pods."""
PROBE_SAMPLE_GB = 20.0
"""How much of the checkpoint the storage probe reads (cold): enough to pass a filesystem's
caches and burst credits, a minute on a slow one."""


def _reader_job(
    ctx: PlanInputs,
    component: str,
    command: list[str],
    *,
    memory_limit: str,
    per_node: bool,
    local: bool = False,
) -> ObjectPlan:
    """A Job running workloads/page_cache.py on the GPU nodes (one pod per node with `per_node`,
    an anti-affinity spreading them), the models claim mounted read-only as the serve pod mounts
    it, and the node-local folder writable with `local`."""
    image = ctx.project.images[ctx.cluster.images.publish or ctx.cluster.images.vocab]
    volumes, mounts = pods.claim_volumes(ctx, {"models": True})
    writable_volumes, writable_mounts = pods.writable_volumes()
    if local:
        volumes, mounts = [*volumes, node_local_volume(ctx)], [*mounts, node_local_mount(False)]
    job = pods.probe_job(
        ctx,
        component=component,
        fail_at_once={"containerName": PROBE_CONTAINER, "operator": "In", "values": [1, 2]},
        pod_annotations={},
        container={
            "node_selector": pods.node_selector(ctx, 1),
            "image": image.reference,
            "command": ["python", "-m", "kimideploy.workloads.page_cache", *command],
            "args": [],
            "env": [],
            "resources": pods.resources("4", "1Gi", 0, memory_limit=memory_limit),
            "volumes": [*volumes, *writable_volumes],
            "volume_mounts": [*mounts, *writable_mounts],
        },
    )
    nodes = ctx.cluster.nodes if per_node else 1
    spread: dict[str, Any] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/component": component}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    values = {**job.values, "completions": nodes, "parallelism": nodes}
    if per_node and nodes > 1:
        values["affinity"] = spread
    return replace(job, values=values)


def node_local_volume(ctx: PlanInputs) -> dict[str, Any]:
    """The node's NVMe folder: a host path (the namespace's Pod Security level must allow
    host paths: `baseline` does not)."""
    local = ctx.cluster.storage.node_local
    assert local is not None
    return {"name": "node-local", "hostPath": {"path": local.path, "type": "DirectoryOrCreate"}}


def node_local_mount(read_only: bool) -> dict[str, Any]:
    return {"name": "node-local", "mountPath": LOCAL_MOUNT, "readOnly": read_only}


def local_target_path(ctx: PlanInputs) -> str:
    """The target's folder in the node-local copy (the same path below /models)."""
    return LOCAL_MOUNT + target_model_path(ctx.model).removeprefix(MODELS_MOUNT)


def warmer_job(ctx: PlanInputs) -> ObjectPlan | None:
    """The page-cache warmer, where the page-cache plan chose it: every GPU node reads the
    checkpoint under a limit that holds it, before the serve pod starts."""
    if not ctx.kind.release or page_cache_plan(ctx).decision != "warmer":
        return None
    cache = page_cache_plan(ctx)
    limit = f"{math.ceil(cache.checkpoint_bytes / GIB) + 4}Gi"
    source = (
        local_target_path(ctx)
        if load_plan(ctx, ctx.storage_read_gbps).local_copy
        else (target_model_path(ctx.model))
    )
    threads = load_plan(ctx, ctx.storage_read_gbps).threads or SHARED_PREFETCH_THREADS
    command = ["warm", source, "--threads", str(threads)]
    local = load_plan(ctx, ctx.storage_read_gbps).local_copy
    return _reader_job(ctx, WARMER, command, memory_limit=limit, per_node=True, local=local)


def storage_probe_job(ctx: PlanInputs) -> ObjectPlan:
    """The storage probe: one pod reads PROBE_SAMPLE_GB of the checkpoint cold from the models
    claim as the serve pod mounts it; its GB/s is recorded on the cluster."""
    command = [
        "probe",
        target_model_path(ctx.model),
        "--sample-gb",
        str(PROBE_SAMPLE_GB),
        "--threads",
        str(SHARED_PREFETCH_THREADS),
    ]
    return _reader_job(ctx, STORAGE_PROBE, command, memory_limit="2Gi", per_node=False)


def local_copy_job(ctx: PlanInputs) -> ObjectPlan | None:
    """Where the target is served from node-local NVMe: a copy on every GPU node (resumable; a
    node that has it whole only compares sizes)."""
    if not ctx.kind.release or not load_plan(ctx, ctx.storage_read_gbps).local_copy:
        return None
    command = [
        "copy",
        target_model_path(ctx.model),
        "--to",
        local_target_path(ctx),
        "--threads",
        str(SHARED_PREFETCH_THREADS),
    ]
    return _reader_job(ctx, LOCAL_COPY, command, memory_limit="4Gi", per_node=True, local=True)

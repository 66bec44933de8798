"""Values shared by every pod: labels, scheduling, security, environment, volumes."""

from __future__ import annotations

from typing import Any

from kimideploy import __version__
from kimideploy.config.images import Image
from kimideploy.config.specs import SPEC_FILE_NAME, SPEC_MOUNT_DIR
from kimideploy.plan.inputs import (
    CHECKPOINTS_MOUNT,
    COMPILE_CACHE_MOUNT,
    DATASETS_MOUNT,
    HIDDEN_STATES_MOUNT,
    MODELS_MOUNT,
    PlanInputs,
)
from kimideploy.plan.model import ObjectPlan

CLAIM_MOUNTS = {
    "models": MODELS_MOUNT,
    "datasets": DATASETS_MOUNT,
    "hidden_states": HIDDEN_STATES_MOUNT,
    "checkpoints": CHECKPOINTS_MOUNT,
    "compile_cache": COMPILE_CACHE_MOUNT,
}


def compile_cache_env(image: Image) -> dict[str, str]:
    """Where torch.compile, Triton, vLLM and FlashInfer keep what they compile: the compile-cache
    claim, in a folder of this image's digest (kernels compiled by one image's torch, Triton and
    CUDA are never loaded by another; a rollback to an older image finds its own again)."""
    root = f"{COMPILE_CACHE_MOUNT}/{image.digest.removeprefix('sha256:')[:16]}"
    return {
        "TORCHINDUCTOR_CACHE_DIR": f"{root}/inductor",
        "TRITON_CACHE_DIR": f"{root}/triton",
        "VLLM_CACHE_ROOT": f"{root}/vllm",
        "FLASHINFER_WORKSPACE_BASE": f"{root}/flashinfer",
    }


def compile_cache_mount() -> dict[str, Any]:
    return {"name": "compile-cache", "mountPath": COMPILE_CACHE_MOUNT, "readOnly": False}


LABEL_PREFIX = "kimideploy.io"
PROBE_TTL_S = 300
"""A probe Job's pod stays this long after it ends, for `kubectl logs` when its command failed."""
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


def selector_labels(ctx: PlanInputs) -> dict[str, str]:
    """Labels a Deployment selects on: stable for the release's life (selectors are immutable)."""
    return {
        "app.kubernetes.io/instance": ctx.release,
        "app.kubernetes.io/component": ctx.component,
    }


CALIBRATION_K_LABEL = f"{LABEL_PREFIX}/calibration-k"


def standard_labels(ctx: PlanInputs, component: str | None = None) -> dict[str, str]:
    version = ctx.image.vllm or ctx.image.speculators or ctx.image_name
    labels = {
        "app.kubernetes.io/name": ctx.project.name,
        "app.kubernetes.io/instance": ctx.release,
        "app.kubernetes.io/component": component or ctx.component,
        "app.kubernetes.io/version": version,
        "app.kubernetes.io/managed-by": "kimideploy",
        "app.kubernetes.io/part-of": "kimideploy",
        f"{LABEL_PREFIX}/cluster": ctx.cluster_name,
        f"{LABEL_PREFIX}/drafter": ctx.drafter_name,
    }
    if ctx.synthetic_k is not None:
        labels[CALIBRATION_K_LABEL] = str(ctx.synthetic_k)  # `run calibrate`'s revision and bench
    if ctx.run_id is not None:
        # Jobs only: on serve a changing label would restart pods on any config edit.
        labels[f"{LABEL_PREFIX}/run-id"] = ctx.run_id
        labels[f"{LABEL_PREFIX}/config-hash"] = ctx.config_sha256[:12]
    return labels


def object_annotations(ctx: PlanInputs) -> dict[str, str]:
    return {
        f"{LABEL_PREFIX}/config-sha256": ctx.config_sha256,
        f"{LABEL_PREFIX}/kimideploy-version": __version__,
    }


def node_selector(ctx: PlanInputs, gpus: int) -> dict[str, str]:
    selector = dict(sorted(ctx.cluster.node_selector.items()))
    if gpus:
        selector[GPU_PRODUCT_LABEL] = ctx.cluster.gpu.product
    return selector


def priority_class(ctx: PlanInputs) -> str:
    """The cluster's class for this workload, '' when the cluster profile sets none."""
    classes = ctx.cluster.priority_classes
    if classes is None:
        return ""
    return classes.serve if ctx.kind.release else classes.batch


def api_key_env(ctx: PlanInputs, variable: str) -> list[dict[str, Any]]:
    """The serve release's API key from its Secret, as `variable`; nothing when none is set."""
    secret = ctx.cluster.workloads.serve.api_key
    if secret is None:
        return []
    ref = {"secretKeyRef": {"name": secret.name, "key": secret.key}}
    return [{"name": variable, "valueFrom": ref}]


def network_policy(
    ctx: PlanInputs, pod_selector: dict[str, str], ingress: list[dict[str, Any]]
) -> dict[str, Any]:
    """Values of a NetworkPolicy for the workload's pods; `ingress` [] admits nothing."""
    return {
        "name": ctx.object_name,
        "namespace": ctx.namespace,
        "labels": standard_labels(ctx),
        "pod_selector": pod_selector,
        "ingress": ingress,
    }


def serve_ingress(ctx: PlanInputs, port: int) -> list[dict[str, Any]]:
    """Who may reach the serve pods' API port: the namespace's own pods (bench, datagen,
    clients), the monitoring and client namespaces, and the API server's pod proxy."""
    settings = ctx.cluster.network_policy
    peers: list[dict[str, Any]] = [{"podSelector": {}}]
    for namespace in [*settings.monitoring_namespaces, *settings.client_namespaces]:
        peers.append(
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
        )
    gateway = ctx.cluster.gateway
    if gateway is not None and gateway.namespace and gateway.namespace != ctx.namespace:
        # The Gateway's data plane forwards the route's requests from its own namespace.
        peers.append(
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": gateway.namespace}
                }
            }
        )
    peers += [{"ipBlock": {"cidr": cidr}} for cidr in settings.api_server_cidrs]
    return [{"from": peers, "ports": [{"port": port, "protocol": "TCP"}]}]


def tolerations(ctx: PlanInputs) -> list[dict[str, Any]]:
    return [t.model_dump(exclude_none=True) for t in ctx.cluster.tolerations]


def resources(
    cpu: str,
    memory: str,
    gpus: int,
    devices: dict[str, str] | None = None,
    *,
    memory_limit: str | None = None,
) -> dict[str, dict[str, str]]:
    """Requests equal limits for GPU pods: extended resources (GPUs, RDMA devices) cannot be
    overcommitted. `memory_limit` above the request lets the page cache hold more than the pod
    reserves (the serve pod's checkpoint: plan/page_cache.py)."""
    requests = {"cpu": cpu, "memory": memory}
    limits = {"memory": memory_limit or memory}
    if gpus:
        requests[GPU_RESOURCE] = str(gpus)
        limits[GPU_RESOURCE] = str(gpus)
    else:
        # CPU pods are capped at what they ask for. GPU pods are not: a CFS quota throttles
        # the threads that feed the GPUs (NCCL proxies, vLLM's scheduler and workers), and a
        # throttled period stalls all eight GPUs; the node is theirs anyway (a documented
        # exception to the CPU-limit policy, see docs/reference/security.md).
        limits["cpu"] = cpu
    for name, count in (devices or {}).items():
        requests[name] = count
        limits[name] = count
    return {"requests": requests, "limits": limits}


def container_hardening(added: tuple[str, ...] = (), **first: Any) -> dict[str, Any]:
    """Every container's securityContext, after what a container sets first (its user, say):
    no privilege escalation, no capabilities but `added` (IPC_LOCK for NCCL over RDMA), and a
    read-only root filesystem (what vLLM, torch and the workloads write goes to the volumes and
    to the emptyDirs of writable_volumes)."""
    capabilities: dict[str, list[str]] = {"drop": ["ALL"]}
    if added:
        capabilities["add"] = list(added)
    return {
        **first,
        "allowPrivilegeEscalation": False,
        "capabilities": capabilities,
        "readOnlyRootFilesystem": True,
    }


HOME_DIR = "/home/kimideploy"
WRITABLE_SIZE = "16Gi"
"""Each of /tmp and HOME: torch.compile and Triton caches, vLLM's IPC sockets and config,
torchrun's rendezvous files, Hugging Face's module cache (trust_remote_code) live there."""


def writable_volumes() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The only writable places besides the claims, in every container (root is read-only)."""
    volumes = [{"name": name, "emptyDir": {"sizeLimit": WRITABLE_SIZE}} for name in ("tmp", "home")]
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "home", "mountPath": HOME_DIR}]
    return volumes, mounts


def pod_security(ctx: PlanInputs) -> dict[str, Any]:
    uid = ctx.image.run_as_user
    return {
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "runAsNonRoot": uid != 0,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def literal(value: str) -> str:
    """A user string Kubernetes must not expand: it replaces `$(NAME)` in args, commands and env
    values with that variable's value (HF_TOKEN included), and `$$(` is its escape."""
    return value.replace("$(", "$$(")


def env(ctx: PlanInputs, gpus: int, extra: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """GPU pods get the cluster's NCCL settings; every value is literal (no `$(` expansion)."""
    plain = {"KIMIDEPLOY_CLUSTER": ctx.cluster_name, "PYTHONUNBUFFERED": "1", "HOME": HOME_DIR}
    if gpus:
        plain.update(nccl_env(ctx))
        if ctx.cluster.network.nccl_topology:
            plain["NCCL_TOPO_FILE"] = f"{SPEC_MOUNT_DIR}/{NCCL_TOPOLOGY_FILE_NAME}"
        plain.update(ctx.cluster.env)
    plain.update(extra or {})
    # No HF_TOKEN: only the weights download gets one (jobs._job_env); serve runs with
    # HF_HUB_OFFLINE=1, and no other pod gets a credential it does not use.
    return [{"name": k, "value": literal(v)} for k, v in sorted(plain.items())]


def nccl_env(ctx: PlanInputs) -> dict[str, str]:
    """NCCL's view of the machines from clusters.X.network: the compute HCAs exactly (a bare
    prefix also matches front-end and storage NICs), the bootstrap interface, the protocol."""
    network = ctx.cluster.network
    found = {}
    if network.ib_hcas:
        found["NCCL_IB_HCA"] = "=" + ",".join(network.ib_hcas)
    if network.socket_ifname:
        found["NCCL_SOCKET_IFNAME"] = network.socket_ifname
    if network.nccl_protocol:
        found["NCCL_PROTO"] = network.nccl_protocol
    return found


NCCL_LOG_ENV = {
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,NET",
    "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p.log",
}
"""Multi-node pods log NCCL's transport choice to a file (not their output), which the
pre-training all-reduce reads to tell InfiniBand from a fall-back to sockets."""


def multi_node_pod(ctx: PlanInputs) -> dict[str, Any]:
    """What a pod whose NCCL crosses nodes needs from clusters.X.network: the RDMA device, the
    node's network or an SR-IOV attachment, and IPC_LOCK (effective only for a root process; for
    the non-root trainer the node's runtime must set LimitMEMLOCK, which memlock_check_container
    checks first)."""
    network = ctx.cluster.network
    rdma = {network.rdma_resource: str(network.rdma_per_pod)} if network.rdma_resource else {}
    annotations = (
        {"k8s.v1.cni.cncf.io/networks": ",".join(network.network_attachments)}
        if network.network_attachments
        else {}
    )
    return {
        "resources": rdma,
        "host_network": network.host_network,
        "annotations": annotations,
        "capabilities": ["IPC_LOCK"],
        "env": NCCL_LOG_ENV,
    }


def memlock_check_container(
    image: str, security_context: dict[str, Any], mounts: list[dict[str, Any]]
) -> dict[str, Any]:
    """The trainer's first init container: the process that will run NCCL (same image, user and
    capabilities) must be able to pin memory for InfiniBand, else the pod fails at once naming
    the node's fix (workloads/memlock_check.py): IPC_LOCK in capabilities.add does not reach a
    non-root process, so the limit has to come from the node's container runtime."""
    writable = [m for m in mounts if m["name"] in ("tmp", "home")]
    return {
        "name": "memlock-check",
        "image": image,
        "command": ["python", "-m", "kimideploy.workloads.memlock_check"],
        "resources": resources("100m", "64Mi", 0),
        "volumeMounts": writable,
        "securityContext": security_context,
    }


def claim_volumes(ctx: PlanInputs, claims: dict[str, bool]) -> tuple[list[Any], list[Any]]:
    """Volumes and mounts for the named claims; the bool says read-only."""
    volumes, mounts = [], []
    for claim, read_only in claims.items():
        name = claim.replace("_", "-")
        volumes.append(
            {"name": name, "persistentVolumeClaim": {"claimName": ctx.claim_name(claim)}}
        )
        mounts.append({"name": name, "mountPath": CLAIM_MOUNTS[claim], "readOnly": read_only})
    return volumes, mounts


def shm_volume(size: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """NCCL and torch need a large /dev/shm; the container default is 64 MiB."""
    volume = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}
    return volume, {"name": "dshm", "mountPath": "/dev/shm"}


NCCL_TOPOLOGY_FILE_NAME = "nccl-topology.xml"
"""network.nccl_topology travels beside spec.json in the spec ConfigMap (NCCL_TOPO_FILE)."""


def spec_data(ctx: PlanInputs, spec_json: str) -> dict[str, str]:
    """The spec ConfigMap's files: spec.json, and the cluster's NCCL topology where it has one
    (every pod of the workload mounts it; only GPU pods' NCCL_TOPO_FILE points at it)."""
    data = {SPEC_FILE_NAME: spec_json}
    if ctx.cluster.network.nccl_topology:
        data[NCCL_TOPOLOGY_FILE_NAME] = ctx.cluster.network.nccl_topology
    return data


def spec_volume(config_map: str) -> tuple[dict[str, Any], dict[str, Any]]:
    volume = {"name": "spec", "configMap": {"name": config_map}}
    return volume, {"name": "spec", "mountPath": SPEC_MOUNT_DIR, "readOnly": True}


def gpu_check_command(
    ctx: PlanInputs, probes: list[str], timeout_s: int, gpus: int | None = None
) -> list[str]:
    """The GPU check (workloads/gpucheck.py) as the serve pod's init container and `host check
    --allreduce`'s probe both run it: the image's architectures and CUDA against the node's, the
    probes asked for, and the cluster's all-reduce floor where the all-reduce is probed."""
    check = [
        "python",
        "-m",
        "kimideploy.workloads.gpucheck",
        "--archs",
        ",".join(ctx.image.cuda_archs),
        "--cuda",
        ctx.image.cuda or "",
        "--gpus",
        str(gpus or ctx.cluster.gpu.per_node),
        "--probes",
        ",".join(probes),
        "--timeout-s",
        str(timeout_s),
    ]
    floor = ctx.cluster.network.min_node_bus_gbps
    if floor is not None and "allreduce" in probes:
        check += ["--min-bus-gbps", f"{floor:g}"]
    return check


def probe_job(
    ctx: PlanInputs,
    *,
    component: str,
    fail_at_once: dict[str, Any],
    pod_annotations: dict[str, str],
    container: dict[str, Any],
) -> ObjectPlan:
    """A one-pod probe Job (job-probe template) that a command applies, follows and deletes:
    never retried (the exit codes in `fail_at_once` fail it at once), gone after 5 minutes.
    `container` holds the pod's own parts: node_selector, image, command, args, env, resources,
    volumes and volume_mounts."""
    labels = standard_labels(ctx, component=component)
    labels.pop(f"{LABEL_PREFIX}/run-id", None)
    values: dict[str, Any] = {
        "name": f"{ctx.release}-{component}",
        "namespace": ctx.namespace,
        "labels": labels,
        "annotations": object_annotations(ctx),
        "completions": 1,
        "parallelism": 1,
        "backoff_limit_per_index": 0,
        "pod_failure_rules": [{"action": "FailIndex", "onExitCodes": fail_at_once}],
        "suspend": False,
        "ttl_s": PROBE_TTL_S,
        "subdomain": "",
        "pod_labels": labels,
        "pod_annotations": dict(pod_annotations),
        "tolerations": tolerations(ctx),
        "security": pod_security(ctx),
        "priority_class": "",
        "security_context": container_hardening(),
        "init_containers": [],
        **container,
    }
    return ObjectPlan("job-probe", values)

"""Cluster profiles: the hardware, Kubernetes and storage facts of one target, plus its sizes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AwareDatetime, Field, field_validator

from kimideploy.config.base import (
    Cidr,
    DnsLabel,
    DnsSubdomain,
    LabelValue,
    Name,
    Port,
    QualifiedName,
    Quantity,
    StrictModel,
)
from kimideploy.config.gate import GateSettings
from kimideploy.config.images import CudaArch
from kimideploy.config.workloads import Workloads


class Rental(StrictModel):
    """A cluster rented until a date: its volumes go with it. `status` and `run` there list what
    is on them and not yet published, and warn as the end nears."""

    ends: AwareDatetime = Field(
        description="When the rental ends (its volumes are deleted), with a timezone, e.g. "
        "2026-12-20T18:00:00Z; a bare date means midnight UTC."
    )
    warn_hours: Annotated[int, Field(ge=1, le=24 * 60)] = Field(
        default=72, description="Warn this long before the end (publish takes a while)."
    )
    provider: str = Field(default="", description="Who it is rented from (shown in warnings).")

    @field_validator("ends", mode="before")
    @classmethod
    def _date_is_midnight_utc(cls, value: object) -> object:
        if isinstance(value, str) and len(value) == 10:
            return datetime.fromisoformat(value).replace(tzinfo=UTC)
        if type(value).__name__ == "date":
            return datetime(value.year, value.month, value.day, tzinfo=UTC)  # type: ignore[attr-defined]
        return value


class GpuProfile(StrictModel):
    """The GPUs of every node in the cluster (clusters are homogeneous)."""

    product: str = Field(description="Value of the node label nvidia.com/gpu.product.")
    arch: CudaArch = Field(description="Compute capability the images must be built for.")
    memory_gb: Annotated[float, Field(gt=0, description="Memory per GPU in GB.")]
    per_node: Annotated[int, Field(ge=1, le=16, description="GPUs per node.")]


class Toleration(StrictModel):
    key: QualifiedName
    """The taint key."""
    operator: Literal["Exists", "Equal"] = "Exists"
    """Exists (any value) or Equal (only `value`)."""
    value: str | None = None
    """The taint value, with operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """The taint effect tolerated; unset: every effect."""


AccessMode = Literal["ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany", "ReadWriteOncePod"]


class Claim(StrictModel):
    """One PersistentVolumeClaim the workloads share."""

    storage_class: str = Field(description="StorageClass name on the cluster.")
    size: Quantity = Field(description="Requested size, e.g. 2Ti.")
    access_mode: AccessMode = "ReadWriteOnce"
    """ReadWriteOnce, or ReadWriteMany where pods on several nodes mount it."""


class HiddenStatesClaim(StrictModel):
    """The hidden-state claim; `size: auto` sizes it from the datagen and extract settings."""

    storage_class: str
    """StorageClass name on the cluster."""
    size: Quantity | Literal["auto"] = "auto"
    """A quantity, or auto: samples x tokens x (aux layers + 1) x hidden size x dtype bytes,
    plus headroom."""
    access_mode: AccessMode = "ReadWriteOnce"
    """ReadWriteOnce, or ReadWriteMany where extraction and training run on several nodes."""
    headroom: Annotated[
        float, Field(ge=0, le=2, description="Extra fraction over the estimate.")
    ] = 0.15


class Storage(StrictModel):
    models: Claim = Field(description="Target weights and drafters (read-only when serving).")
    datasets: Claim = Field(
        description="Prompts, generated conversations, vocab maps, bench results."
    )
    hidden_states: HiddenStatesClaim = Field(description="Extracted features (largest by far).")
    checkpoints: Claim = Field(description="Training checkpoints.")


class WorkloadImages(StrictModel):
    """Which image (by name in `images`) each workload runs on this cluster."""

    serve: Name
    """Image (images.<name>, role serve) of the serve release."""
    datagen: Name
    """Image (images.<name>) of the datagen Job."""
    extract: Name
    """Image (images.<name>) of the hidden-state extraction Job."""
    vocab: Name
    """Image (images.<name>) of the vocab-mapping Job."""
    train: Name
    """Image (images.<name>, role train) of the training Job and the replay's judgement."""
    bench: Name
    """Image (images.<name>) of the bench Job."""
    publish: Name | None = Field(
        default=None, description="`drafter publish` / `data publish` (default: vocab's image)."
    )


class PriorityClasses(StrictModel):
    """PriorityClass names for the pods (k8s/base/priorityclasses.yaml creates these two): serving
    outranks batch work, so a datagen or training pod never preempts the serve release."""

    serve: DnsSubdomain = "kimideploy-serve"
    """PriorityClass of the serve pods."""
    batch: DnsSubdomain = "kimideploy-batch"
    """PriorityClass of every batch Job's pods (should never preempt)."""


KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""Kueue reads a Job's LocalQueue from this label on the Job (not on its pods)."""


class KueueSettings(StrictModel):
    """Submit batch Jobs through Kueue: each is created suspended with the queue's label, and
    Kueue starts it when the LocalQueue's ClusterQueue admits all of its pods at once (a
    multi-node training Job is one workload: its ranks are admitted together or not at all)."""

    local_queue: DnsSubdomain = Field(
        description="LocalQueue in the cluster profile's namespace (kueue.x-k8s.io/queue-name); "
        "`run` checks it exists before creating anything."
    )


class NetworkPolicySettings(StrictModel):
    """One NetworkPolicy per workload (ingress only; egress is left open: datagen calls the serve
    release, pods resolve DNS). Serve pods take traffic on the API port from pods of their own
    namespace, the monitoring namespaces and `client_namespaces`; batch pods take none, except
    multi-node training pods from the other ranks of the same Job. The pod-local ports (the
    training sidecar's vLLM) are not reachable from outside the pod at all."""

    enabled: bool = True
    """Render a NetworkPolicy for every workload (ingress only)."""
    monitoring_namespaces: list[DnsLabel] = Field(
        default_factory=lambda: ["monitoring"],
        description="Namespaces whose pods may scrape the serve pods (Prometheus).",
    )
    client_namespaces: list[DnsLabel] = Field(
        default_factory=list, description="Other namespaces whose pods may call the serve API."
    )
    api_server_cidrs: list[Cidr] = Field(
        default_factory=list,
        description="Where the API server's pod proxy connects from (`watch`/`status` read vLLM "
        "metrics through it); needed where the CNI enforces policies against host traffic.",
    )


class SshHost(StrictModel):
    """A machine kimideploy reaches over SSH (host checks, provisioning, model sync)."""

    name: Name
    """The host's name in the inventory and in messages."""
    address: str = Field(description="Hostname or IP address.")
    port: Port = 22
    """SSH port."""
    user: str
    """SSH user (needs passwordless sudo for `host provision`)."""
    identity_file: str | None = Field(
        default=None, description="Private key; default: ssh-agent and ~/.ssh keys."
    )
    known_hosts: str | None = Field(
        default=None,
        description="known_hosts file (default ~/.ssh/known_hosts); keys never auto-added.",
    )


class Mirrors(StrictModel):
    """Where hosts download from; point these at a mirror for air-gapped or slow-egress hosts."""

    cuda_repo: str = "https://developer.download.nvidia.com/compute/cuda/repos"
    """Base URL of NVIDIA's CUDA package repositories (or a mirror)."""
    container_toolkit_repo: str = "https://nvidia.github.io/libnvidia-container"
    """Base URL of the NVIDIA container toolkit package repository (or a mirror)."""
    k3s_releases: str = "https://github.com/k3s-io/k3s/releases/download"
    """Base URL the k3s binary and its sha256sum file are downloaded from (or a mirror)."""


class HostSetup(StrictModel):
    """What the hosts of this cluster need; the Ansible inventory and `host check` read it."""

    role: Literal["gpu_host", "nvl8_node"] = Field(
        description="gpu_host: the bare-metal PCIe host we install; nvl8_node: a rented node."
    )
    model_path: str = Field(pattern=r"^/", description="Fast local disk for weights (NVMe).")
    nvidia_driver_version: str = Field(
        pattern=r"^\d+\.\d+(\.\d+)?$",
        description="Open kernel module driver to install (gpu_host).",
    )
    container_toolkit_version: str = Field(description="NVIDIA container toolkit package version.")
    # Both land in files on the host (a systemd unit, an image reference): versions only.
    k3s_version: str | None = Field(
        default=None,
        pattern=r"^v\d+\.\d+\.\d+\+k3s\d+$",
        description="Single-node k3s, e.g. v1.33.5+k3s1 (gpu_host only).",
    )
    device_plugin_version: str | None = Field(
        default=None, pattern=r"^v\d+\.\d+\.\d+$", description="NVIDIA device plugin, e.g. v0.17.4."
    )
    storage_path: str | None = Field(
        default=None, pattern=r"^/", description="local-path provisioner directory (gpu_host only)."
    )
    fabric_manager: bool = Field(
        default=False, description="NVSwitch systems need nvidia-fabricmanager running."
    )
    infiniband: bool = Field(default=False, description="Check InfiniBand ports and peer memory.")
    mirrors: Mirrors = Field(default_factory=Mirrors)
    download_streams: Annotated[int, Field(ge=1, le=64)] = Field(
        default=8,
        description="`host sync-model`: connections at once, over several files and byte ranges "
        "of large ones (a hub or mirror limits each connection well below a host's link).",
    )


class Cluster(StrictModel):
    """One deployment target: the PCIe host or a rented NVL8 cluster."""

    description: str = ""
    """Free text for people; not used by kimideploy."""
    kube_context: str = Field(description="kubeconfig context to use (overridable by --context).")
    namespace: DnsLabel = Field(description="Namespace for every object kimideploy creates.")
    kubernetes_version: Annotated[str, Field(pattern=r"^1\.\d+$")] = Field(
        description="Server minor version; manifests are validated against its OpenAPI schema."
    )
    nodes: Annotated[int, Field(ge=1, le=1024, description="GPU nodes available.")]
    gpu: GpuProfile
    interconnect: Literal["pcie", "nvlink"] = Field(
        description="pcie: no NVLink (NCCL all-reduce); nvlink: NVL8 within a node."
    )
    node_selector: dict[QualifiedName, LabelValue] = Field(
        default_factory=dict, description="Extra node labels every pod must match."
    )
    tolerations: list[Toleration] = Field(default_factory=list)
    """Tolerations every GPU pod of this cluster carries (e.g. for tainted GPU nodes)."""
    rollout: Literal["auto", "recreate", "rolling"] = Field(
        default="auto",
        description="auto: rolling when the cluster can hold one serve copy more, else recreate.",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment for GPU pods (NCCL settings differ here)."
    )
    model_variant: Name | None = Field(
        default=None,
        description="A model_variants entry this cluster serves and trains with instead of "
        "`model:` (e.g. an NVFP4 checkpoint on Blackwell). Unset: `model:` itself.",
    )
    storage: Storage
    """The PersistentVolumeClaims the workloads mount."""
    images: WorkloadImages
    workloads: Workloads
    """Per-workload settings on this cluster."""
    step_cost_per_token: Annotated[float, Field(gt=0, le=2)] = Field(
        default=0.1433,
        description="Cost of one more speculative token per decode step, relative to a plain step "
        "(C(k) = 1 + k * this). 0.1433 reproduces C(3) = 1.43 measured on 8x RTX PRO 6000 PCIe.",
    )
    gate: GateSettings = Field(default_factory=GateSettings)
    priority_classes: PriorityClasses | None = Field(
        default=None,
        description="priorityClassName for serve and batch pods; `up` and `run` check they exist. "
        "Unset: pods get the cluster's default priority.",
    )
    network_policy: NetworkPolicySettings = Field(default_factory=NetworkPolicySettings)
    kueue: KueueSettings | None = Field(
        default=None, description="Batch Jobs wait in this Kueue LocalQueue. Unset: no Kueue."
    )
    hosts: list[SshHost] = Field(
        default_factory=list, description="SSH access to the GPU machines (for `kimideploy host`)."
    )
    host_setup: HostSetup | None = None
    rental: Rental | None = Field(
        default=None, description="Set on a rented cluster: when its volumes go away."
    )

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpu.per_node

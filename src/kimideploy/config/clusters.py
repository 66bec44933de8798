"""Cluster profiles: the hardware, Kubernetes and storage facts of one target, plus its sizes."""

from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self

from pydantic import AwareDatetime, Field, field_validator, model_validator

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
    margin_hours: Annotated[float, Field(ge=0, le=24 * 7)] = Field(
        default=2.0,
        description="Kept free before the end: a run whose upper estimate reaches into it is "
        "refused before it starts (checkpoints, publishing the drafter and the data take this "
        "long); `--force` starts it anyway.",
    )

    @field_validator("ends", mode="before")
    @classmethod
    def _date_is_midnight_utc(cls, value: object) -> object:
        if isinstance(value, str) and len(value) == 10:
            try:
                return datetime.fromisoformat(value).replace(tzinfo=UTC)
            except ValueError as exc:
                raise ValueError(f"{value!r} is not a date on the calendar ({exc})") from None
        if type(value).__name__ == "date":
            return datetime(value.year, value.month, value.day, tzinfo=UTC)  # type: ignore[attr-defined]
        return value

    @field_validator("ends")
    @classmethod
    def _in_utc(cls, value: datetime) -> datetime:
        # Every notice prints the end in UTC: 18:00+05:30 is 12:30 UTC, not 18:00 UTC.
        return value.astimezone(UTC)


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


class NodeLocal(StrictModel):
    """Node-local NVMe for a copy of the target."""

    path: Annotated[str, Field(pattern=r"^/[^\s]*$")] = Field(
        description="An absolute host path on every GPU node (an NVMe mount)."
    )
    size_gb: Annotated[float, Field(gt=0)] = Field(description="Space there, GB.")


class Storage(StrictModel):
    models: Claim = Field(description="Target weights and drafters (read-only when serving).")
    datasets: Claim = Field(
        description="Prompts, generated conversations, vocab maps, bench results."
    )
    hidden_states: HiddenStatesClaim = Field(description="Extracted features (largest by far).")
    checkpoints: Claim = Field(description="Training checkpoints.")
    node_local: NodeLocal | None = Field(
        default=None,
        description="A folder on each GPU node's local NVMe (a host path) that a copy of the "
        "target may be kept in, read at NVMe speed instead of over the shared filesystem "
        "(workloads.serve.load.local_copy).",
    )
    compile_cache: Claim | None = Field(
        default=None,
        description="Kernels compiled at run time (torch.compile, Triton, vLLM's compiled "
        "graphs, FlashInfer's JIT modules), kept per image digest so a restart, a rollback or "
        "the next run of the same image loads them instead of compiling again. Default: the "
        "checkpoints claim's storage class and access mode, 200Gi.",
    )

    @model_validator(mode="before")
    @classmethod
    def _compile_cache_like_checkpoints(cls, data: Any) -> Any:
        checkpoints = data.get("checkpoints") if isinstance(data, dict) else None
        if isinstance(checkpoints, dict) and data.get("compile_cache") is None:
            like = {k: checkpoints[k] for k in ("storage_class", "access_mode") if k in checkpoints}
            return {**data, "compile_cache": {**like, "size": "200Gi"}}
        return data


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


class EndpointPicker(StrictModel):
    """The Endpoint Picker each InferencePool names (its `endpointPickerRef`): the extension's
    gRPC ext-proc server that chooses a pod of the pool for each request. kimideploy renders
    one per pool (a picker serves exactly one pool: `--pool-name`) with the flags of the pinned
    extension's lightweight picker (cmd/lwepp of sigs.k8s.io/gateway-api-inference-extension
    v1.6.2), a Service in front and a Role to read its pool and pods."""

    image: str = Field(
        min_length=1,
        description="The picker's image, pinned (a digest or a release tag): the extension's "
        "lwepp (round-robin; enough where the split is the route's weight) or a picker that "
        "takes the same flags, such as llm-d's. There is no default: a picker is part of the "
        "gateway install, and clusters differ in which one they run.",
    )
    args: list[str] = Field(
        default_factory=list, description="More flags, after the ones kimideploy sets."
    )
    grpc_port: Port = Field(
        default=9002, description="The picker's ext-proc gRPC port, which the gateway calls."
    )
    health_port: Port = Field(
        default=9003, description="The picker's gRPC health port (its probes)."
    )
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailClose",
        description="What the gateway does when the picker does not answer: FailClose refuses "
        "the request, FailOpen sends it to any pod of the pool.",
    )


class CanaryJudgement(StrictModel):
    """How `up serve --canary` judges the canary's pool against the stable pool on live traffic."""

    window_s: Annotated[int, Field(ge=5, le=3600)] = Field(
        default=60, description="Seconds between two scrapes of both pools' /metrics."
    )
    windows: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=10,
        description="Windows observed before the verdict (live traffic: the longer, the surer).",
    )
    min_requests: Annotated[int, Field(ge=1, le=10_000_000)] = Field(
        default=50,
        description="Requests each pool must have finished over the observation; fewer, and "
        "the canary is refused (weight 0) as unjudgeable.",
    )


class GatewaySettings(StrictModel):
    """Serve through a Gateway API Inference Extension route: the serve release's pods form an
    InferencePool (inference.networking.k8s.io/v1) behind one HTTPRoute on this Gateway. The
    route is what `up serve --canary` splits by weight between the serving pool and a canary
    pool. The Gateway itself and its controller (with the extension's support) are the
    cluster's: kimideploy neither creates nor configures them."""

    name: DnsSubdomain = Field(description="The Gateway the HTTPRoute attaches to.")
    namespace: DnsLabel | None = Field(
        default=None, description="The Gateway's namespace. Unset: the cluster's namespace."
    )
    section_name: DnsSubdomain | None = Field(
        default=None, description="One listener of the Gateway. Unset: every listener."
    )
    endpoint_picker: EndpointPicker
    canary: CanaryJudgement = Field(default_factory=CanaryJudgement)


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


TopologyXml = Annotated[str, Field(pattern=r"^\s*<(\?xml|system)", max_length=65536)]


class PeerToPeerSetup(StrictModel):
    """What GPU peer-to-peer over PCIe needs from the PCIe host (the gpu_host role sets it,
    `host check` reads it back). NCCL between GPUs without NVLink writes straight into the peer's
    memory across PCIe: with the IOMMU translating, ACS redirecting peer requests to the root
    complex, or nvidia_uvm's HMM on, people running 8x RTX PRO 6000 report all-reduces that hang
    after NCCL's init; a small BAR1 (Resizable BAR off) leaves no window to map the peer."""

    iommu: Literal["passthrough", "off", "unchanged"] = Field(
        default="passthrough",
        description="Kernel parameter at the next boot: passthrough (iommu=pt: host DMA "
        "untranslated, the IOMMU still on for VMs), off (amd_iommu=off intel_iommu=off), "
        "unchanged (the role writes nothing).",
    )
    uvm_disable_hmm: bool = Field(
        default=True,
        description="options nvidia_uvm uvm_disable_hmm=1: HMM off (reported hangs with the open "
        "modules on Blackwell; vLLM and NCCL do not use it).",
    )
    disable_acs: bool = Field(
        default=True,
        description="Clear ACS control on every PCI bridge at each boot (a systemd unit running "
        "setpci before k3s): peer requests stay below the PCIe switch. Bare metal only: a host "
        "that passes GPUs into VMs needs ACS.",
    )


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
    peer_to_peer: PeerToPeerSetup = Field(default_factory=PeerToPeerSetup)
    """The PCIe host's peer-to-peer settings (gpu_host only)."""
    download_streams: Annotated[int, Field(ge=1, le=64)] = Field(
        default=8,
        description="`host sync-model`: connections at once, over several files and byte ranges "
        "of large ones (a hub or mirror limits each connection well below a host's link).",
    )


class NetworkSettings(StrictModel):
    """How NCCL reaches the GPUs of other nodes, and of this one, as the machines are built.

    A rented NVL8 node has InfiniBand compute HCAs beside front-end and storage NICs: NCCL in a
    pod sees none of them without an RDMA device (a device plugin's resource, host networking, or
    an SR-IOV attachment), the verbs library and locked memory, and silently all-reduces over the
    pod network's TCP instead; `NCCL_IB_HCA=mlx5` is a prefix that also matches the other NICs.
    Multi-node training pods get what is set here, and measure an all-reduce across their nodes
    before the first step."""

    ib_hcas: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+(:\d+)?$")]] = Field(
        default_factory=list,
        description="The compute HCAs, exactly (NCCL_IB_HCA='=mlx5_0,mlx5_1,...'; `host check` "
        "and the node role read these ports only). Empty: NCCL chooses (and may take a front-end "
        "or storage NIC).",
    )
    rdma_resource: QualifiedName | None = Field(
        default=None,
        description="The RDMA device plugin's resource each multi-node pod requests (e.g. "
        "rdma/rdma_shared_device_a, nvidia.com/hostdev).",
    )
    rdma_per_pod: Annotated[int, Field(ge=1, le=64)] = 1
    """How many of `rdma_resource` a multi-node pod requests."""
    host_network: bool = Field(
        default=False,
        description="Multi-node pods on the node's network (the HCAs without a device plugin).",
    )
    network_attachments: list[str] = Field(
        default_factory=list,
        description="Multus/SR-IOV networks for multi-node pods "
        "(k8s.v1.cni.cncf.io/networks), e.g. kimi/ib-sriov.",
    )
    socket_ifname: Annotated[str, Field(pattern=r"^[=^]?[A-Za-z0-9_.,-]+$")] | None = Field(
        default=None,
        description="NCCL_SOCKET_IFNAME: the interface NCCL bootstraps over (e.g. eth0).",
    )
    min_bus_gbps: Annotated[float, Field(gt=0, le=10_000)] | None = Field(
        default=None,
        description="The all-reduce a multi-node training Job runs before its first step fails "
        "below this bus bandwidth (GB/s, NCCL-tests' figure), naming the transport NCCL took; it "
        "fails whatever the figure when NCCL fell back to sockets.",
    )
    nccl_protocol: Literal["Simple", "LL", "LL128"] | None = Field(
        default=None, description="NCCL_PROTO for GPU pods (unset: NCCL's choice)."
    )
    nccl_topology: TopologyXml | None = Field(
        default=None,
        description="An NCCL topology file's XML, written inline (NCCL_TOPO_FILE in GPU pods, "
        "from their spec ConfigMap): for PCIe switches NCCL cannot see through. Inline, so "
        "the release record holds it and a rollback gets the same file.",
    )
    min_node_bus_gbps: Annotated[float, Field(gt=0, le=10_000)] | None = Field(
        default=None,
        description="The all-reduce across one node's GPUs (the serve pod's GPU check, `host check "
        "--allreduce`) fails below this bus bandwidth (GB/s, NCCL-tests' figure): a PCIe host "
        "whose peer-to-peer is off or routed through the CPU shows here, before the load.",
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
    node_memory_gb: Annotated[float, Field(gt=0, le=65536)] | None = Field(
        default=None,
        description="RAM of one GPU node in GB (`free -g`'s total): the memory plan's host side "
        "(can the page cache hold the checkpoint across a restart, may the serve pod's limit "
        "be raised for it). Unset: the plan cannot tell, and says so.",
    )
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
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    """How NCCL reaches other GPUs from the pods (RDMA, HCAs, thresholds)."""
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
    step_cost_per_token: Annotated[float, Field(gt=0, le=2)] | None = Field(
        default=None,
        description="A constant cost of one more speculative token per decode step, relative to "
        "a plain step (C(k) = 1 + k * this), the same at every concurrency. Unset: the step-cost "
        "model (the GPU's priors, the target's experts, the serve image's kernel plan; "
        "docs/reference/step-cost.md), until `run calibrate` measures the cluster.",
    )
    gate: GateSettings = Field(default_factory=GateSettings)
    priority_classes: PriorityClasses | None = Field(
        default=None,
        description="priorityClassName for serve and batch pods; `up` and `run` check they exist. "
        "Unset: pods get the cluster's default priority.",
    )
    network_policy: NetworkPolicySettings = Field(default_factory=NetworkPolicySettings)
    gateway: GatewaySettings | None = Field(
        default=None,
        description="Serve behind an HTTPRoute of this Gateway (Gateway API Inference Extension), "
        "which `up serve --canary` splits. Unset: the serve Service only, and no canary.",
    )
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
    price_per_gpu_hour: Annotated[float, Field(ge=0, le=1000)] | None = Field(
        default=None,
        description="What one GPU-hour of this cluster costs (your currency; the plans print "
        "it as $): every run's estimate and the lifecycle plan add up the money. Unset: "
        "GPU-hours only.",
    )

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpu.per_node

    @model_validator(mode="after")
    def _no_hca_prefix(self) -> Self:
        value = self.env.get("NCCL_IB_HCA")
        if value is not None and not value.startswith(("=", "^")):
            raise ValueError(
                f"env.NCCL_IB_HCA: {value!r} is a prefix: it also matches front-end and storage "
                "NICs (mlx5 matches every mlx5 device); list the compute HCAs in "
                "network.ib_hcas (rendered as NCCL_IB_HCA='=mlx5_0,mlx5_1,...')"
            )
        return self

    @property
    def weights_via(self) -> str:
        """How the weights reach the models volume (workloads.weights.via, auto resolved): a
        shared claim every node mounts is filled by a Job; a host path by `host sync-model`."""
        via = self.workloads.weights.via
        if via != "auto":
            return via
        return "job" if self.storage.models.access_mode == "ReadWriteMany" else "host"

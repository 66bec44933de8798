"""Cluster profiles: the hardware, Kubernetes and storage facts of one target, plus its sizes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kimideploy.config.base import Name, Quantity, StrictModel
from kimideploy.config.images import CudaArch
from kimideploy.config.workloads import Workloads


class GpuProfile(StrictModel):
    """The GPUs of every node in the cluster (clusters are homogeneous)."""

    product: str = Field(description="Value of the node label nvidia.com/gpu.product.")
    arch: CudaArch = Field(description="Compute capability the images must be built for.")
    memory_gb: Annotated[float, Field(gt=0, description="Memory per GPU in GB.")]
    per_node: Annotated[int, Field(ge=1, le=16, description="GPUs per node.")]


class Toleration(StrictModel):
    key: str
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


AccessMode = Literal["ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany", "ReadWriteOncePod"]


class Claim(StrictModel):
    """One PersistentVolumeClaim the workloads share."""

    storage_class: str = Field(description="StorageClass name on the cluster.")
    size: Quantity = Field(description="Requested size, e.g. 2Ti.")
    access_mode: AccessMode = "ReadWriteOnce"


class HiddenStatesClaim(StrictModel):
    """The hidden-state claim; `size: auto` sizes it from the datagen and extract settings."""

    storage_class: str
    size: Quantity | Literal["auto"] = "auto"
    access_mode: AccessMode = "ReadWriteOnce"
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
    datagen: Name
    extract: Name
    vocab: Name
    train: Name
    bench: Name


class Cluster(StrictModel):
    """One deployment target: the PCIe host or a rented NVL8 cluster."""

    description: str = ""
    kube_context: str = Field(description="kubeconfig context to use (overridable by --context).")
    namespace: Name = Field(description="Namespace for every object kimideploy creates.")
    kubernetes_version: Annotated[str, Field(pattern=r"^1\.\d+$")] = Field(
        description="Server minor version; manifests are validated against its OpenAPI schema."
    )
    nodes: Annotated[int, Field(ge=1, le=1024, description="GPU nodes available.")]
    gpu: GpuProfile
    interconnect: Literal["pcie", "nvlink"] = Field(
        description="pcie: no NVLink (NCCL all-reduce); nvlink: NVL8 within a node."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Extra node labels every pod must match."
    )
    tolerations: list[Toleration] = Field(default_factory=list)
    rollout: Literal["auto", "recreate", "rolling"] = Field(
        default="auto",
        description="auto: rolling when the cluster can hold one serve copy more, else recreate.",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment for GPU pods (NCCL settings differ here)."
    )
    storage: Storage
    images: WorkloadImages
    workloads: Workloads

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpu.per_node

"""An Ansible inventory for one cluster profile: hosts from `hosts`, variables from `host_setup`.

Every string that comes from kimideploy.yaml is written as `!unsafe`: Ansible templates variables
when a task uses them, so a path like `{{ lookup('pipe', 'id') }}` would otherwise run a command
on the operator's machine. SSH options are quoted item by item (Ansible splits
`ansible_ssh_common_args` like a shell), so a known_hosts path with spaces stays one path and
cannot add `-o ProxyCommand=...` or turn host-key checking off.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from kimideploy.config.clusters import Cluster, SshHost
from kimideploy.config.images import MIN_DRIVER_FOR_CUDA
from kimideploy.config.project import Project
from kimideploy.errors import UsageError
from kimideploy.paths import repository_root

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
IOMMU_KERNEL_ARGS = {
    "passthrough": "iommu=pt",
    "off": "amd_iommu=off intel_iommu=off",
    "unchanged": "",
}
"""host_setup.peer_to_peer.iommu -> the kernel parameters the gpu_host role adds (`host check`
reads the running command line for the same words)."""


def require_hosts(project: Project, cluster_name: str) -> Cluster:
    cluster = project.clusters[project.cluster_name(cluster_name)]
    if not cluster.hosts or cluster.host_setup is None:
        raise UsageError(
            f"cluster {cluster_name} has no `hosts` and `host_setup` in kimideploy.yaml",
            hint="add the SSH addresses and the host setup to the cluster profile",
        )
    return cluster


class Unsafe(str):
    """A value Ansible must take literally (dumped with YAML's `!unsafe` tag)."""

    __slots__ = ()


def _unsafe_representer(dumper: yaml.SafeDumper, value: Unsafe) -> yaml.ScalarNode:
    return dumper.represent_scalar("!unsafe", str(value), style="'")


class InventoryDumper(yaml.SafeDumper):
    """safe_dump plus `!unsafe` strings."""


InventoryDumper.add_representer(Unsafe, _unsafe_representer)


def mark_unsafe(value: Any) -> Any:
    """Every string inside `value` as Unsafe (keys stay plain: they are ours)."""
    if isinstance(value, str):
        return Unsafe(value)
    if isinstance(value, dict):
        return {key: mark_unsafe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [mark_unsafe(item) for item in value]
    return value


def inventory_yaml(inventory: dict[str, Any]) -> str:
    return yaml.dump(inventory, Dumper=InventoryDumper, sort_keys=False)


def ssh_args(host: SshHost) -> str:
    """Host keys must already be known: no silent trust on first use. One quoted item per argv
    word, so nothing in the known_hosts path can add options."""
    known = Path(host.known_hosts or "~/.ssh/known_hosts").expanduser()
    items = [
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={known}",
        "-o",
        "ConnectTimeout=10",
    ]
    return shlex.join(items)


def host_vars(host: SshHost) -> dict[str, Any]:
    found: dict[str, Any] = {
        "ansible_host": host.address,
        "ansible_port": host.port,
        "ansible_user": host.user,
        "ansible_ssh_common_args": ssh_args(host),
        "ansible_become": host.user != "root",
    }
    if host.identity_file:
        found["ansible_ssh_private_key_file"] = str(Path(host.identity_file).expanduser())
    return found


def pod_uid(project: Project, cluster: Cluster) -> int:
    """The user the pods that write drafters run as: training (after hours of GPU time) and the
    serve pod's pull. Both images run as 10001 unless a config says otherwise."""
    return project.images[cluster.images.train].run_as_user


def role_vars(project: Project, cluster: Cluster) -> dict[str, Any]:
    setup = cluster.host_setup
    assert setup is not None
    if setup.role == "nvl8_node":
        image = project.images[cluster.images.serve]
        return {
            "nvl8_node_model_path": setup.model_path,
            "nvl8_node_min_driver_version": MIN_DRIVER_FOR_CUDA.get(image.cuda or "", "0"),
            "nvl8_node_fabric_manager": setup.fabric_manager,
            "nvl8_node_infiniband": setup.infiniband,
            "nvl8_node_expected_gpus": cluster.gpu.per_node,
            "nvl8_node_ib_hcas": list(cluster.network.ib_hcas),
        }
    base = sorted(str(p) for p in (repository_root() / "k8s" / "base").glob("*.yaml"))
    labels = {**cluster.node_selector, GPU_PRODUCT_LABEL: cluster.gpu.product}
    return {
        "gpu_host_model_path": setup.model_path,
        "gpu_host_pod_uid": pod_uid(project, cluster),
        "gpu_host_storage_path": setup.storage_path or f"{setup.model_path}/k3s-storage",
        "gpu_host_nvidia_driver_version": setup.nvidia_driver_version,
        "gpu_host_container_toolkit_version": setup.container_toolkit_version,
        "gpu_host_k3s_version": setup.k3s_version,
        "gpu_host_device_plugin_version": setup.device_plugin_version,
        "gpu_host_node_labels": labels,
        "gpu_host_namespace": cluster.namespace,
        "gpu_host_models_claim": f"{project.name}-models",
        "gpu_host_models_size": cluster.storage.models.size,
        "gpu_host_models_storage_class": cluster.storage.models.storage_class,
        "gpu_host_base_manifests": base,
        "gpu_host_cuda_repo": setup.mirrors.cuda_repo,
        "gpu_host_toolkit_repo": setup.mirrors.container_toolkit_repo,
        "gpu_host_k3s_release_url": setup.mirrors.k3s_releases,
        "gpu_host_iommu_args": IOMMU_KERNEL_ARGS[setup.peer_to_peer.iommu],
        "gpu_host_uvm_disable_hmm": setup.peer_to_peer.uvm_disable_hmm,
        "gpu_host_disable_acs": setup.peer_to_peer.disable_acs,
    }


def inventory(project: Project, cluster_name: str) -> dict[str, Any]:
    """The inventory `ansible-playbook -i` reads (write it with inventory_yaml): every value that
    came from the config is Unsafe."""
    cluster = require_hosts(project, cluster_name)
    return {
        "all": {
            "hosts": {h.name: mark_unsafe(host_vars(h)) for h in cluster.hosts},
            "vars": {
                "ansible_python_interpreter": "/usr/bin/python3",
                **mark_unsafe(role_vars(project, cluster)),
            },
        }
    }


def playbook_for(cluster: Cluster) -> Path:
    assert cluster.host_setup is not None
    return repository_root() / "ansible" / "playbooks" / f"{cluster.host_setup.role}.yml"

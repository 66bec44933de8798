"""Simulated nodes and storage classes that look like the cluster profiles of a kimideploy.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SIMULATED_LABEL = "kimideploy.test/simulated"
PROFILE_LABEL = "kimideploy.test/cluster-profile"
STORAGE_PROVISIONER = "kwok.x-k8s.io/volume"


def simulated_objects(config_path: Path) -> list[dict[str, Any]]:
    """Nodes and StorageClasses that look like each cluster profile of a kimideploy.yaml."""
    project = yaml.safe_load(config_path.read_text())
    objects: list[dict[str, Any]] = []
    classes: set[str] = set()
    for name, profile in sorted(project["clusters"].items()):
        gpu = profile["gpu"]
        taints = [
            {"key": t["key"], "value": t.get("value") or "present", "effect": t["effect"]}
            for t in profile.get("tolerations", [])
            if t.get("effect")
        ]
        for index in range(profile["nodes"]):
            node_name = f"{name}-gpu-{index}"
            labels = {
                SIMULATED_LABEL: "true",
                PROFILE_LABEL: name,
                "type": "kwok",
                "kubernetes.io/hostname": node_name,
                "kubernetes.io/os": "linux",
                "nvidia.com/gpu.product": gpu["product"],
                "nvidia.com/gpu.count": str(gpu["per_node"]),
                **profile.get("node_selector", {}),
            }
            capacity = {
                "cpu": "256",
                "memory": "3Ti",
                "pods": "110",
                "nvidia.com/gpu": str(gpu["per_node"]),
            }
            rdma = (profile.get("network") or {}).get("rdma_resource")
            if rdma:
                # What the RDMA device plugin advertises on a node with the compute HCAs.
                capacity[rdma] = "64"
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": node_name,
                        "labels": labels,
                        "annotations": {"kwok.x-k8s.io/node": "fake"},
                    },
                    "spec": {"taints": taints},
                    "status": {"capacity": capacity, "allocatable": capacity},
                }
            )
        for claim in profile["storage"].values():
            classes.add(claim["storage_class"])
    for storage_class in sorted(classes):
        objects.append(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": storage_class},
                "provisioner": STORAGE_PROVISIONER,
                "reclaimPolicy": "Delete",
                "volumeBindingMode": "Immediate",
                "allowVolumeExpansion": True,
            }
        )
    return objects

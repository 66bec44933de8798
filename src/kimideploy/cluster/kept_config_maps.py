"""What kimideploy keeps in a cluster as a ConfigMap of its own (calibrations, measurements):
written whole, replaced where it exists, created where it does not."""

from __future__ import annotations

from kimideploy.cluster.api import KubeApi, NotFoundError
from kimideploy.cluster.resources import path


def put_config_map(
    api: KubeApi, namespace: str, name: str, labels: dict[str, str], data: dict[str, str]
) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**labels, "app.kubernetes.io/managed-by": "kimideploy"},
        },
        "data": data,
    }
    try:
        api.request("PUT", path("ConfigMap", namespace, name), body=body)
    except NotFoundError:
        api.request("POST", path("ConfigMap", namespace), body=body)

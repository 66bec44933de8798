"""REST paths of the kinds kimideploy creates or reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    api: str  # "api/v1" or "apis/<group>/<version>"
    plural: str
    namespaced: bool = True


KINDS: dict[str, Kind] = {
    "Namespace": Kind("api/v1", "namespaces", namespaced=False),
    "ConfigMap": Kind("api/v1", "configmaps"),
    "Secret": Kind("api/v1", "secrets"),
    "Service": Kind("api/v1", "services"),
    "PersistentVolumeClaim": Kind("api/v1", "persistentvolumeclaims"),
    "Pod": Kind("api/v1", "pods"),
    "Event": Kind("api/v1", "events"),
    "Deployment": Kind("apis/apps/v1", "deployments"),
    "ReplicaSet": Kind("apis/apps/v1", "replicasets"),
    "Job": Kind("apis/batch/v1", "jobs"),
    "Lease": Kind("apis/coordination.k8s.io/v1", "leases"),
    "PodMonitor": Kind("apis/monitoring.coreos.com/v1", "podmonitors"),
    "NetworkPolicy": Kind("apis/networking.k8s.io/v1", "networkpolicies"),
    "PriorityClass": Kind("apis/scheduling.k8s.io/v1", "priorityclasses", namespaced=False),
    "LocalQueue": Kind("apis/kueue.x-k8s.io/v1beta2", "localqueues"),
    "ServiceAccount": Kind("api/v1", "serviceaccounts"),
    "RoleBinding": Kind("apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "InferencePool": Kind("apis/inference.networking.k8s.io/v1", "inferencepools"),
    "HTTPRoute": Kind("apis/gateway.networking.k8s.io/v1", "httproutes"),
}
KUEUE_VERSIONS = ("v1beta2", "v1beta1")
"""LocalQueue versions, newest first: Kueue 0.15 added v1beta2 and 0.17 deprecates v1beta1, which
older installs still serve alone."""
GATEWAY_KINDS = ("HTTPRoute", "InferencePool", "RoleBinding", "ServiceAccount")
PRUNABLE_KINDS = (
    "Deployment",
    "Job",
    "Service",
    "ConfigMap",
    "PodMonitor",
    "NetworkPolicy",
    *GATEWAY_KINDS,
)
"""Kinds a release owns and may prune; PersistentVolumeClaims are never among them. The
GATEWAY_KINDS are a serve release's behind a gateway (plan/gateway.py)."""


def path(
    kind: str,
    namespace: str | None = None,
    name: str | None = None,
    sub: str = "",
    *,
    version: str | None = None,
) -> str:
    """/api/v1/namespaces/ns/configmaps/name[/sub]; `version` replaces the kind's API version
    (a LocalQueue at v1beta1 on an older Kueue)."""
    spec = KINDS[kind]
    api = spec.api if version is None else f"{spec.api.rsplit('/', 1)[0]}/{version}"
    parts = [f"/{api}"]
    if spec.namespaced:
        if namespace is None:
            raise ValueError(f"{kind} is namespaced")
        parts.append(f"namespaces/{namespace}")
    parts.append(spec.plural)
    if name:
        parts.append(name)
    if sub:
        parts.append(sub)
    return "/".join(parts)

"""Opening a cluster session for a cluster profile, with --context/--namespace overrides."""

from __future__ import annotations

from kimideploy.cluster.session import ClusterSession, connect
from kimideploy.config.loading import LoadedProject


def open_session(
    loaded: LoadedProject, cluster: str | None, context: str | None, namespace: str | None
) -> ClusterSession:
    """KUBECONFIG's context (the profile's kube_context unless --context) and namespace."""
    project = loaded.project
    profile = project.clusters[project.cluster_name(cluster)]
    return connect(context or profile.kube_context, namespace or profile.namespace)

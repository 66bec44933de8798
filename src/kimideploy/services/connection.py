"""Opening a cluster session for a cluster profile, with --context/--namespace overrides."""

from __future__ import annotations

from kimideploy.cluster.session import ClusterSession, connect
from kimideploy.config.loading import LoadedProject
from kimideploy.errors import UsageError


def open_session(
    loaded: LoadedProject, cluster: str | None, context: str | None, namespace: str | None
) -> ClusterSession:
    """KUBECONFIG's context (the profile's kube_context unless --context) and namespace."""
    project = loaded.project
    name = cluster or project.default_cluster
    if name not in project.clusters:
        valid = ", ".join(sorted(project.clusters))
        raise UsageError(f"--cluster: unknown cluster '{name}' (valid: {valid})")
    profile = project.clusters[name]
    return connect(context or profile.kube_context, namespace or profile.namespace)

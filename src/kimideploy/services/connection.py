"""Opening a cluster session for a cluster profile, with --context/--namespace overrides."""

from __future__ import annotations

import functools

from kimideploy.cluster.bench_results import StoredBench
from kimideploy.cluster.jobs import JobSnapshot
from kimideploy.cluster.record_trust import RouteParent
from kimideploy.cluster.session import ClusterSession, connect
from kimideploy.config.loading import LoadedProject
from kimideploy.services.calibration_copies import remember

# The cluster-side types the CLI names in its annotations: cli/ imports services/, not cluster/.
__all__ = ["ClusterSession", "JobSnapshot", "StoredBench", "open_session"]


def open_session(
    loaded: LoadedProject, cluster: str | None, context: str | None, namespace: str | None
) -> ClusterSession:
    """KUBECONFIG's context (the profile's kube_context unless --context) and namespace, for the
    cluster the command works on: decided here, once, and carried by the session
    (`session.cluster`) to everything the command does next."""
    project = loaded.project
    name = project.cluster_name(cluster)
    profile = project.clusters[name]
    gateway = profile.gateway
    return connect(
        context or profile.kube_context,
        namespace or profile.namespace,
        cluster=name,
        keep_calibrations=functools.partial(remember, loaded, name),
        route_parent=RouteParent(gateway.name, gateway.namespace, gateway.section_name)
        if gateway is not None
        else None,
    )

"""What must already exist on the cluster before a workload is applied, checked read-only first.

A missing PriorityClass or API-key Secret is not caught by a server-side dry run of a Deployment
or Job (only their pods are checked, by the controllers, after the apply); without this the
release would sit with no pods, or pods in CreateContainerConfigError, until the timeout.
"""

from __future__ import annotations

from typing import Any

from kimideploy.cluster.session import ClusterSession
from kimideploy.config.clusters import KUEUE_QUEUE_LABEL
from kimideploy.errors import UsageError


def _pod_specs(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Deployment", "Job")]


def require_prerequisites(
    session: ClusterSession, objects: list[dict[str, Any]], cluster: str
) -> None:
    problems: list[str] = []
    hints: list[str] = []
    specs = _pod_specs(objects)
    classes = sorted({s["priorityClassName"] for s in specs if s.get("priorityClassName")})
    missing = session.missing_cluster_objects("PriorityClass", classes)
    if missing:
        problems.append(
            f"PriorityClass {', '.join(missing)} (clusters.{cluster}.priority_classes) does not "
            "exist on the cluster"
        )
        hints.append(
            "a cluster admin runs `kubectl apply -f k8s/base/priorityclasses.yaml`, or remove "
            f"clusters.{cluster}.priority_classes"
        )
    for name, key in sorted(_secret_keys(specs)):
        data = session.secret_keys(name)
        if data is None:
            problems.append(
                f"Secret {name} (clusters.{cluster}.workloads.serve.api_key) does not "
                f"exist in namespace {session.namespace}"
            )
        elif key not in data:
            problems.append(
                f"Secret {name} has no key {key} (clusters.{cluster}.workloads.serve."
                f"api_key.key; it has: {', '.join(sorted(data)) or 'none'})"
            )
        else:
            continue
        hints.append(
            f"`kubectl -n {session.namespace} create secret generic {name} "
            f"--from-literal={key}=...`, or fix workloads.serve.api_key"
        )
    queues = sorted(_queues(objects))
    version = session.local_queue_version() if queues else None
    for queue in queues:
        if version is None:
            problems.append(
                f"clusters.{cluster}.kueue names LocalQueue {queue}, but the cluster serves no "
                "kueue.x-k8s.io localqueues (v1beta2 or v1beta1: Kueue is not installed)"
            )
            hints.append(f"install Kueue, or remove clusters.{cluster}.kueue")
        elif session.local_queue(queue, version) is None:
            problems.append(
                f"LocalQueue {queue} (clusters.{cluster}.kueue.local_queue) does not exist in "
                f"namespace {session.namespace}"
            )
            hints.append(
                f"a cluster admin creates LocalQueue {queue} in {session.namespace} (pointing at "
                "a ClusterQueue with GPU quota), or fix kueue.local_queue"
            )
    if problems:
        raise UsageError(
            "nothing was applied: " + "; ".join(problems), hint="; ".join(dict.fromkeys(hints))
        )


def _queues(objects: list[dict[str, Any]]) -> set[str]:
    return {
        queue
        for obj in objects
        if (queue := obj["metadata"].get("labels", {}).get(KUEUE_QUEUE_LABEL))
    }


def _secret_keys(specs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    found = set()
    for spec in specs:
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            for entry in container.get("env", []):
                ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    found.add((ref["name"], ref["key"]))
    return found

"""Reading pods, their events and logs: what the rollout and job watchers report from."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kimideploy.cluster.api import KubeApi, NotFoundError
from kimideploy.cluster.resources import path


def list_pods(api: KubeApi, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.request(
        "GET", path("Pod", namespace), {"labelSelector": selector}
    ).get("items", [])
    return sorted(items, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))


def pod_events(api: KubeApi, namespace: str, pod: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={pod},involvedObject.kind=Pod"
    items: list[dict[str, Any]] = api.request(
        "GET", path("Event", namespace), {"fieldSelector": selector}
    ).get("items", [])
    return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


def pod_log(
    api: KubeApi, namespace: str, pod: str, tail: int | None = None, *, container: str | None = None
) -> str:
    query: dict[str, Any] = {}
    if tail:
        query["tailLines"] = tail
    if container:
        query["container"] = container
    try:
        return api.text(path("Pod", namespace, pod, "log"), query)
    except NotFoundError:
        return ""
    except Exception:  # logs are best-effort context for a failure report
        return ""


def follow_log(api: KubeApi, namespace: str, pod: str) -> Iterator[str]:
    return api.stream_lines(path("Pod", namespace, pod, "log"), {"follow": "true"})


def waiting_reason(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of the first waiting container, e.g. ImagePullBackOff."""
    for status in pod.get("status", {}).get("containerStatuses") or []:
        waiting = status.get("state", {}).get("waiting")
        if waiting:
            return waiting.get("reason", ""), waiting.get("message", "")
    return None


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def restart_count(pod: dict[str, Any]) -> int:
    return sum(
        s.get("restartCount", 0) for s in pod.get("status", {}).get("containerStatuses") or []
    )


def init_failure(pod: dict[str, Any]) -> str | None:
    """'init container model-check exited 1' when a pre-start check failed."""
    for status in pod.get("status", {}).get("initContainerStatuses") or []:
        state = status.get("state", {})
        terminated = state.get("terminated") or status.get("lastState", {}).get("terminated")
        if terminated and terminated.get("exitCode", 0) != 0:
            return f"init container {status['name']} exited {terminated['exitCode']}"
        if state.get("waiting", {}).get("reason") == "CrashLoopBackOff":
            return f"init container {status['name']} keeps failing (CrashLoopBackOff)"
    return None

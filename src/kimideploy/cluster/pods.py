"""Reading pods, their events and logs: what the rollout and job watchers report from."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
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
    api: KubeApi,
    namespace: str,
    pod: str,
    tail: int | None = None,
    *,
    container: str | None = None,
    timestamps: bool = False,
) -> str:
    """The log (its last `tail` lines), "" when it cannot be read; with `timestamps` each line
    starts with the kubelet's RFC 3339 time (what the start-up phase table reads)."""
    query: dict[str, Any] = {}
    if tail:
        query["tailLines"] = tail
    if container:
        query["container"] = container
    if timestamps:
        query["timestamps"] = "true"
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


def container_times(
    pod: dict[str, Any], container: str | None = None
) -> tuple[datetime | None, datetime | None]:
    """When the container (default: the first) last started, and when the pod became Ready
    (None where not yet): the ends of a start-up."""
    status_of = pod.get("status", {})
    # A native sidecar (online training's target server) reports among the init containers.
    statuses = (status_of.get("containerStatuses") or []) + (
        status_of.get("initContainerStatuses") or [] if container else []
    )
    status: dict[str, Any] = next((s for s in statuses if container in (None, s.get("name"))), {})
    started = _time((status.get("state", {}).get("running") or {}).get("startedAt"))
    conditions = pod.get("status", {}).get("conditions") or []
    ready = next(
        (c for c in conditions if c.get("type") == "Ready" and c.get("status") == "True"), None
    )
    return started, _time(ready.get("lastTransitionTime") if ready else None)


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
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

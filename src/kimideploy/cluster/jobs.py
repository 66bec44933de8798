"""Reading a Job run: its outcome, per-index failures, and the latest log lines of each index."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kimideploy.cluster import pods as pod_reads
from kimideploy.cluster.api import KubeApi, NotFoundError
from kimideploy.cluster.resources import path
from kimideploy.config.clusters import KUEUE_QUEUE_LABEL

INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
LOG_TAIL_LINES = 200


@dataclass(frozen=True)
class JobSnapshot:
    name: str
    phase: str  # pending, suspended (Kueue has not admitted it), running, complete, failed
    completions: int
    succeeded: int
    failed_indexes: tuple[int, ...]
    index_failures: dict[int, str] = field(default_factory=dict)
    logs: dict[int, str] = field(default_factory=dict)
    message: str = ""
    waiting: dict[int, str] = field(default_factory=dict)
    engine_startup: dict[str, Any] | None = None
    """The run's vLLM start-up by phase (formats/startup_phases.py), where the caller read it."""
    started_at: str | None = None
    """The Job's status.startTime (RFC 3339), once the Job controller started it."""
    finished_at: str | None = None
    """Its status.completionTime: set when it succeeded."""

    @property
    def done(self) -> bool:
        return self.phase in ("complete", "failed")


def parse_indexes(text: str | None) -> tuple[int, ...]:
    """'1,3-5' -> (1, 3, 4, 5), the API's compressed index lists."""
    found: list[int] = []
    for part in (text or "").split(","):
        if "-" in part:
            low, high = part.split("-")
            found.extend(range(int(low), int(high) + 1))
        elif part.strip():
            found.append(int(part))
    return tuple(found)


def job_phase(job: dict[str, Any]) -> tuple[str, str]:
    """(phase, why) of a Job from its conditions and spec: the one place a Job's phase is
    decided (`run`, `logs --follow` and `status` all read it here)."""
    status, spec = job.get("status", {}), job["spec"]
    conditions = {c["type"]: c for c in status.get("conditions", []) if c.get("status") == "True"}
    if "Complete" in conditions:
        return "complete", ""
    if "Failed" in conditions:
        return "failed", conditions["Failed"].get("message", "")
    if spec.get("suspend"):
        queue = job["metadata"].get("labels", {}).get(KUEUE_QUEUE_LABEL)
        return "suspended", (
            f"waiting for Kueue to admit it (LocalQueue {queue})" if queue else "suspended"
        )
    return ("running" if status.get("active") or status.get("ready") else "pending"), ""


def job_snapshot(api: KubeApi, namespace: str, name: str, with_logs: bool = True) -> JobSnapshot:
    try:
        job = api.request("GET", path("Job", namespace, name))
    except NotFoundError:
        return JobSnapshot(name, "failed", 0, 0, (), message=f"Job {name} no longer exists")
    status, spec = job.get("status", {}), job["spec"]
    phase, message = job_phase(job)
    pods = pod_reads.list_pods(api, namespace, f"batch.kubernetes.io/job-name={name}")
    latest: dict[int, dict[str, Any]] = {}
    for pod in pods:
        index = int(pod["metadata"].get("labels", {}).get(INDEX_LABEL, "0"))
        latest[index] = pod  # list_pods is oldest first, so the last one wins
    failures = {
        i: _failure(p) for i, p in latest.items() if p.get("status", {}).get("phase") == "Failed"
    }
    waiting = {i: w for i, p in latest.items() if (w := pod_waiting(p))}
    failed_indexes = parse_indexes(status.get("failedIndexes"))
    if phase == "failed" and not failed_indexes:
        # A gang's FailJob records no failedIndexes: the failed ranks are the pods that failed
        # on their own, not the ones the Job controller deleted after them.
        failed_indexes = tuple(
            sorted(
                i
                for i, p in latest.items()
                if i in failures and not p["metadata"].get("deletionTimestamp")
            )
        )
    logs = {}
    if with_logs:
        for index, pod in latest.items():
            if pod.get("spec", {}).get("nodeName"):
                logs[index] = pod_reads.pod_log(
                    api, namespace, pod["metadata"]["name"], tail=LOG_TAIL_LINES
                )
    return JobSnapshot(
        name=name,
        phase=phase,
        completions=spec.get("completions", 1),
        succeeded=status.get("succeeded", 0),
        failed_indexes=failed_indexes,
        index_failures=failures,
        logs=logs,
        message=message,
        waiting=waiting,
        started_at=status.get("startTime"),
        finished_at=status.get("completionTime"),
    )


def pod_waiting(pod: dict[str, Any]) -> str:
    """What holds a live pod back, or "": a container waiting on an error (CrashLoopBackOff,
    ImagePullBackOff), or a sidecar (online training's target server) not ready yet: its load
    can take half an hour while the trainer beside it only waits, which would otherwise look
    like a pod that runs and says nothing."""
    status = pod.get("status", {})
    if status.get("phase") not in ("Pending", "Running"):
        return ""
    for condition in status.get("conditions") or []:
        # A pod the scheduler cannot place (its GPUs held by a running release, a missing
        # resource) waits silently otherwise; the scheduler's message says for what.
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return f"unschedulable: {condition.get('message', '')}".rstrip(": ")
    sidecars = {
        c["name"]
        for c in pod.get("spec", {}).get("initContainers") or []
        if c.get("restartPolicy") == "Always"
    }
    statuses = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]
    for container in statuses:
        state, restarts = container.get("state", {}), container.get("restartCount", 0)
        again = f", restarted {restarts} times" if restarts else ""
        reason = (state.get("waiting") or {}).get("reason", "")
        if reason and reason not in ("ContainerCreating", "PodInitializing"):
            return f"{container['name']} {reason}{again}"
        if container["name"] in sidecars and not container.get("ready", False):
            since = (state.get("running") or {}).get("startedAt", "")
            started = f" since {since}" if since else ""
            return f"{container['name']} starting{started}{again}"
    return ""


def _failure(pod: dict[str, Any]) -> str:
    name = pod["metadata"]["name"]
    for status in pod.get("status", {}).get("containerStatuses") or []:
        terminated = status.get("state", {}).get("terminated")
        if terminated:
            return (
                f"pod {name}: container {status['name']} exited {terminated.get('exitCode')} "
                f"({terminated.get('reason', 'Error')})"
            )
    return f"pod {name}: {pod.get('status', {}).get('reason', 'failed')}"


def list_runs(api: KubeApi, namespace: str, selector: str) -> list[dict[str, Any]]:
    """kimideploy Jobs in the namespace, newest first."""
    items: list[dict[str, Any]] = api.request(
        "GET", path("Job", namespace), {"labelSelector": selector}
    ).get("items", [])
    return sorted(items, key=lambda j: j["metadata"]["creationTimestamp"], reverse=True)

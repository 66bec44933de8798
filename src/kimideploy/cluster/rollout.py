"""Following a Deployment rollout in phases a user understands, and recognising failures.

Timing uses this machine's clock from when the watcher first saw a pod in a state, not the pod's
own timestamps, so a skewed node clock cannot fake a timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kimideploy.cluster import pods as pod_reads
from kimideploy.cluster.api import KubeApi, NotFoundError
from kimideploy.cluster.resources import path

IMAGE_PULL_REASONS = frozenset(
    {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"}
)
CRASH_RESTARTS = 3


@dataclass(frozen=True)
class RolloutState:
    phase: str  # waiting, scheduling, pulling image, loading weights, ready, failed
    message: str
    failure: str | None = (
        None  # FailedScheduling, ImagePull, CrashLoop, StartupBudget, ProgressDeadline
    )
    pod: str | None = None

    @property
    def done(self) -> bool:
        return self.phase in ("ready", "failed")


@dataclass
class RolloutWatcher:
    """Polls one Deployment; remembers when it first saw each pod unscheduled or loading."""

    api: KubeApi
    namespace: str
    name: str
    startup_budget_s: float
    scheduling_grace_s: float = 120
    first_seen: dict[tuple[str, str], float] = field(default_factory=dict)

    def poll(self) -> RolloutState:
        try:
            deployment = self.api.request("GET", path("Deployment", self.namespace, self.name))
        except NotFoundError:
            return RolloutState("failed", f"Deployment {self.name} disappeared", "Deleted")
        selector = ",".join(
            f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items()
        )
        sets = self.api.request(
            "GET", path("ReplicaSet", self.namespace), {"labelSelector": selector}
        )
        pods = pod_reads.list_pods(self.api, self.namespace, selector)
        events = {
            p["metadata"]["name"]: pod_reads.pod_events(
                self.api, self.namespace, p["metadata"]["name"]
            )
            for p in pods
            if not p.get("spec", {}).get("nodeName")
        }
        snapshot = Snapshot(deployment, sets.get("items", []), pods, events)
        return classify(snapshot, self._elapsed, self.startup_budget_s, self.scheduling_grace_s)

    def _elapsed(self, pod: str, state: str) -> float:
        return time.monotonic() - self.first_seen.setdefault((pod, state), time.monotonic())


def _newest_hash(deployment: dict[str, Any], replica_sets: list[dict[str, Any]]) -> str | None:
    uid = deployment["metadata"]["uid"]
    owned = [
        rs
        for rs in replica_sets
        if any(o.get("uid") == uid for o in rs["metadata"].get("ownerReferences", []))
    ]
    if not owned:
        return None
    newest = max(
        owned,
        key=lambda rs: int(
            rs["metadata"].get("annotations", {}).get("deployment.kubernetes.io/revision", "0")
        ),
    )
    hash_value: str | None = newest["metadata"].get("labels", {}).get("pod-template-hash")
    return hash_value


@dataclass(frozen=True)
class Snapshot:
    """What one poll read: the Deployment, its ReplicaSets, its pods, and the events of the pods
    not yet on a node (why they are not)."""

    deployment: dict[str, Any]
    replica_sets: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    events: dict[str, list[dict[str, Any]]]


def classify(
    snapshot: Snapshot, elapsed: Callable[[str, str], float], budget: float, grace: float
) -> RolloutState:
    """Decide the rollout's phase from one snapshot; `elapsed(pod, state)` gives seconds seen,
    `budget` is the startup probe's and `grace` how long a pod may wait to be scheduled."""
    deployment, replica_sets = snapshot.deployment, snapshot.replica_sets
    pods, events = snapshot.pods, snapshot.events
    status, spec = deployment.get("status", {}), deployment["spec"]
    for condition in status.get("conditions", []):
        if (
            condition["type"] == "Progressing"
            and condition.get("reason") == "ProgressDeadlineExceeded"
        ):
            return RolloutState(
                "failed", condition.get("message", "progress deadline exceeded"), "ProgressDeadline"
            )
    if status.get("observedGeneration", 0) < deployment["metadata"].get("generation", 0):
        return RolloutState("waiting", "the Deployment controller has not seen the change yet")
    wanted = spec.get("replicas", 1)
    if (
        status.get("updatedReplicas", 0) == wanted
        and status.get("availableReplicas", 0) == wanted
        and status.get("replicas", 0) == wanted
    ):
        return RolloutState("ready", f"{wanted}/{wanted} replicas ready")
    newest = _newest_hash(deployment, replica_sets)
    current = [
        p
        for p in pods
        if p["metadata"].get("labels", {}).get("pod-template-hash") == newest
        and not p["metadata"].get("deletionTimestamp")
    ]
    if not current:
        return RolloutState("waiting", "waiting for new pods (old ones are stopping)")
    states = [
        _pod_state(p, events.get(p["metadata"]["name"], []), elapsed, budget, grace=grace)
        for p in current
    ]
    failed = [s for s in states if s.phase == "failed"]
    if failed:
        return failed[0]
    order = ("scheduling", "pulling image", "loading weights", "ready")
    slowest = min(states, key=lambda s: order.index(s.phase) if s.phase in order else -1)
    if slowest.phase == "ready":  # only the Deployment's own counts end a rollout
        return RolloutState(
            "waiting", "new pods are ready; waiting for the Deployment to count them"
        )
    return slowest


def _pod_state(
    pod: dict[str, Any],
    events: list[dict[str, Any]],
    elapsed: Callable[[str, str], float],
    budget: float,
    *,
    grace: float,
) -> RolloutState:
    name = pod["metadata"]["name"]
    if not pod.get("spec", {}).get("nodeName"):
        unschedulable = [e for e in events if e.get("reason") == "FailedScheduling"]
        if unschedulable:
            message = unschedulable[-1].get("message", "")
            if elapsed(name, "unscheduled") >= grace:
                return RolloutState(
                    "failed", f"pod {name} cannot be scheduled: {message}", "FailedScheduling", name
                )
            return RolloutState("scheduling", f"pod {name}: {message}", pod=name)
        return RolloutState("scheduling", f"pod {name} waiting for a node", pod=name)
    init_failure = pod_reads.init_failure(pod)
    if init_failure:
        return RolloutState("failed", f"pod {name}: {init_failure}", "InitFailed", name)
    waiting = pod_reads.waiting_reason(pod)
    if waiting and waiting[0] in IMAGE_PULL_REASONS:
        image = (pod["spec"].get("containers") or [{}])[0].get("image", "?")
        return RolloutState(
            "failed",
            f"pod {name} cannot pull {image}: {waiting[0]} {waiting[1]}".strip(),
            "ImagePull",
            name,
        )
    if (waiting and waiting[0] == "CrashLoopBackOff") or pod_reads.restart_count(
        pod
    ) >= CRASH_RESTARTS:
        restarts = pod_reads.restart_count(pod)
        return RolloutState(
            "failed", f"pod {name} is crash-looping ({restarts} restarts)", "CrashLoop", name
        )
    if pod.get("status", {}).get("phase") == "Pending":
        reason = waiting[0] if waiting else "ContainerCreating"
        return RolloutState(
            "pulling image", f"pod {name} on {pod['spec']['nodeName']}: {reason}", pod=name
        )
    if pod_reads.is_ready(pod):
        return RolloutState("ready", f"pod {name} ready", pod=name)
    seconds = elapsed(name, "loading")
    if seconds > budget:
        return RolloutState(
            "failed",
            f"pod {name} not ready after {seconds / 60:.1f} min: startup budget of "
            f"{budget / 60:.0f} min exceeded",
            "StartupBudget",
            name,
        )
    return RolloutState(
        "loading weights",
        f"pod {name}: {seconds / 60:.1f} of {budget / 60:.0f} min startup budget",
        pod=name,
    )

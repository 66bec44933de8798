"""What must already exist on the cluster before a workload is applied, checked read-only first.

A missing PriorityClass or API-key Secret is not caught by a server-side dry run of a Deployment
or Job (only their pods are checked, by the controllers, after the apply); without this the
release would sit with no pods, or pods in CreateContainerConfigError, until the timeout.
"""

from __future__ import annotations

import contextlib
import copy
import json
import secrets
import time
from typing import Any

from kimideploy.cluster.apply import ObjectRef
from kimideploy.cluster.jobs import JobSnapshot
from kimideploy.cluster.session import ClusterSession
from kimideploy.config.clusters import KUEUE_QUEUE_LABEL
from kimideploy.errors import UsageError
from kimideploy.plan.page_cache import LOCAL_COPY, WARMER


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
    for name, key, variable in sorted(_secret_keys(specs)):
        setting = SECRET_SETTINGS.get(variable, "").format(cluster=cluster) or "a Secret reference"
        data = session.secret_keys(name)
        if data is None:
            problems.append(
                f"Secret {name} ({setting}) does not exist in namespace {session.namespace}"
            )
        elif key not in data:
            problems.append(
                f"Secret {name} has no key {key} ({setting}.key; it has: "
                f"{', '.join(sorted(data)) or 'none'})"
            )
        else:
            continue
        hints.append(
            f"`kubectl -n {session.namespace} create secret generic {name} "
            f"--from-literal={key}=...`, or fix {setting}"
        )
    asked = _extended_resources(specs)
    offered = session.node_resources() if asked else None
    for name, count in sorted(asked.items()):
        if offered is not None and offered.get(name, 0) < count:
            most = offered.get(name, 0)
            problems.append(
                f"a pod asks for {count} {name} and no node of the cluster offers that many "
                f"(the most on one node: {most})"
            )
            hints.append(RESOURCE_HINTS.get(name, RESOURCE_HINT).format(cluster=cluster))
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


RESOURCE_HINTS = {
    "nvidia.com/gpu": "check clusters.{cluster}.gpu.per_node against `kubectl describe node` "
    "(the NVIDIA device plugin advertises nvidia.com/gpu)",
}
RESOURCE_HINT = (
    "install the device plugin that advertises it (an RDMA device plugin for "
    "clusters.{cluster}.network.rdma_resource), or set the resource name `kubectl describe node` "
    "shows"
)


def _extended_resources(specs: list[dict[str, Any]]) -> dict[str, int]:
    """The most of each extended resource one container limits itself to: what one node must
    offer (a GPU or RDMA device that no node advertises leaves the pod Pending for ever)."""
    asked: dict[str, int] = {}
    for spec in specs:
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            for name, quantity in ((container.get("resources") or {}).get("limits") or {}).items():
                if "/" in name and str(quantity).isdigit():
                    asked[name] = max(asked.get(name, 0), int(quantity))
    return asked


def _queues(objects: list[dict[str, Any]]) -> set[str]:
    return {
        queue
        for obj in objects
        if (queue := obj["metadata"].get("labels", {}).get(KUEUE_QUEUE_LABEL))
    }


SECRET_SETTINGS = {
    "VLLM_API_KEY": "clusters.{cluster}.workloads.serve.api_key",
    "KIMIDEPLOY_API_KEY": "clusters.{cluster}.workloads.serve.api_key",
    "volume:hub-token": "model.hf_token",
}
"""The setting each Secret-backed variable comes from, for the refusal to name."""


def _secret_keys(specs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(Secret, key, what uses it): environment references and mounted Secret files."""
    found = set()
    for spec in specs:
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            for entry in container.get("env", []):
                ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    found.add((ref["name"], ref["key"], entry["name"]))
        for volume in spec.get("volumes", []):
            secret = volume.get("secret") if f"volume:{volume['name']}" in SECRET_SETTINGS else None
            if not secret:
                continue
            for item in secret.get("items", []):
                found.add((secret["secretName"], item["key"], f"volume:{volume['name']}"))
    return found


PROBE_TIMEOUT_S = 300.0
"""A probe pod on a CPU node: seconds, or an image pull; a probe that does not finish by then
is reported as such (the weights' state is then unknown, and nothing is applied)."""


def require_weights(
    session: ClusterSession, probes: tuple[dict[str, Any], ...], cluster: str, poll_s: float = 1.0
) -> list[str]:
    """Run the plan's preflight Jobs in order. The weights probe (plan.weights): the models
    claim mounted read-only, exactly as the pods mount it, each completion marker tested; a
    missing one is a refusal before anything of the release or run is applied, naming the
    folder and the command that fills it. Then the node-local copy (a failure refuses: the serve
    pods would find no target) and the page-cache warmer (a failure is a note: the pods load
    cold). Returns what the readers measured, one line each."""
    notes: list[str] = []
    for probe in probes:
        component = probe["metadata"].get("labels", {}).get(COMPONENT_LABEL)
        if component in (LOCAL_COPY, WARMER):
            notes.append(_run_reader(session, probe, component, poll_s))
            continue
        claims = session.list_claims()
        mounted = [
            v["persistentVolumeClaim"]["claimName"]
            for v in probe["spec"]["template"]["spec"]["volumes"]
            if "persistentVolumeClaim" in v
        ]
        missing_claims = [c for c in mounted if c not in claims]
        if missing_claims:
            raise UsageError(
                f"nothing was applied: the models claim {', '.join(missing_claims)} does not exist "
                f"in namespace {session.namespace}, so no weights were downloaded into it",
                hint=f"`kimideploy host sync-model --cluster {cluster}` creates it and downloads "
                "the pinned revision into it (a Job)",
            )
        _run_probe(session, probe, cluster, poll_s)
    return notes


COMPONENT_LABEL = "app.kubernetes.io/component"
READER_TIMEOUT_S = 7200.0
"""A copy or a warm-up of 595 GB: an hour at 0.17 GB/s; past two the storage is the problem."""


def reader_results(snapshot: JobSnapshot) -> list[dict[str, Any]]:
    """Each index's result line of workloads/page_cache.py, index order."""
    found = []
    for _, log in sorted(snapshot.logs.items()):
        for line in reversed(log.splitlines()):
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("event") == "result":
                    found.append(event)
                    break
    return found


def _run_reader(
    session: ClusterSession, probe: dict[str, Any], component: str, poll_s: float
) -> str:
    snapshot = run_probe_job(session, probe, READER_TIMEOUT_S, poll_s)
    results = reader_results(snapshot)
    what = "the node-local copy" if component == LOCAL_COPY else "the page-cache warmer"
    if snapshot.phase != "complete" or len(results) < snapshot.completions:
        tail = " | ".join(snapshot.logs.get(0, "").strip().splitlines()[-3:])
        why = snapshot.message or "; ".join(snapshot.waiting.values()) or snapshot.phase
        if component == LOCAL_COPY:
            raise UsageError(
                f"nothing was applied: {what} did not finish on every GPU node ({why}) {tail}",
                hint="`kubectl describe` its pods; the namespace's Pod Security level must allow "
                "host paths (storage.node_local), and the folder needs room for the checkpoint",
            )
        return f"warning: {what} did not finish ({why}): the serve pods load from the storage"
    slowest = min(results, key=lambda r: float(r.get("gbps") or 0))
    size = float(slowest.get("bytes") or 0) / 1e9
    return (
        f"{what}: {size:.0f} GB on {len(results)} node(s), the slowest at "
        f"{float(slowest.get('gbps') or 0):.2f} GB/s"
    )


VOLUME_BINDING_IN_PROGRESS = (
    "unbound immediate persistentvolumeclaims",
    "bound to non-existent persistentvolume",
    "waiting for first consumer",
)
"""The scheduler's words for a claim that is still being bound or provisioned: the next attempt
places the pod, so a wait that stopped here would fail an upload or a probe that was about to run
(seen on the test control plane right after a claim was created)."""


def placement_refused(waiting: dict[Any, str]) -> bool:
    """Whether a pod's wait is the scheduler's verdict (no node has the GPUs, the selector matches
    nothing), not a claim on its way to being bound."""
    return any(
        reason.startswith("unschedulable")
        and not any(words in reason.lower() for words in VOLUME_BINDING_IN_PROGRESS)
        for reason in waiting.values()
    )


def run_probe_job(
    session: ClusterSession, probe: dict[str, Any], timeout_s: float, poll_s: float
) -> JobSnapshot:
    """Apply a probe Job under a fresh name, follow it to its end (or the timeout), delete it:
    its last snapshot, logs included. A pod the scheduler cannot place ends the wait early (the
    snapshot's waiting says why), unless its claim is only still being bound."""
    named = copy.deepcopy(probe)
    named["metadata"]["name"] = f"{probe['metadata']['name']}-{secrets.token_hex(3)}"
    name = named["metadata"]["name"]
    session.apply([named])
    try:
        deadline = time.monotonic() + timeout_s
        snapshot = session.job(name)
        while not snapshot.done and time.monotonic() < deadline:
            if placement_refused(snapshot.waiting):
                break
            time.sleep(poll_s)
            snapshot = session.job(name)
    finally:
        session.delete(ObjectRef("Job", session.namespace, name))
    return snapshot


def _run_probe(session: ClusterSession, probe: dict[str, Any], cluster: str, poll_s: float) -> None:
    snapshot = run_probe_job(session, probe, PROBE_TIMEOUT_S, poll_s)
    name = snapshot.name
    if not snapshot.done:
        held = "; ".join(snapshot.waiting.values())
        why = held or f"{snapshot.phase}: {snapshot.message or 'no message'}"
        raise UsageError(
            f"nothing was applied: the weights probe {name} did not finish ({why})",
            hint="a CPU pod could not start in the namespace: `kubectl describe` its pod, or "
            "check the cluster's tools image can be pulled",
        )
    if snapshot.phase == "failed":
        log = snapshot.logs.get(0, "")
        missing = [
            line.split(" ", 1)[1] for line in log.splitlines() if line.startswith("missing ")
        ]
        what = ", ".join(missing) if missing else "a completion marker (the probe's log is empty)"
        raise UsageError(
            f"nothing was applied: the models volume, as the pods mount it, has no {what}: the "
            "download has not finished there (or went to a node's own disk)",
            hint=f"`kimideploy host sync-model --cluster {cluster}` downloads it into the models "
            "claim (a resumable Job); run it, then this command again",
        )

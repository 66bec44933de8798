"""`host check`'s checks that run on the cluster, not over SSH: what the pods will see.

- The weights, where the pods mount a shared models claim (workloads.weights.via: job): a node's
  own disk, which SSH reads, says nothing of that claim. The same probe `up` and `run` start
  (plan.weights) mounts it read-only and tests each completion marker.
- `--allreduce`: the serve pod's first collective on one node's GPUs (plan.node_probe), its bus
  bandwidth against network.min_node_bus_gbps; a hang is named after the timeout.
"""

from __future__ import annotations

import re

from kimideploy.cluster.session import ClusterSession
from kimideploy.config.loading import LoadedProject
from kimideploy.errors import KimiDeployError
from kimideploy.formats.check_result import CheckResult
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.node_probe import RESULT_PREFIX
from kimideploy.plan.resolve import resolve
from kimideploy.render.manifests import render_objects
from kimideploy.services.preflight import COMPONENT_LABEL, require_weights, run_probe_job
from kimideploy.services.storage_probe import measure_storage

ALLREDUCE_LINE = re.compile(r"^gpu-check: (ok  |FAIL) allreduce: (.*)$", re.M)


def serve_request(cluster: str, overrides: tuple[str, ...]) -> PlanRequest:
    """The serve plan the probes come from (resolved with the session's answers)."""
    return PlanRequest("serve", cluster, overrides=overrides)


def weights_check(
    session: ClusterSession,
    loaded: LoadedProject,
    cluster: str,
    *,
    overrides: tuple[str, ...] = (),
    poll_s: float,
) -> CheckResult:
    """The serve plan's weights probe, as `up` runs it, as one row."""
    plan = resolve(loaded, serve_request(cluster, overrides), session.answers)
    # The weights probe only: the node-local copy and the page-cache warmer are `up`'s.
    weights_probes = tuple(
        p for p in plan.preflight if p.values["labels"].get(COMPONENT_LABEL) == "weights-probe"
    )
    probes = tuple(render_objects(weights_probes, plan.kubernetes_version))
    try:
        require_weights(session, probes, cluster, poll_s)
    except KimiDeployError as exc:
        message = exc.message.removeprefix("nothing was applied: ")
        return CheckResult("weights on the models claim", False, message, exc.hint or "")
    return CheckResult(
        "weights on the models claim",
        True,
        f"every completion marker present, read by a pod from claim {plan.project}-models",
    )


def storage_check(
    session: ClusterSession,
    loaded: LoadedProject,
    cluster: str,
    *,
    overrides: tuple[str, ...] = (),
    poll_s: float,
) -> CheckResult:
    """The models claim's cold read bandwidth, read by a pod as the serve pod mounts it, and
    recorded on the cluster (the serve plan chooses its reader, and a node-local copy, from it)."""
    plan = resolve(loaded, serve_request(cluster, overrides), session.answers)
    name = "models read bandwidth"
    try:
        entry = measure_storage(session, plan, poll_s)
    except KimiDeployError as exc:
        return CheckResult(name, False, exc.message, exc.hint or "")
    load = loaded.project.clusters[cluster].workloads.serve.load
    gbps, weights_gb = entry["gbps"], loaded.project.model.weights_gb
    minutes = weights_gb / max(gbps, 1e-6) / 60
    detail = (
        f"{gbps:.2f} GB/s cold over {entry['bytes'] / 1e9:.0f} GB: {weights_gb:.0f} GB read in "
        f"about {minutes:.0f} min (recorded; the next plan reads it)"
    )
    slow = gbps < load.min_read_gbps
    fix = (
        f"below min_read_gbps {load.min_read_gbps:g}: set storage.node_local (a node NVMe "
        "folder) so `up` serves from a copy there"
        if slow
        else ""
    )
    return CheckResult(name, not slow, detail, fix, blocking=False)


def allreduce_check(
    session: ClusterSession,
    loaded: LoadedProject,
    cluster: str,
    *,
    overrides: tuple[str, ...] = (),
    timeout_s: float,
    poll_s: float,
) -> CheckResult:
    """One node's all-reduce in the serve image, read from the probe pod's log."""
    plan = resolve(loaded, serve_request(cluster, overrides), session.answers)
    assert plan.gpu_probe is not None
    job = render_objects((plan.gpu_probe,), plan.kubernetes_version)[0]
    snapshot = run_probe_job(session, job, timeout_s, poll_s)
    log = snapshot.logs.get(0, "")
    found = ALLREDUCE_LINE.search(log)
    name = "all-reduce on one node"
    if found:
        ok = found.group(1) == "ok  "
        return CheckResult(
            name,
            ok,
            found.group(2),
            "peer-to-peer is blocked or slow: see IOMMU, PCIe ACS, BAR1 and the topology above",
        )
    if not snapshot.done:
        held = "; ".join(snapshot.waiting.values()) or snapshot.phase
        return CheckResult(
            name,
            False,
            f"the probe did not run to its end within {timeout_s:g} s ({held})",
            "its GPUs must be free: run it before `up`, or after `down`; a first run pulls "
            "the serve image (minutes): raise --timeout",
        )
    last = [line.removeprefix(RESULT_PREFIX) for line in log.strip().splitlines()[-3:]]
    return CheckResult(
        name,
        False,
        f"the probe {snapshot.phase} without an all-reduce line: {' | '.join(last) or 'no log'}",
        f"`kubectl -n {session.namespace} describe job` of the probe, and the GPU check's "
        "lines above it in its log",
    )

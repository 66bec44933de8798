"""The storage probe: the models claim's cold read bandwidth, measured from a pod as the serve
pod mounts it (plan/page_cache.py storage_probe_job) and kept on the cluster, so the next plan
chooses the reader (and a node-local copy) from a measurement instead of a guess. `host check`
runs it; `up` runs it before the first load where the reader depends on it."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from kimideploy.cluster.session import ClusterSession
from kimideploy.config.loading import LoadedProject
from kimideploy.errors import KimiDeployError
from kimideploy.plan.model import Plan, PlanRequest
from kimideploy.render.manifests import render_objects
from kimideploy.services.preflight import reader_results, run_probe_job
from kimideploy.services.rendering import Rendered, render_workload

PROBE_TIMEOUT_S = 1800.0
"""20 GB at 0.1 GB/s is about 3.5 minutes; a probe still reading at half an hour says enough."""


def measure_storage(session: ClusterSession, plan: Plan, poll_s: float = 1.0) -> dict[str, Any]:
    """Run the plan's storage probe and record what it read (the `storage` measurement)."""
    if plan.storage_probe is None:
        raise KimiDeployError(f"a {plan.workload} plan has no storage probe")
    probe = render_objects((plan.storage_probe,), plan.kubernetes_version)[0]
    snapshot = run_probe_job(session, probe, PROBE_TIMEOUT_S, poll_s)
    results = reader_results(snapshot)
    if snapshot.phase != "complete" or not results:
        tail = " | ".join(snapshot.logs.get(0, "").strip().splitlines()[-3:])
        why = snapshot.message or "; ".join(snapshot.waiting.values()) or snapshot.phase
        raise KimiDeployError(
            f"the storage probe did not finish ({why}) {tail}".strip(),
            hint="`kimideploy host check` runs it alone; the models claim must hold the "
            "downloaded target (`kimideploy host sync-model`)",
        )
    found = results[-1]
    entry = {
        "gbps": float(found.get("gbps") or 0.0),
        "bytes": int(found.get("bytes") or 0),
        "seconds": float(found.get("seconds") or 0.0),
        "claim": f"{plan.project}-models",
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    session.record_measurement("storage", entry)
    return entry


def render_measured(
    session: ClusterSession, loaded: LoadedProject, request: PlanRequest
) -> Rendered:
    """The plan with the cluster's answers; where its reader waits on a storage measurement the
    cluster lacks, the probe runs first and the plan is made again with what it measured."""
    rendered = render_workload(loaded, request, session.answers)
    if not rendered.plan.measure_storage_first:
        return rendered
    entry = measure_storage(session, rendered.plan)
    answers = replace(session.answers, storage_read_gbps=entry["gbps"])
    return render_workload(loaded, request, answers)

"""What the serve release is doing: its revision history and the serving status with live
acceptance and recent runs."""

from __future__ import annotations

from typing import Any

from kimideploy.cluster.jobs import job_phase
from kimideploy.cluster.records import ReleaseRecord
from kimideploy.cluster.session import ClusterSession
from kimideploy.config.project import Project
from kimideploy.plan.inputs import CANARY_SUFFIX
from kimideploy.services.release import lifecycle
from kimideploy.services.release.canary import canary_share
from kimideploy.services.release.swap import keepers_now
from kimideploy.services.release.watch import live_acceptance
from kimideploy.services.runs import rental


def ignored_records(session: ClusterSession, release: str) -> list[str]:
    """Why stored records were not trusted (read after `history_rows` or `status_report`)."""
    return [error.message for error in session.ignored_records.get(release, [])]


def history_rows(session: ClusterSession, release: str) -> list[dict[str, Any]]:
    return [
        {
            "revision": r.revision,
            "time": r.created_at,
            "drafter": r.drafter,
            "image": r.image.split("@")[-1][:19],
            "status": r.status,
            "change": change_summary(r),
            "user": r.user,
            "gate": gate_summary(r),
            "note": r.note,
        }
        for r in session.history(release)
    ]


def change_summary(record: ReleaseRecord) -> str:
    """How the revision reached the pods: "swap" (the drafter swapped into the running server,
    no reload), "swap refused" (the server refused the files; the pods were replaced), "swap
    (not waited for)" (`--no-wait`), "swap failed" or "rollout"; a revision with a canary pool
    says its share of the route ("canary 10%", "canary 0%" after a refusal)."""
    share = canary_share(record.manifests, record.release)
    if share is not None:
        return f"canary {share}%"
    swapped = record.details.get("swap")
    if not swapped:
        return "rollout"
    return {
        "ready": "swap",
        "refused": "swap refused",
        "not waited for": "swap (not waited for)",
    }.get(swapped["outcome"], "swap failed")


def gate_summary(record: ReleaseRecord) -> str:
    verdict = record.details.get("gate")
    return str(verdict["summary"]) if verdict else ""


def status_report(
    session: ClusterSession, release: str, project: Project, cluster: str
) -> dict[str, Any]:
    """The serving release (revision, drafter, readiness), recent runs, and on a rented cluster
    what its volumes hold that is not published yet."""
    project_name = project.name
    history = session.history(release)
    current = lifecycle.serving(history)
    deployment = session.get("Deployment", release)
    serving: dict[str, Any] = {"release": release, "namespace": session.namespace}
    if current is not None:
        serving.update(
            revision=current.revision,
            drafter=current.drafter,
            image=current.image,
            since=current.created_at,
            change=change_summary(current),
        )
        canary = next((o for o in current.manifests if o["kind"] == "Deployment"
                       and o["metadata"]["name"].endswith(CANARY_SUFFIX)), None)  # fmt: skip
        if canary is not None:
            labels = canary["spec"]["template"]["metadata"]["labels"]
            share = canary_share(current.manifests, release)
            serving["canary"] = f"{labels.get('kimideploy.io/drafter')} takes {share}% of the route"
    gated = next((r for r in reversed(history) if r.details.get("gate")), None)
    if gated is not None:
        serving["gate"] = f"revision {gated.revision} ({gated.drafter}) {gate_summary(gated)}"
    if deployment is None:
        serving["phase"] = "not deployed"
    else:
        status, wanted = deployment.get("status", {}), deployment["spec"].get("replicas", 1)
        ready = status.get("readyReplicas", 0)
        serving["phase"] = "ready" if ready == wanted else "progressing"
        serving["ready"] = f"{ready}/{wanted}"
        if current is not None and ready:
            serving.update(live_acceptance(session, current))
            in_pods = keepers_now(session, current.manifests, current.drafter)
            if in_pods:
                serving["drafter_in_pods"] = in_pods
    runs = []
    for job in session.runs(
        f"app.kubernetes.io/name={project_name},app.kubernetes.io/managed-by=kimideploy"
    )[:10]:
        labels = job["metadata"]["labels"]
        state, _ = job_phase(job)
        runs.append(
            {
                "run_id": labels.get("kimideploy.io/run-id"),
                "workload": labels.get("app.kubernetes.io/component"),
                "job": job["metadata"]["name"],
                "status": state,
                "started": job["metadata"]["creationTimestamp"],
            }
        )
    notice = rental.cluster_notice(session, project, cluster)
    return {
        "serving": serving,
        "runs": runs,
        "rental": notice.to_dict() if notice else None,
        "rental_lines": _rental_lines(notice),
    }


def _rental_lines(notice: rental.RentalNotice | None) -> list[str]:
    lines: list[str] = []
    rental.report(notice, lines.append)
    return lines

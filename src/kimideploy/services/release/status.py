"""What the serve release is doing: its revision history and the serving status with live
acceptance and recent runs."""

from __future__ import annotations

import json
from typing import Any

from kimideploy.cluster.jobs import job_phase
from kimideploy.cluster.records import ReleaseRecord
from kimideploy.cluster.session import ClusterSession
from kimideploy.config.project import Project
from kimideploy.config.specs import SPEC_FILE_NAME
from kimideploy.formats.capture_status import capture_state
from kimideploy.formats.startup_phases import StartupPhases
from kimideploy.plan.inputs import CANARY_SUFFIX, DATASETS_MOUNT
from kimideploy.plan.stage_estimate import MeasuredRate, span
from kimideploy.services.release import lifecycle
from kimideploy.services.release.changes import canary_share, change_summary
from kimideploy.services.release.swap import keepers_now
from kimideploy.services.release.watch import live_acceptance, scrape_serve_pods
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
            "start-up": startup_summary(r.details.get("startup")),
            "note": r.note,
        }
        for r in session.history(release)
    ]


def startup_summary(startup: dict[str, Any] | None) -> str:
    """A revision's pods' start-up against the plan's prediction ("" where no pod started)."""
    if not startup or startup.get("total_s") is None:
        return ""
    took = float(startup["total_s"])
    predicted = startup.get("predicted_s")
    if not isinstance(predicted, int | float) or predicted <= 0:
        return f"{span(took)}"
    return f"{span(took)} (predicted {span(predicted)}, {took / predicted - 1:+.0%})"


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
        if current is not None:
            serving.update(capture_of(session, current))
        if current is not None and ready:
            serving.update(live_acceptance(session, current))
            in_pods = keepers_now(session, current.manifests, current.drafter)
            if in_pods:
                serving["drafter_in_pods"] = in_pods
    runs = []
    measured = {r.run_id: r for r in session.answers.rates}
    for job in session.runs(
        f"app.kubernetes.io/name={project_name},app.kubernetes.io/managed-by=kimideploy"
    )[:10]:
        labels = job["metadata"]["labels"]
        state, _ = job_phase(job)
        run_id = labels.get("kimideploy.io/run-id")
        kept = measured.get(str(run_id))
        runs.append(
            {
                "run_id": run_id,
                "workload": labels.get("app.kubernetes.io/component"),
                "job": job["metadata"]["name"],
                "status": state,
                "started": job["metadata"]["creationTimestamp"],
                "took": _took(kept),
            }
        )
    notice = rental.cluster_notice(session, project, cluster)
    startup = serving_startup(history, current)
    return {
        "serving": serving,
        "startup": startup,
        "startup_lines": [
            *StartupPhases.from_dict(startup).lines(),
            *([f"  predicted {startup_summary(startup)}"] if startup.get("predicted_s") else []),
        ]
        if startup
        else [],
        "runs": runs,
        "rental": notice.to_dict() if notice else None,
        "rental_lines": _rental_lines(notice),
    }


def capture_of(session: ClusterSession, record: ReleaseRecord) -> dict[str, Any]:
    """Whether the serving revision records prompts (its spec has a capture), and what its
    folder holds, from the sidecars' own series."""
    spec: dict[str, Any] = next(
        (
            json.loads(o["data"][SPEC_FILE_NAME])
            for o in record.manifests
            if o["kind"] == "ConfigMap" and SPEC_FILE_NAME in o.get("data", {})
        ),
        {},
    )
    capture = spec.get("capture")
    if not capture:
        return {"capture": "off (serve.capture is not set)"}
    folder = str(capture["directory"]).removeprefix(f"{DATASETS_MOUNT}/")
    texts, _ = scrape_serve_pods(session, record.release, int(capture["listen_port"]))
    return capture_state(texts, f"{folder} on the datasets volume")


def _took(kept: MeasuredRate | None) -> str:
    """A finished run's wall time against what its plan predicted ("" before it finished)."""
    if kept is None:
        return ""
    if not kept.predicted_s:
        return span(kept.wall_s)
    off = kept.wall_s / kept.predicted_s - 1
    return f"{span(kept.wall_s)} (predicted {span(kept.predicted_s)}, {off:+.0%})"


def serving_startup(
    history: list[ReleaseRecord], current: ReleaseRecord | None
) -> dict[str, Any] | None:
    """The start-up by phase of the pods that serve: recorded by the newest revision up to the
    serving one that started pods (a swap or a switch keeps the pods an earlier one started)."""
    if current is None:
        return None
    started = [r for r in history if r.revision <= current.revision and r.details.get("startup")]
    if not started:
        return None
    return {"revision": started[-1].revision, **started[-1].details["startup"]}


def _rental_lines(notice: rental.RentalNotice | None) -> list[str]:
    lines: list[str] = []
    rental.report(notice, lines.append)
    return lines

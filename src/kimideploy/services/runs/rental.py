"""What a rented cluster's volumes hold that nothing else has, and how long they have.

A rental's volumes are deleted with it: a drafter trained there and the conversations generated
there (five hours of the target's time last time) are lost unless published first. What is
listed comes from the config and the cluster's runs: the drafter its pipeline trains (unless
its registry entry is pinned to a published artifact) and the conversations its pipeline
generates (unless a `datasets:` entry holds that fingerprint, or the pipeline takes published
ones). Runs seen on the cluster (Jobs live 7 days after they finish) say which of those were
actually made there; the others are listed as "if made", since an inventory of the volume
itself would need a pod on it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kimideploy.cluster.records import DRAFTER_LABEL
from kimideploy.cluster.session import ClusterSession
from kimideploy.config.project import Project
from kimideploy.plan.data_layout import conversations_id

RUN_ID_LABEL = "kimideploy.io/run-id"  # as services/runs/batch_runs.py, which imports this module
COMPONENT_LABEL = "app.kubernetes.io/component"


@dataclass(frozen=True)
class Unpublished:
    what: str
    command: str
    evidence: str


@dataclass(frozen=True)
class RentalNotice:
    cluster: str
    ends: datetime
    hours_left: float
    warn: bool
    unpublished: list[Unpublished] = field(default_factory=list)

    def headline(self) -> str:
        at = f"{self.ends.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
        if self.hours_left <= 0:
            when = f"ended {-self.hours_left:.0f} h ago ({at})"
        else:
            when = f"ends in {_span(self.hours_left)} ({at})"
        count = len(self.unpublished)
        tail = (
            f"; {count} thing(s) on its volumes are not published"
            if count
            else "; everything it made is published"
        )
        return f"cluster {self.cluster} is rented: its volumes go with it, the rental {when}{tail}"

    def lines(self) -> list[str]:
        return [f"  {u.what} ({u.evidence}): {u.command}" for u in self.unpublished]

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "ends": self.ends.isoformat(),
            "hours_left": round(self.hours_left, 1),
            "warn": self.warn,
            "unpublished": [u.__dict__ for u in self.unpublished],
        }


def _span(hours: float) -> str:
    return f"{hours / 24:.1f} days" if hours >= 48 else f"{hours:.0f} h"


def rental_notice(
    project: Project, cluster: str, now: datetime, runs: list[dict[str, Any]]
) -> RentalNotice | None:
    """None when the cluster is not rented. `runs` are the cluster's Jobs (newest first)."""
    profile = project.clusters[cluster]
    if profile.rental is None:
        return None
    rental = profile.rental
    hours_left = (rental.ends - now).total_seconds() / 3600
    made = _made_by_runs(runs)
    train = profile.workloads.train
    found: list[Unpublished] = []
    drafter = project.eagle_drafters.get(train.drafter)
    if drafter is not None and drafter.source.oci is None and drafter.source.path is not None:
        found.append(
            Unpublished(
                f"drafter {train.drafter} (models volume, {drafter.source.path})",
                f"kimideploy drafter publish {train.drafter} --cluster {cluster}",
                _evidence(made, "train", train.drafter),
            )
        )
    if train.conversations is None:
        made_id = conversations_id(project, cluster)
        published = {d.fingerprint for d in project.datasets.values()}
        if made_id not in published:
            found.append(
                Unpublished(
                    f"conversations {made_id} of pipeline {train.drafter} (datasets volume)",
                    f"kimideploy data publish NAME --cluster {cluster}",
                    _evidence(made, "datagen", train.drafter),
                )
            )
    return RentalNotice(cluster, rental.ends, hours_left, hours_left <= rental.warn_hours, found)


def _made_by_runs(runs: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """(workload, drafter) -> the newest run id that made it and succeeded."""
    made: dict[tuple[str, str], str] = {}
    for job in runs:
        labels = job.get("metadata", {}).get("labels", {})
        succeeded = any(
            c.get("type") == "Complete" and c.get("status") == "True"
            for c in job.get("status", {}).get("conditions", [])
        )
        key = (labels.get(COMPONENT_LABEL, ""), labels.get(DRAFTER_LABEL, ""))
        if succeeded and key not in made:
            made[key] = labels.get(RUN_ID_LABEL, "?")
    return made


def _evidence(made: dict[tuple[str, str], str], workload: str, drafter: str) -> str:
    run = made.get((workload, drafter))
    return f"made by run {run}" if run else f"if made: no finished {workload} run seen in 7 days"


def cluster_notice(session: ClusterSession, project: Project, cluster: str) -> RentalNotice | None:
    """The notice for a cluster, judged on its API server's clock, from its runs."""
    if project.clusters[cluster].rental is None:
        return None
    selector = f"app.kubernetes.io/name={project.name},app.kubernetes.io/managed-by=kimideploy"
    return rental_notice(project, cluster, session.server_time(), session.runs(selector))


def report(notice: RentalNotice | None, say: Callable[[str], None]) -> None:
    """Said before a run and by `status`: a warning near (or past) the end, a note before."""
    if notice is None or (not notice.unpublished and not notice.warn):
        return
    say(("warning: " if notice.warn else "note: ") + notice.headline())
    for line in notice.lines():
        say(line)

"""`kimideploy drafter pull NAME... --cluster C`, and the published drafters `host sync-model`
fetches: a Job on C runs the artifact-pull the serve pod runs first (same image, pull Secret, CA,
destination and checks), so the serve window later finds the drafter there by digest and its
init container fetches nothing. Pulling ahead is worth it where a serve window is short (a pull
of a large drafter inside it delays the 25-minute load) and on the PCIe host before a planned
switch.
"""

from __future__ import annotations

from dataclasses import dataclass

from kimideploy.cluster.session import ClusterSession
from kimideploy.config.loading import LoadedProject
from kimideploy.config.project import Project
from kimideploy.errors import KimiDeployError
from kimideploy.plan.asks import PullAsk
from kimideploy.plan.model import PlanRequest
from kimideploy.services.reporting import Reporter
from kimideploy.services.runs import batch_runs


@dataclass(frozen=True)
class PulledDrafter:
    name: str
    reference: str
    dest: str
    state: str
    """`pulled`, or `present` when the volume already held that digest."""


def published_drafters(project: Project) -> tuple[str, ...]:
    """The registry's drafters pinned by digest (source.oci), in name order."""
    return tuple(
        sorted(name for name, d in project.eagle_drafters.items() if d.source.oci is not None)
    )


def pull_drafters(
    session: ClusterSession,
    loaded: LoadedProject,
    names: tuple[str, ...],
    cluster: str | None,
    *,
    reporter: Reporter,
    poll_s: float = 2.0,
) -> list[PulledDrafter]:
    """Run the pull Job to its end; each drafter's reference and where it now is."""
    request = PlanRequest("pull", cluster, names[0], ask=PullAsk(drafters=names))
    started = batch_runs.start_run(session, loaded, request, reporter)
    snapshot = batch_runs.follow_run(session, started.job, started.run_id, reporter, poll_s=poll_s)
    result = batch_runs.run_results(snapshot).get("0")
    if not result or "pulled" not in result:
        raise KimiDeployError(
            f"the pull Job {started.job} ended without reporting what it pulled",
            hint=f"`kimideploy logs {started.run_id}` shows what the pod did",
        )
    return [
        PulledDrafter(str(p["name"]), str(p["reference"]), str(p["dest"]), str(p["state"]))
        for p in result["pulled"]
    ]

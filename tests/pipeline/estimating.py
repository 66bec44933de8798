"""What the estimate tests share: a finished run recorded as `run` records a Job, the tier's
project planned as one process, and the plan's estimate from a recorded rate."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from kimideploy.cluster.jobs import JobSnapshot
from kimideploy.config.loading import LoadedProject
from kimideploy.plan.model import ClusterAnswers, PlanRequest
from kimideploy.plan.resolve import resolve
from kimideploy.plan.stage_estimate import MeasuredRate, StageEstimate
from kimideploy.services.runs.run_rates import measured_rate


def recorded(workload: str, stdout: str, seconds: float, run_id: str) -> MeasuredRate:
    """What `run` keeps of a finished Job, from this run's own stdout and wall time."""
    ended = datetime.now(UTC)
    began = ended - timedelta(seconds=seconds)
    snapshot = JobSnapshot(run_id, "complete", 1, 1, (), logs={0: stdout},
                           started_at=began.isoformat(), finished_at=ended.isoformat())  # fmt: skip
    rate = measured_rate(snapshot, workload, run_id, 0)
    assert rate is not None, stdout[-2000:]
    return rate


def one_rank(project: LoadedProject) -> LoadedProject:
    """The pipeline project with one GPU per node: the tier runs a workload's pod as one process
    (pods.run_workload), where the rendered Job's launcher would start a rank per GPU; a plan of
    two ranks counts half the steps the process takes."""
    clusters = dict(project.project.clusters)
    cpu = clusters["cpu"]
    clusters["cpu"] = cpu.model_copy(update={"gpu": cpu.gpu.model_copy(update={"per_node": 1})})
    return replace(project, project=project.project.model_copy(update={"clusters": clusters}))


def estimate(project: LoadedProject, workload: str, drafter: str | None, rate: MeasuredRate,
             *overrides: str) -> StageEstimate:  # fmt: skip
    """The next run's estimate on the cluster that kept `rate`: made from it, not from a prior."""
    plan = resolve(one_rank(project), PlanRequest(workload, "cpu", drafter, overrides),
                   ClusterAnswers(rates=(rate,)))  # fmt: skip
    assert plan.stage_estimate is not None and plan.stage_estimate.measured
    return plan.stage_estimate

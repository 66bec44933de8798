"""The Plan: every decision for one (workload, cluster, drafter), as frozen plain values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.config.project import release_name
from kimideploy.config.specs import WorkloadSpec
from kimideploy.formats.check_result import CheckResult
from kimideploy.plan.asks import PullAsk, WorkloadAsk
from kimideploy.plan.calibration import Calibration
from kimideploy.plan.inputs import AskT
from kimideploy.plan.kinds import KINDS
from kimideploy.plan.stage_estimate import MeasuredRate, StageEstimate


@dataclass(frozen=True)
class PlanRequest:
    """What the user asked for; None means 'the config's default'."""

    workload: str
    cluster: str | None = None
    drafter: str | None = None
    overrides: tuple[str, ...] = ()
    run_id: str | None = None
    ask: WorkloadAsk | None = None
    """What the workload's own kind asks besides (plan/asks.py; plan/kinds.py names the type each
    kind takes); None: nothing beyond the config's defaults."""

    def asked(self, kind: type[AskT]) -> AskT:
        """The ask when it is a `kind`, else that kind's defaults."""
        return self.ask if isinstance(self.ask, kind) else kind()


def pull_ask(workload: str, drafters: tuple[str, ...]) -> PullAsk | None:
    """The published drafters as a pull's ask; None for the kinds that ask none of it (a loop
    over every workload renders each with what it takes)."""
    return PullAsk(drafters=drafters) if KINDS[workload].ask is PullAsk else None


@dataclass(frozen=True)
class ClusterAnswers:
    """What the cluster answered, beside what the user asked (PlanRequest): built once per
    command by services/connection.cluster_answers, read by the resolver. OFFLINE where no
    cluster is contacted (render, a client dry run, the refusals before contact)."""

    namespace: str | None = None
    """Where the session works (--namespace, else the profile's); None: the profile's."""
    monitoring_crd: bool | None = None
    """Whether the cluster serves PodMonitors; None: not known (offline)."""
    calibrations: tuple[Calibration, ...] = ()
    """The cluster's stored calibrations, oldest first (offline: the local copy, when read):
    predictions use the newest measured on this plan's serve image and configuration."""
    storage_read_gbps: float | None = None
    """The models claim's read bandwidth the storage probe measured on this cluster (GB/s);
    None where it was never measured (offline, or before the first probe)."""
    rates: tuple[MeasuredRate, ...] = ()
    """What finished runs measured on this cluster, oldest first: each run's estimate uses the
    newest of its workload (plan/estimates.py)."""


OFFLINE = ClusterAnswers()


@dataclass(frozen=True)
class EngineStart:
    """Where a run's vLLM logs its start-up."""

    container: str | None = None
    """The container of the run's pod (index 0) whose log it is; None: the pod's first."""


@dataclass(frozen=True)
class ObjectPlan:
    """One Kubernetes object: the template that lays it out and the values it places."""

    template: str
    values: dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """The resolver's output; templates, services and the CLI only read it."""

    workload: str
    project: str
    cluster: str
    drafter: str
    namespace: str
    release: str
    run_id: str | None
    config_sha256: str
    kubernetes_version: str
    image: str
    objects: tuple[ObjectPlan, ...]
    spec: WorkloadSpec
    """What the pod reads as spec.json (the ConfigMap holds its JSON): services read it here."""
    facts: tuple[tuple[str, str], ...] = ()
    fact_values: dict[str, Any] = field(default_factory=dict)
    """Facts as values (numbers, lists, objects) under the labels `facts` uses: what the plan
    document gives a script beside the prose."""
    warnings: tuple[str, ...] = ()
    drafter_findings: tuple[CheckResult, ...] = ()
    """Speculative serve plans: the registry judgement of the drafter on this cluster."""
    inputs: dict[str, Any] = field(default_factory=dict)
    gitops: tuple[ObjectPlan, ...] = ()
    """Objects only the Kustomize tree carries (the GitOps gate's templates, plan/analysis.py):
    `up` never applies them."""
    preflight: tuple[ObjectPlan, ...] = ()
    """Objects run to their end before the plan's own are applied (the weights probe): not part
    of the rendered release, so GitOps trees never carry them."""
    gpu_probe: ObjectPlan | None = None
    """Serve plans: the all-reduce probe Job `host check --allreduce` runs on one node's GPUs
    (plan.node_probe); never part of the release."""
    break_even: dict[str, Any] = field(default_factory=dict)
    """Speculative serve plans: {"source": which cost model, "measured": bool, "rate": {c: vLLM
    acceptance rate at break-even}, "length": {c: acceptance length}} at the gated levels."""
    storage_probe: ObjectPlan | None = None
    """Serve plans: the Job that measures the models claim's cold read bandwidth (`host check`,
    and `up` before the first load where the reader depends on it); never part of the release."""
    stage_estimate: StageEstimate | None = None
    """How long the run takes, on how many GPUs, from which source (plan/estimates.py); None
    for a release and for a kind no model covers."""
    price_per_gpu_hour: float | None = None
    """The cluster's price, for the estimate's money."""
    engine_start_estimate_s: float = 0.0
    """One engine start of this cluster's target, estimated (plan/estimates.engine_start_s): a
    bake-off or a calibration loads the serve engine once per candidate."""
    measure_storage_first: bool = False
    """The reader depends on a storage measurement this cluster does not have yet (a local copy
    decided by min_read_gbps): `up` runs storage_probe, records it, and plans again."""
    engine_start: EngineStart | None = None
    """Runs whose pods start a vLLM engine (extraction, the replay's capture, online training's
    target server): where its start-up log lines are, for the phase table."""

    @property
    def serve_release(self) -> str:
        """The serve release of the same project (what a bench run measures)."""
        return release_name(self.project, "serve")

    @property
    def speculative(self) -> bool:
        return KINDS[self.workload].release and self.drafter != NO_DRAFTER

"""The Plan: every decision for one (workload, cluster, drafter), as frozen plain values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.config.project import release_name
from kimideploy.config.specs import WorkloadSpec
from kimideploy.formats.check_result import CheckResult
from kimideploy.plan.calibration import Calibration
from kimideploy.plan.kinds import KINDS


@dataclass(frozen=True)
class SyntheticAcceptance:
    """`run calibrate`: serve with k drafts accepted at synthetic lengths (the first at start-up,
    the others set by the bench between passes), and bench every length."""

    num_speculative_tokens: int
    acceptance_lengths: tuple[float, ...]


@dataclass(frozen=True)
class PlanRequest:
    """What the user asked for; None means 'the config's default'."""

    workload: str
    cluster: str | None = None
    drafter: str | None = None
    overrides: tuple[str, ...] = ()
    run_id: str | None = None
    image: str | None = None
    """serve: another image of role serve than the cluster's (`run calibrate --image`)."""
    synthetic: SyntheticAcceptance | None = None
    bench_concurrency: tuple[int, ...] | None = None
    """bench: the concurrency levels to measure instead of the cluster's (the gate's levels)."""
    gate_levels: tuple[int, ...] | None = None
    """The gate's levels instead of the cluster's (`--at-concurrency`): the break-even the plan
    shows and the gate decides at."""
    gate_min_speedup: float | None = None
    """The gate's threshold instead of the cluster's (`--min-speedup`): what the plan's gate line
    and predictions are judged against, as the gate itself is."""
    publish_to: str | None = None
    """publish: the repository to push to instead of the registry's <repository>/drafters/NAME."""
    publish_dataset: str | None = None
    """publish: push the cluster's pipeline conversations as this dataset (`data publish`)."""
    replay_drafters: tuple[str, ...] = ()
    """replay: the drafters judged (`drafter doctor A B`); empty: the one named by `drafter`."""
    replay_prompts: tuple[tuple[str, tuple[dict[str, Any], ...]], ...] = ()
    """replay: (name, rows) of the user's prompt sets ({id, messages[, tools]} rows)."""
    pull_drafters: tuple[str, ...] = ()
    """pull: the published drafters fetched onto the cluster's models volume."""
    canary_percent: int | None = None
    """serve: render the drafter as a canary pool taking this share of the route's traffic
    beside the serving pool (`up serve --canary`), instead of as the release itself."""


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


OFFLINE = ClusterAnswers()


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
    warnings: tuple[str, ...] = ()
    drafter_findings: tuple[CheckResult, ...] = ()
    """Speculative serve plans: the registry judgement of the drafter on this cluster."""
    inputs: dict[str, Any] = field(default_factory=dict)
    preflight: tuple[ObjectPlan, ...] = ()
    """Objects run to their end before the plan's own are applied (the weights probe): not part
    of the rendered release, so GitOps trees never carry them."""
    gpu_probe: ObjectPlan | None = None
    """Serve plans: the all-reduce probe Job `host check --allreduce` runs on one node's GPUs
    (plan.node_probe); never part of the release."""
    break_even: dict[str, Any] = field(default_factory=dict)
    """Speculative serve plans: {"source": which cost model, "measured": bool, "rate": {c: vLLM
    acceptance rate at break-even}, "length": {c: acceptance length}} at the gated levels."""

    @property
    def serve_release(self) -> str:
        """The serve release of the same project (what a bench run measures)."""
        return release_name(self.project, "serve")

    @property
    def speculative(self) -> bool:
        return KINDS[self.workload].release and self.drafter != NO_DRAFTER

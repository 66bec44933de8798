"""The Plan: every decision for one (workload, cluster, drafter), as frozen plain values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.plan.calibration import Calibration


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
    namespace: str | None = None
    monitoring_crd: bool | None = None
    """Whether the cluster serves PodMonitors (asked by `up`); None: not known (offline)."""
    image: str | None = None
    """serve: another image of role serve than the cluster's (`run calibrate --image`)."""
    synthetic: SyntheticAcceptance | None = None
    calibrations: tuple[Calibration, ...] = ()
    """The cluster's stored calibrations, oldest first, when the caller read them: predictions
    use the newest measured on this plan's serve image and configuration."""


@dataclass(frozen=True)
class ObjectPlan:
    """One Kubernetes object: the template that lays it out and the values it places."""

    template: str
    values: dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """The resolver's output; templates, services and the CLI only read it."""

    workload: str
    cluster: str
    drafter: str
    namespace: str
    release: str
    run_id: str | None
    config_sha256: str
    kubernetes_version: str
    image: str
    objects: tuple[ObjectPlan, ...]
    facts: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    inputs: dict[str, Any] = field(default_factory=dict)
    break_even: dict[str, Any] = field(default_factory=dict)
    """Speculative serve plans: {"source": which cost model, "measured": bool, "rate": {c: vLLM
    acceptance rate at break-even}, "length": {c: acceptance length}} at the gated levels."""

    @property
    def speculative(self) -> bool:
        return self.workload == "serve" and self.drafter != NO_DRAFTER

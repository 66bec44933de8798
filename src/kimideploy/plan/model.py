"""The Plan: every decision for one (workload, cluster, drafter), as frozen plain values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kimideploy.config.drafters import NO_DRAFTER


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

    @property
    def speculative(self) -> bool:
        return self.workload == "serve" and self.drafter != NO_DRAFTER

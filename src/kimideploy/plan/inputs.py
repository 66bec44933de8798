"""The resolved inputs of one plan: cluster, drafter and image after defaults and overrides."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, TypeVar

from kimideploy.config.clusters import Cluster
from kimideploy.config.datasets import PublishedDataset
from kimideploy.config.drafters import NO_DRAFTER, Drafter, ModelFreeMethod, to_vllm_layer_ids
from kimideploy.config.images import Image
from kimideploy.config.project import Project
from kimideploy.config.specs import LayerSelection, TargetRef
from kimideploy.config.target import TargetModel
from kimideploy.errors import UsageError
from kimideploy.plan.asks import ServeAsk, WorkloadAsk
from kimideploy.plan.calibration import CostModel
from kimideploy.plan.kinds import KINDS, WorkloadKind
from kimideploy.plan.step_cost import uncalibrated

AskT = TypeVar("AskT", bound=WorkloadAsk)

CANARY_SUFFIX = "-canary"
"""The canary pool's objects are the release's names with this suffix; its pods' component."""
MODELS_MOUNT = "/models"
DATASETS_MOUNT = "/data"
HIDDEN_STATES_MOUNT = "/hidden-states"
CHECKPOINTS_MOUNT = "/checkpoints"
COMPILE_CACHE_MOUNT = "/cache"


@dataclass(frozen=True)
class PlanInputs:
    """What every part of a plan is decided from: the project, the request, and the cluster,
    drafter and image it names after defaults and overrides (the `ctx` of the plan modules)."""

    project: Project
    config_sha256: str
    workload: str
    cluster_name: str
    cluster: Cluster
    drafter_name: str
    drafter: Drafter | None
    """The EAGLE-3 drafter named (served, or the train drafter of a data workload)."""
    image_name: str
    image: Image
    run_id: str | None
    overrides: tuple[str, ...]
    namespace_override: str | None = None
    monitoring_crd: bool | None = None
    storage_read_gbps: float | None = None
    rates: tuple[Any, ...] = ()
    """The cluster's measured run rates (plan/estimates.MeasuredRate), oldest first."""
    """The storage probe's measured read bandwidth of the models claim (ClusterAnswers)."""
    ask: WorkloadAsk | None = None
    """The request's ask of the workload's kind (read through `asked`)."""
    synthetic_k: int | None = None
    synthetic_lengths: tuple[float, ...] = ()
    costs: CostModel | None = None
    costs_note: str = ""
    """Why a stored calibration was not used (empty when it was, or when there was none)."""
    model_free: ModelFreeMethod | None = None
    """The model-free method (ngram, suffix) named instead of a drafter."""

    def asked(self, kind: type[AskT]) -> AskT:
        """The request's ask when it is a `kind`, else that kind's defaults: a serve plan reads
        its canary share the same way whether or not one was asked."""
        return self.ask if isinstance(self.ask, kind) else kind()

    @property
    def kind(self) -> WorkloadKind:
        """What the workload is (plan/kinds.py): read instead of comparing its name."""
        return KINDS[self.workload]

    @property
    def speculative_tokens(self) -> int | None:
        """The k served: a calibration's, else the drafter's or method's; None without either."""
        method = self.drafter or self.model_free
        return self.synthetic_k or (method.num_speculative_tokens if method else None)

    @property
    def cost_model(self) -> CostModel:
        """A serve step's cost: on this plan's image where it is a vLLM one (a serve revision,
        the calibration of another serve image), else on the cluster's serve image (a train or
        tools image serves nothing: "(vLLM None)" was printed)."""
        serving = self.image_name if self.image.vllm else None
        return self.costs or uncalibrated(self.project, self.cluster_name, serving)

    @property
    def model(self) -> TargetModel:
        """The checkpoint this cluster serves (its model_variant, else `model:`)."""
        return self.project.model_for(self.cluster_name)

    @property
    def namespace(self) -> str:
        return self.namespace_override or self.cluster.namespace

    @property
    def release(self) -> str:
        return self.project.release_name(self.workload)

    @property
    def object_name(self) -> str:
        """Serve is one long-lived release (its canary pool a second name beside it); each job
        run is a new, immutable object."""
        if self.run_id is not None:
            return f"{self.release}-{self.run_id}"
        canary = self.asked(ServeAsk).canary_percent is not None
        return f"{self.release}{CANARY_SUFFIX}" if canary else self.release

    @property
    def component(self) -> str:
        """The component label pods are selected by: a canary's pods are not the release's
        (neither its Deployment, its Service nor `watch` may take them)."""
        canary = self.asked(ServeAsk).canary_percent is not None
        return f"{self.workload}{CANARY_SUFFIX}" if canary else self.workload

    def claim_name(self, claim: str) -> str:
        return f"{self.project.name}-{claim.replace('_', '-')}"

    def target_ref(self) -> TargetRef:
        model = self.model
        return TargetRef(
            repo=model.repo,
            revision=model.revision,
            served_name=model.served_name,
            path=target_model_path(model),
            num_hidden_layers=model.num_hidden_layers,
            hidden_size=model.hidden_size,
            vocab_size=model.vocab_size,
        )

    def layers(self) -> LayerSelection:
        assert self.drafter is not None
        ids, convention = self.drafter.aux_layer_ids, self.drafter.layer_id_convention
        return LayerSelection(
            ids=list(ids), convention=convention, vllm_ids=to_vllm_layer_ids(ids, convention)
        )


def gated_levels(ctx: PlanInputs) -> list[int]:
    """The concurrencies the gate decides at for this plan."""
    return gate_levels(ctx.cluster, ctx.asked(ServeAsk).gate_levels)


def gate_threshold(ctx: PlanInputs) -> float:
    """The speedup the gate keeps a drafter at: `--min-speedup` when given, else the cluster's
    gate.min_speedup."""
    given = ctx.asked(ServeAsk).gate_min_speedup
    return ctx.cluster.gate.min_speedup if given is None else given


def gate_levels(cluster: Cluster, given: tuple[int, ...] | list[int] | None) -> list[int]:
    """The concurrencies a gate decides at: the ones given (`--at-concurrency`), else
    gate.concurrency, else the bench's. The one rule the plan's break-even, the gate's terms and
    the bench it runs read."""
    return sorted(set(given or cluster.gate.concurrency or cluster.workloads.bench.concurrency))


def target_model_path(model: TargetModel) -> str:
    """Where `host sync-model` puts the pinned revision on the models volume."""
    return f"{MODELS_MOUNT}/hub/{model.repo}/{model.revision}"


OCI_DRAFTERS = "drafters/oci"
PUBLISHED_DATASETS = "published"
"""Where a published drafter is pulled on the models volume: one folder per artifact digest, so
a pull is idempotent and two revisions never share a folder."""


def drafter_path(name: str, drafter: Drafter) -> str:
    """Where a pod reads the drafter: a published one from its pull by digest (the same bytes
    on every cluster), else its path on the models volume, else its hub download."""
    if drafter.source.oci is not None:
        return f"{MODELS_MOUNT}/{OCI_DRAFTERS}/{drafter.source.oci.digest.removeprefix('sha256:')}"
    if drafter.source.path is not None:
        return f"{MODELS_MOUNT}/{drafter.source.path}"
    assert drafter.source.hub is not None
    return f"{MODELS_MOUNT}/drafters/{drafter.source.hub.repo}/{drafter.source.hub.revision}"


def published_dataset_path(dataset: PublishedDataset) -> str:
    """datasets/published/<digest>: one folder per pulled artifact, whichever pipeline reads it."""
    return f"{DATASETS_MOUNT}/{PUBLISHED_DATASETS}/{dataset.oci.digest.removeprefix('sha256:')}"


def trained_path(name: str, drafter: Drafter) -> str:
    """Where `run train` writes the drafter and `drafter publish` reads it."""
    if drafter.source.path is None:
        raise UsageError(
            f"drafter {name} has no source.path: it was not trained by this project",
            hint="train and publish drafters that name a path on the models volume",
        )
    return f"{MODELS_MOUNT}/{drafter.source.path}"


def deterministic_run_id(config_sha256: str, *parts: object) -> str:
    """A stable id for `render`: same inputs, same names, byte-identical output."""
    payload = json.dumps([config_sha256, *parts], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:6]


def is_speculative(ctx: PlanInputs) -> bool:
    return ctx.drafter_name != NO_DRAFTER

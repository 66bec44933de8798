"""PersistentVolumeClaims: which workloads mount which claims, and how large each is."""

from __future__ import annotations

from dataclasses import dataclass

from kimideploy.config.base import quantity_to_float
from kimideploy.config.project import Project
from kimideploy.plan import capture, online
from kimideploy.plan.inputs import PlanInputs
from kimideploy.plan.model import ObjectPlan
from kimideploy.plan.pods import LABEL_PREFIX, standard_labels
from kimideploy.plan.storage import (
    claim_size_gib,
    hidden_state_bytes,
    hidden_state_bytes_per_token,
    human_bytes,
)


def workload_claims(ctx: PlanInputs) -> dict[str, bool]:
    """The claims this plan's pods mount (its kind's); online training stores no hidden states."""
    claims = dict(ctx.kind.claims)
    if online.is_online(ctx):
        claims.pop("hidden_states")
    if capture.settings(ctx) is not None:
        claims.update(capture.SIDECAR_CLAIMS)
    return claims


@dataclass(frozen=True)
class HiddenStateEstimate:
    samples: int
    tokens_per_sample: int
    bytes_per_token: int
    total_bytes: int
    claim_size: str
    claim_bytes: int

    def describe(self) -> str:
        return (
            f"{human_bytes(self.total_bytes)} = {self.samples:,} samples x "
            f"{self.tokens_per_sample:,} tokens x {self.bytes_per_token:,} B/token; "
            f"claim {self.claim_size}"
        )


def estimate_hidden_states(project: Project, ctx: PlanInputs) -> HiddenStateEstimate:
    """Size the hidden-state claim from what extraction will write for the train drafter."""
    cluster = ctx.cluster
    drafter = project.eagle_drafter(cluster.workloads.train.drafter)
    per_token = hidden_state_bytes_per_token(
        len(drafter.aux_layer_ids), ctx.model.hidden_size, cluster.workloads.extract.dtype
    )
    datagen = cluster.workloads.datagen
    total = hidden_state_bytes(datagen.samples, datagen.expected_tokens_per_sample, per_token)
    claim = cluster.storage.hidden_states
    if claim.size == "auto":
        size_gib = claim_size_gib(total, claim.headroom)
        size, claim_bytes = f"{size_gib}Gi", size_gib * 2**30
    else:
        size, claim_bytes = claim.size, int(quantity_to_float(claim.size))
    return HiddenStateEstimate(
        datagen.samples, datagen.expected_tokens_per_sample, per_token, total, size, claim_bytes
    )


def claim_objects(ctx: PlanInputs, estimate: HiddenStateEstimate) -> list[ObjectPlan]:
    objects = []
    for claim in workload_claims(ctx):
        setting = getattr(ctx.cluster.storage, claim)
        size = estimate.claim_size if claim == "hidden_states" else setting.size
        labels = standard_labels(ctx, component="storage")
        labels.pop(f"{LABEL_PREFIX}/run-id", None)
        labels.pop(f"{LABEL_PREFIX}/config-hash", None)
        labels.pop(f"{LABEL_PREFIX}/drafter", None)
        labels["app.kubernetes.io/instance"] = f"{ctx.project.name}-storage"
        values = {
            "name": ctx.claim_name(claim),
            "namespace": ctx.namespace,
            "labels": labels,
            "annotations": {f"{LABEL_PREFIX}/keep": "true", f"{LABEL_PREFIX}/claim": claim},
            "storage_class": setting.storage_class,
            "access_mode": setting.access_mode,
            "size": size,
        }
        objects.append(ObjectPlan("persistentvolumeclaim-storage", values))
    return objects

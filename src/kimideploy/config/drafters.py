"""The drafter registry: every EAGLE-3 drafter the team has, with its layer-id convention."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from kimideploy.config.base import GitRevision, StrictModel
from kimideploy.config.registry import OciArtifact

NO_DRAFTER = "none"
"""Reserved drafter name: non-speculative serving."""

LayerConvention = Literal["vllm", "sglang"]


class HubSource(StrictModel):
    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$")
    revision: GitRevision


class DrafterSource(StrictModel):
    """Where the drafter's files come from: a pinned Hugging Face repository, a path on the
    models volume (a drafter `run train` writes), or a published OCI artifact. A published
    drafter keeps the path it was trained to: every cluster that serves it pulls it by digest
    (the digest is what is served, everywhere alike), and the path says what `drafter publish`
    read and where training must not write again."""

    hub: HubSource | None = None
    path: str | None = Field(
        default=None, pattern=r"^[\w.][\w./-]*$", description="Relative to the models volume."
    )
    oci: OciArtifact | None = Field(
        default=None, description="Set by `kimideploy drafter publish` (pinned by digest)."
    )

    @model_validator(mode="after")
    def _one_origin(self) -> DrafterSource:
        if self.hub is not None and (self.path is not None or self.oci is not None):
            raise ValueError("a hub drafter has no 'path' or 'oci': give 'hub' alone")
        if self.hub is None and self.path is None and self.oci is None:
            raise ValueError("give one of 'hub', 'path' or 'oci'")
        return self


class PublishedAcceptance(StrictModel):
    """What a drafter's publisher reported, kept as a prior until kimideploy measures it."""

    mean_acceptance_length: dict[str, Annotated[float, Field(ge=1, le=17)]] = Field(
        min_length=1, description="Benchmark name -> reported mean acceptance length."
    )
    num_speculative_tokens: Annotated[int, Field(ge=1, le=16)] = Field(
        description="The k those lengths were measured at."
    )
    source: str = Field(description="Where it was reported (model card, paper).")

    @property
    def mean_length(self) -> float:
        values = list(self.mean_acceptance_length.values())
        return sum(values) / len(values)


class HeldOutAcceptance(StrictModel):
    """What training measured on conversations it never trained on, counted as vLLM counts
    (the drafter drafting on its own drafts, greedy verification over the full vocabulary)."""

    mean_acceptance_length: dict[
        Annotated[int, Field(ge=1, le=16)], Annotated[float, Field(ge=1, le=17)]
    ] = Field(min_length=1, description="k -> mean acceptance length on held-out samples.")
    acceptance_per_position: list[Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=list,
        description="Conditional acceptance per draft position at the deepest k measured.",
    )
    samples: Annotated[int, Field(ge=1)] = Field(description="Held-out samples judged.")
    step: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="The training step of the checkpoint written as the drafter."
    )
    run: str | None = Field(default=None, description="The training run id.")


class Lineage(StrictModel):
    """Where a drafter came from; `drafter check` compares it with the target."""

    trained_for: str = Field(description="Target repo id the drafter was trained against.")
    trained_for_revision: GitRevision | None = None
    trained_for_variant: str | None = Field(
        default=None,
        description="The model_variants entry whose outputs it was trained on; unset: `model:` "
        "itself. `drafter check` warns when a cluster serves another checkpoint.",
    )
    base_drafter: str | None = None
    dataset: str | None = Field(default=None, description="Dataset path or name.")
    samples: Annotated[int, Field(ge=0)] | None = None
    training_run: str | None = None
    notes: str = ""


class Drafter(StrictModel):
    """One EAGLE-3 drafter. Layer ids are stored in the convention they were written in."""

    description: str = ""
    method: Literal["eagle3"] = "eagle3"
    source: DrafterSource
    num_speculative_tokens: Annotated[int, Field(ge=1, le=16)] = 3
    aux_layer_ids: list[Annotated[int, Field(ge=0)]] = Field(
        min_length=1,
        max_length=8,
        description="Aux hidden-state layer ids, in `layer_id_convention`.",
    )
    layer_id_convention: LayerConvention = Field(
        description="vllm: id k is the input of layer k; sglang: id k is the output of layer k."
    )
    draft_vocab_size: Annotated[int, Field(ge=256, le=1_048_576)] = 32000
    draft_tensor_parallel_size: Annotated[int, Field(ge=1, le=16)] | None = None
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = Field(
        default=None, description="sha256 of model.safetensors, checked before serving."
    )
    acceptance: list[Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=list,
        description="Measured conditional acceptance per draft position (training or bench); "
        "feeds the speedup estimate.",
    )
    held_out: HeldOutAcceptance | None = Field(
        default=None,
        description="Acceptance its training run measured on held-out conversations (from the "
        "drafter's kimideploy-lineage.json); predictions use it ahead of a published prior and "
        "after `acceptance` measured by serving.",
    )
    published: PublishedAcceptance | None = Field(
        default=None,
        description="Acceptance its publisher reported: a prior, shown next to the measured one "
        "and used for predictions only until `acceptance` or `held_out` is known.",
    )
    k_schedule: Literal["fixed", "auto"] = Field(
        default="fixed",
        description="auto: with a calibration of the serve configuration and a measured "
        "`acceptance`, serve with k chosen per batch size (vLLM >= 0.32 "
        "num_speculative_tokens_per_batch_size), up to num_speculative_tokens; fixed: one k.",
    )
    status: Literal["planned", "trained", "candidate", "promoted", "rejected"] = Field(
        default="candidate",
        description="planned (not trained yet), trained (published with its held-out figures), "
        "candidate, promoted, rejected: the team's verdict; the gate records measured ones.",
    )
    lineage: Lineage


def to_vllm_layer_ids(ids: list[int], convention: LayerConvention) -> list[int]:
    """Convert ids to vLLM's convention (id k = input of layer k): SGLang's output of k is k+1."""
    return list(ids) if convention == "vllm" else [k + 1 for k in ids]

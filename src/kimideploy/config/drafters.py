"""The drafter registry: every speculation method the team can serve, under one name each.

Most entries are EAGLE-3 drafters (weights, a layer-id convention, a lineage); `ngram` and `suffix`
entries are model-free methods vLLM runs on the target's own tokens, typed with only their keys.
Left out on purpose (vLLM 0.32's SpeculativeConfig has them): MTP, because Kimi-K2.5's checkpoints
carry no next-token-prediction layer (num_nextn_predict_layers 0); `draft_model`, `medusa`,
`mlp_speculator`, DFlash and P-EAGLE, because no drafter of those kinds exists for Kimi-K2.5 and
kimideploy trains none; `ngram_gpu`, because it is vLLM's GPU-resident variant of `ngram` with the
same keys (an `extra_args` change, not a method of its own).
"""

from typing import Annotated, Any, Literal, Self

from pydantic import Discriminator, Field, Tag, model_validator

from kimideploy.config.base import GitRevision, StrictModel
from kimideploy.config.registry import OciArtifact

NO_DRAFTER = "none"
"""Reserved drafter name: non-speculative serving."""

LayerConvention = Literal["vllm", "sglang"]


class HubSource(StrictModel):
    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$")
    """Hub repository id, e.g. lightseekorg/kimi-k2.5-eagle3."""
    revision: GitRevision
    """The pinned 40-hex commit."""


class DrafterSource(StrictModel):
    """Where the drafter's files come from: a pinned Hugging Face repository, a path on the
    models volume (a drafter `run train` writes), or a published OCI artifact. A published
    drafter keeps the path it was trained to: every cluster that serves it pulls it by digest
    (the digest is what is served, everywhere alike), and the path says what `drafter publish`
    read and where training must not write again."""

    hub: HubSource | None = None
    """A drafter on the Hugging Face hub, pinned by revision (`host sync-model` downloads it)."""
    path: str | None = Field(
        default=None, pattern=r"^[\w.][\w./-]*$", description="Relative to the models volume."
    )
    oci: OciArtifact | None = Field(
        default=None, description="Set by `kimideploy drafter publish` (pinned by digest)."
    )

    @model_validator(mode="after")
    def _one_origin(self) -> Self:
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
    ci95: dict[
        Annotated[int, Field(ge=1, le=16)],
        Annotated[list[Annotated[float, Field(ge=1, le=17)]], Field(min_length=2, max_length=2)],
    ] = Field(
        default_factory=dict,
        description="k -> [low, high]: a 95% interval of the mean acceptance length from a "
        "bootstrap over the judged turns; how far serving conversations of the same "
        "distribution may count from the figure. `up` refuses when even `high` is below "
        "break-even and warns when the interval straddles it.",
    )
    turns: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Assistant turns the figures were judged on."
    )
    stands_for: str | None = Field(
        default=None,
        description="The prompt distribution the figures stand for: held-out conversations of "
        "the training data. On other prompts, `drafter check --replay FILE` predicts instead.",
    )

    @model_validator(mode="after")
    def _intervals_hold_their_figure(self) -> Self:
        for k, (low, high) in self.ci95.items():
            length = self.mean_acceptance_length.get(k)
            if low > high or (length is not None and not low - 1e-6 <= length <= high + 1e-6):
                raise ValueError(f"ci95[{k}] = [{low}, {high}] does not hold its figure {length}")
        return self


def held_out_from_lineage(lineage: dict[str, Any]) -> HeldOutAcceptance | None:
    """The registry form of what a training run wrote into kimideploy-lineage.json; None when it
    holds no held-out judgement. A judgement of the wrong shape (a list where a mapping belongs,
    a k that is no number, figures out of range) is a ValueError naming it, never a crash after
    the work it was read for: the publish pod reads it before it pushes."""
    judged = lineage.get("held_out")
    if judged is None or judged == {}:
        return None
    try:
        return _held_out(lineage, judged)
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        problem = str(exc).splitlines()[0][:200]
        raise ValueError(f"held_out in the lineage has the wrong shape ({problem})") from None


def _held_out(lineage: dict[str, Any], judged: Any) -> HeldOutAcceptance | None:
    if not isinstance(judged, dict):
        raise TypeError(f"a {type(judged).__name__}, not a mapping")
    if not judged.get("mean_acceptance_length"):
        return None
    by_k = judged.get("by_k") or {}
    if not isinstance(by_k, dict):
        raise TypeError("by_k is not a mapping")
    deepest = by_k.get(str(judged.get("depth"))) or {}
    selected = lineage.get("selected_checkpoint") or {}
    if not isinstance(deepest, dict) or not isinstance(selected, dict):
        raise TypeError("by_k entries and selected_checkpoint must be mappings")
    intervals = {
        int(k): list(one["ci95"])
        for k, one in by_k.items()
        if isinstance(one, dict) and one.get("ci95")
    }
    dataset = lineage.get("dataset") or {}
    fingerprint = dataset.get("fingerprint") if isinstance(dataset, dict) else None
    return HeldOutAcceptance(
        mean_acceptance_length={int(k): v for k, v in judged["mean_acceptance_length"].items()},
        acceptance_per_position=deepest.get("acceptance_per_position") or [],
        samples=max(int(judged.get("samples") or 1), 1),
        step=selected.get("step"),
        run=lineage.get("run_id"),
        ci95=intervals,
        turns=judged.get("turns") or None,
        stands_for="held-out conversations of the training data"
        + (f" (dataset {fingerprint})" if fingerprint else ""),
    )


class Lineage(StrictModel):
    """Where a drafter came from; `drafter check` compares it with the target."""

    trained_for: str = Field(description="Target repo id the drafter was trained against.")
    trained_for_revision: GitRevision | None = None
    """Target revision (40-hex) the drafter was trained against."""
    trained_for_variant: str | None = Field(
        default=None,
        description="The model_variants entry whose outputs it was trained on; unset: `model:` "
        "itself. `drafter check` warns when a cluster serves another checkpoint.",
    )
    base_drafter: str | None = None
    """The drafter it was fine-tuned from, if any."""
    dataset: str | None = Field(default=None, description="Dataset path or name.")
    samples: Annotated[int, Field(ge=0)] | None = None
    """Training samples it saw."""
    training_run: str | None = None
    """The training run id (`run train`)."""
    notes: str = ""
    """Free text for people."""


Status = Literal["planned", "trained", "candidate", "promoted", "rejected"]
MeasuredAcceptance = list[Annotated[float, Field(ge=0, le=1)]]


class Drafter(StrictModel):
    """One EAGLE-3 drafter. Layer ids are stored in the convention they were written in."""

    description: str = ""
    """Free text for people; shown by `drafter list`."""
    method: Literal["eagle3"] = "eagle3"
    """The speculation method; eagle3 for a trained EAGLE-3 drafter."""
    decoder: Literal["llama", "mla"] = Field(
        default="llama",
        description="The drafter's decoder layer: llama (LlamaForCausalLMEagle3, speculators and "
        "SpecForge write it) or mla (Eagle3DeepseekV2ForCausalLM, DeepSeek-style multi-head latent "
        "attention, as in vLLM's Kimi-K2.5 recipe; vLLM >= 0.32).",
    )
    source: DrafterSource
    num_speculative_tokens: Annotated[int, Field(ge=1, le=16)] = 3
    """k: tokens drafted per step (1-16); the serve flag and the default training depth."""
    aux_layer_ids: list[Annotated[int, Field(ge=0)]] = Field(
        min_length=1,
        max_length=8,
        description="Aux hidden-state layer ids, in `layer_id_convention`.",
    )
    layer_id_convention: LayerConvention = Field(
        description="vllm: id k is the input of layer k; sglang: id k is the output of layer k."
    )
    draft_vocab_size: Annotated[int, Field(ge=256, le=1_048_576)] = 32000
    """The drafter's vocabulary (d2t/t2d map sizes); checked against its config.json."""
    draft_tensor_parallel_size: Annotated[int, Field(ge=1, le=16)] | None = None
    """vLLM's draft_tensor_parallel_size; unset: vLLM's default (the target's)."""
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = Field(
        default=None, description="sha256 of model.safetensors, checked before serving."
    )
    acceptance: MeasuredAcceptance = Field(
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
    status: Status = Field(
        default="candidate",
        description="planned (not trained yet), trained (published with its held-out figures), "
        "candidate, promoted, rejected: the team's verdict; the gate records measured ones.",
    )
    lineage: Lineage


class NgramMethod(StrictModel):
    """Prompt lookup: vLLM drafts the tokens that followed the last n tokens' earlier occurrence
    in the same request. No weights, no training; pays where outputs repeat their input (code
    edits, extraction, quoting), costs a little where they do not."""

    description: str = ""
    """Free text for people; shown by `drafter list`."""
    method: Literal["ngram"]
    """Prompt lookup (n-gram) speculation."""
    num_speculative_tokens: Annotated[int, Field(ge=1, le=16)] = 3
    """k: tokens drafted per step."""
    prompt_lookup_min: Annotated[int, Field(ge=1, le=64)] = Field(
        default=2, description="Shortest n-gram matched."
    )
    prompt_lookup_max: Annotated[int, Field(ge=1, le=64)] = Field(
        default=5, description="Longest n-gram matched (tried first)."
    )
    acceptance: MeasuredAcceptance = Field(
        default_factory=list, description="Measured conditional acceptance per draft position."
    )
    status: Status = "candidate"
    """Registry status; a model-free method needs no training."""

    @model_validator(mode="after")
    def _window(self) -> Self:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) must not exceed prompt_lookup_max "
                f"({self.prompt_lookup_max})"
            )
        return self


class SuffixMethod(StrictModel):
    """Suffix decoding (Arctic Inference): drafts from suffix trees over this request's prompt
    and earlier responses, so it learns repeated agentic and templated traffic while serving. No
    weights, no training; the serve image needs the `arctic-inference` package."""

    description: str = ""
    """Free text for people; shown by `drafter list`."""
    method: Literal["suffix"]
    """Suffix decoding (Arctic Inference)."""
    num_speculative_tokens: Annotated[int, Field(ge=1, le=64)] = Field(
        default=24,
        description="The most tokens one draft may hold; each draft's length varies with how "
        "far its match goes (vLLM defaults it to the tree depth).",
    )
    max_tree_depth: Annotated[int, Field(ge=1, le=256)] = Field(
        default=24, description="suffix_decoding_max_tree_depth: the longest suffix indexed."
    )
    max_cached_requests: Annotated[int, Field(ge=0)] = Field(
        default=10000,
        description="suffix_decoding_max_cached_requests: responses kept in the global tree "
        "(0: only the request's own prompt is used).",
    )
    max_spec_factor: Annotated[float, Field(ge=0)] = Field(
        default=1.0,
        description="suffix_decoding_max_spec_factor: a draft is at most this times the matched "
        "length.",
    )
    min_token_prob: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.1,
        description="suffix_decoding_min_token_prob: tokens estimated less likely are not drafted.",
    )
    acceptance: MeasuredAcceptance = Field(
        default_factory=list, description="Measured conditional acceptance per draft position."
    )
    status: Status = "candidate"
    """Registry status; a model-free method needs no training."""


ModelFreeMethod = NgramMethod | SuffixMethod
"""A method that drafts from the tokens alone: nothing to download, check, train or publish."""


def _method_of(value: Any) -> str:
    # EAGLE-3 entries written before methods existed carry no `method`: they stay EAGLE-3.
    if isinstance(value, dict):
        return str(value.get("method", "eagle3"))
    return str(getattr(value, "method", "eagle3"))


SpeculationMethod = Annotated[
    Annotated[Drafter, Tag("eagle3")]
    | Annotated[NgramMethod, Tag("ngram")]
    | Annotated[SuffixMethod, Tag("suffix")],
    Discriminator(_method_of),
]
"""One entry of `drafters:`, typed by its `method`."""


def to_vllm_layer_ids(ids: list[int], convention: LayerConvention) -> list[int]:
    """Convert ids to vLLM's convention (id k = input of layer k): SGLang's output of k is k+1."""
    return list(ids) if convention == "vllm" else [k + 1 for k in ids]

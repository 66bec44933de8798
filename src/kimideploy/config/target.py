"""The target model being served and accelerated (Kimi-K2.5 by default)."""

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from kimideploy.config.base import DnsSubdomain, GitRevision, SecretKey, StrictModel


class SecretRef(StrictModel):
    """A reference to a key of a Kubernetes Secret; secrets are never inlined."""

    name: DnsSubdomain = Field(description="Secret name in the cluster profile's namespace.")
    key: SecretKey = Field(description="Key inside the Secret.")


Quantization = Literal["int4", "fp8", "nvfp4", "mxfp4", "bf16"]


class AttentionShape(StrictModel):
    """The target's attention as config.json has it: what its KV cache costs per token."""

    kind: Literal["mla", "mha"] = Field(
        description="mla: DeepSeek's latent attention (one latent vector per token and layer, "
        "the same on every tensor-parallel rank); mha: keys and values per KV head."
    )
    num_heads: Annotated[int, Field(ge=1, le=1024)]
    """num_attention_heads."""
    kv_lora_rank: Annotated[int, Field(ge=1, le=8192)] | None = None
    """MLA: the latent's width (512 for DeepSeek-V3 and Kimi-K2)."""
    qk_rope_head_dim: Annotated[int, Field(ge=1, le=1024)] | None = None
    """MLA: the rotary part of each key, stored beside the latent (64)."""
    q_lora_rank: Annotated[int, Field(ge=1, le=65536)] | None = None
    """MLA: the query's latent width (1536 for Kimi-K2); its down-projection and the KV one are
    replicated on every tensor-parallel rank (the memory plan counts them per GPU)."""
    qk_nope_head_dim: Annotated[int, Field(ge=1, le=1024)] | None = None
    """MLA: each head's key part without rotation (128): sizes the prefill's up-projected
    context in the MLA workspace."""
    v_head_dim: Annotated[int, Field(ge=1, le=1024)] | None = None
    """MLA: each head's value width (128)."""
    num_kv_heads: Annotated[int, Field(ge=1, le=1024)] | None = None
    """mha: num_key_value_heads."""
    head_dim: Annotated[int, Field(ge=1, le=1024)] | None = None
    """mha: each head's width."""

    @model_validator(mode="after")
    def _complete(self) -> Self:
        needed = ("kv_lora_rank", "qk_rope_head_dim") if self.kind == "mla" else (
            "num_kv_heads", "head_dim")  # fmt: skip
        missing = [name for name in needed if getattr(self, name) is None]
        if missing:
            raise ValueError(f"kind {self.kind} needs {' and '.join(missing)}")
        return self

    def kv_values_per_token_layer(self, tensor_parallel: int) -> int:
        """Values one GPU stores per token and layer: MLA's latent and rotary key, on every
        rank; for mha, keys and values of the KV heads this rank holds."""
        if self.kind == "mla":
            assert self.kv_lora_rank is not None and self.qk_rope_head_dim is not None
            return self.kv_lora_rank + self.qk_rope_head_dim
        assert self.num_kv_heads is not None and self.head_dim is not None
        heads = max(1, self.num_kv_heads // tensor_parallel)
        return 2 * heads * self.head_dim


class MoeShape(StrictModel):
    """The target's mixture of experts: how many parameters a token reads."""

    active_params_b: Annotated[float, Field(gt=0, le=10_000)]
    """Parameters a token passes through, in billions (Kimi-K2: 32)."""
    total_params_b: Annotated[float, Field(gt=0, le=100_000)]
    """All parameters, in billions (Kimi-K2: 1,040)."""
    routed_experts: Annotated[int, Field(ge=1, le=65536)]
    """Routed experts per MoE layer (config.json n_routed_experts; Kimi-K2: 384)."""
    experts_per_token: Annotated[int, Field(ge=1, le=1024)]
    """Routed experts each token reads per layer (num_experts_per_tok; Kimi-K2: 8)."""
    expert_params_m: Annotated[float, Field(gt=0)]
    """One routed expert of one layer, in millions (3 x hidden x its intermediate size)."""
    moe_layers: Annotated[int, Field(ge=1, le=1024)]
    """Layers with routed experts (Kimi-K2: 60; its first layer is dense)."""
    weight_group_size: Annotated[int, Field(ge=1, le=4096)] = 32
    """Weights sharing one scale in an INT4 (W4A16) checkpoint (Kimi-K2.5's: 32): which experts
    kernel vLLM can run them on."""


class TargetModel(StrictModel):
    """The model kimideploy serves, generates data with, and trains drafters for."""

    repo: str = Field(
        pattern=r"^[\w.-]+/[\w.-]+$", description="Hugging Face repository id, e.g. org/name."
    )
    revision: GitRevision = Field(description="Pinned commit of the repository (40 hex).")
    quantization: Quantization = Field(description="Weight format of the revision.")
    served_name: str = Field(description="Name the OpenAI-compatible API serves it under.")
    architecture: str = Field(description="config.json architectures[0] of the checkpoint.")
    model_type: str = Field(description="config.json model_type (kimi_k25 for the wrapper).")
    text_model_type: str = Field(description="model_type of the text config (kimi_k2).")
    num_hidden_layers: Annotated[int, Field(ge=2, le=512)]
    """The target's decoder layers (config.json); bounds the aux layer ids."""
    hidden_size: Annotated[int, Field(ge=64, le=65536)]
    """The target's hidden size (config.json); sizes hidden states and checks drafters."""
    vocab_size: Annotated[int, Field(ge=256, le=1_048_576)]
    """The target's vocabulary (config.json); the vocab map's full side."""
    weights_gb: Annotated[float, Field(gt=0, description="On-disk size of the weights in GB.")]
    max_model_len: Annotated[int, Field(ge=512, le=1_048_576)]
    """vLLM's --max-model-len for the serve release."""
    attention: AttentionShape | None = Field(
        default=None,
        description="The attention's shape (config.json): sizes the KV cache in every engine's "
        "memory plan. Unset: no memory plan.",
    )
    moe: MoeShape | None = Field(
        default=None,
        description="The experts' shape: the step-cost model's weight traffic per batch. Unset: "
        "the model is costed as dense with weights_gb read every step.",
    )
    reasoning_parser: str | None = Field(default=None, description="vLLM --reasoning-parser.")
    tool_call_parser: str | None = Field(default=None, description="vLLM --tool-call-parser.")
    trust_remote_code: bool = True
    """Pass --trust-remote-code to vLLM (Kimi-K2.5's config needs it)."""
    hf_token: SecretRef | None = Field(
        default=None,
        description="Secret holding a Hugging Face token, for a workload that downloads from the "
        "hub. None does today (`host sync-model` fetches with $HF_TOKEN from your shell), so no "
        "pod is given it.",
    )

    @property
    def short_revision(self) -> str:
        return self.revision[:12]

    @property
    def multimodal(self) -> bool:
        """A vision-language wrapper (Kimi-K2.5's KimiK25ForConditionalGeneration) rather than a
        text-only causal LM: its vision tower takes vLLM's encoder flags."""
        return self.architecture.endswith("ForConditionalGeneration")


class ModelVariant(StrictModel):
    """Another checkpoint of the same model (e.g. NVIDIA's NVFP4 quantization for Blackwell, as
    the published B200/B300 recipes serve): same architecture, layers and tokenizer; a cluster
    names it with `model_variant`, and every workload there uses it instead of `model:`."""

    description: str = ""
    """Free text for people."""
    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$", description="Hugging Face repository id.")
    revision: GitRevision = Field(description="Pinned commit of the repository (40 hex).")
    quantization: Quantization
    """The variant's quantization (e.g. nvfp4); replaces model.quantization."""
    weights_gb: Annotated[float, Field(gt=0, description="On-disk size of the weights in GB.")]

    def applied_to(self, model: TargetModel) -> TargetModel:
        changes = {
            "repo": self.repo,
            "revision": self.revision,
            "quantization": self.quantization,
            "weights_gb": self.weights_gb,
        }
        return model.model_copy(update=changes)

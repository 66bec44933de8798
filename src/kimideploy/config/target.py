"""The target model being served and accelerated (Kimi-K2.5 by default)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kimideploy.config.base import DnsSubdomain, GitRevision, SecretKey, StrictModel


class SecretRef(StrictModel):
    """A reference to a key of a Kubernetes Secret; secrets are never inlined."""

    name: DnsSubdomain = Field(description="Secret name in the cluster profile's namespace.")
    key: SecretKey = Field(description="Key inside the Secret.")


Quantization = Literal["int4", "fp8", "nvfp4", "mxfp4", "bf16"]


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

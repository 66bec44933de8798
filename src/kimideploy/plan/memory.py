"""Will it fit? The memory plan of every vLLM engine kimideploy starts, per GPU, before the load.

vLLM finds out whether one request of `max_model_len` fits only after the weights are loaded (25
minutes for Kimi-K2.5). The same arithmetic from the config, per GPU of the engine:

    usable      = GPU memory x gpu_memory_utilization
    weights     = the checkpoint's bytes / tensor-parallel ranks
    drafter     = an EAGLE-3 head's weights (own embedding, fc, one decoder layer, lm_head over the
                  draft vocabulary), sharded like the target
    replicated  = what every rank holds whole, not a 1/tp share: MLA's query and KV down-projections
                  (hidden x (q_lora_rank + kv_lora_rank + qk_rope_head_dim) per layer) and the
                  routers (experts x hidden per MoE layer), bf16
    activations = a prior: 1.5 GiB (CUDA graphs, NCCL) + max_num_batched_tokens x hidden
                  x 2 bytes x 16 (the peak of one step's buffers, MoE's included)
    workspace   = MLA's chunked-prefill workspace (min(max(8 x max_model_len, 4 x max_num_seqs x
                  16), 64K) tokens of latent, and its up-projected keys and values for this
                  rank's heads) and the sampler's logits and probabilities over the full
                  vocabulary, fp32, for max_num_seqs x (1 + k) rows
    hidden cache= extraction: the captured layers' states of one step's tokens
    KV cache    = what is left; per token, for MLA, (kv_lora_rank + qk_rope_head_dim) x layers x
                  the KV dtype's bytes on every rank (the latent is not split by tensor
                  parallelism); for regular attention, 2 x the rank's KV heads x head_dim x layers
                  x bytes

which gives the tokens the KV cache holds and how many requests of `max_model_len` run at once. The
per-token figure is vLLM's own page size per token (tested against the pinned vLLM's KV-cache
spec); the activation prior is a planning figure, conservative by design, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from kimideploy.config.drafters import Drafter
from kimideploy.config.target import TargetModel
from kimideploy.errors import UsageError
from kimideploy.plan import online
from kimideploy.plan.inputs import PlanInputs

GIB = 2**30
ACTIVATION_BASE_BYTES = int(1.5 * GIB)
ACTIVATION_FACTOR = 16
"""Bytes of step buffers per batched token and hidden unit, over bf16's 2: a planning prior."""
DEFAULT_BATCHED_TOKENS = 8192
"""vLLM's default --max-num-batched-tokens for a serving engine on a GPU with chunked prefill."""
KV_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "fp8": 1, "float32": 4}
"""Bytes per KV value; `auto` is the model's bf16. float32 is what vLLM's CPU build serves (the
pipeline tier compares the plan with its reported capacity)."""


@dataclass(frozen=True)
class EngineShape:
    """What one engine is asked to hold."""

    engine: str
    """What it is, as the plan names it (serve, extraction, replay capture, online sidecar)."""
    setting: str
    """Where its sizes are set (clusters.<c>.workloads.<w>), for the refusal's fix."""
    tensor_parallel: int
    gpu_memory_gb: float
    utilization: float
    max_model_len: int
    max_num_batched_tokens: int
    kv_cache_dtype: str
    drafter: Drafter | None = None
    max_num_seqs: int = 256
    speculative_tokens: int = 0
    captured_layers: int = 0
    """Extraction and replay capture: the layers whose hidden states one step keeps."""
    strict: bool = True
    """Refuse when one max_model_len request does not fit (serve, the online sidecar); the
    extraction sizes its engine for its longest sample at run time, so it is shown only."""


@dataclass(frozen=True)
class MemoryPlan:
    engine: str
    tensor_parallel: int
    usable_gib: float
    weights_gib: float
    drafter_gib: float
    activations_gib: float
    hidden_cache_gib: float
    kv_cache_gib: float
    kv_bytes_per_token: int
    kv_tokens: int
    max_model_len: int
    drafter_kv_bytes_per_token: int = 0
    """The drafter's layer's share of kv_bytes_per_token."""
    replicated_gib: float = 0.0
    """Beyond the 1/tp share of the checkpoint: what each rank holds whole."""
    workspace_gib: float = 0.0
    """MLA's prefill workspace and the sampler's full-vocabulary rows."""

    @property
    def concurrent_max_length(self) -> float:
        return self.kv_tokens / self.max_model_len

    def staying_ready(self) -> str:
        """What a server that keeps its drafter loaded with speculation switched off holds for
        it, per GPU, that a server started without a drafter gives to the target's KV cache."""
        kv = self.kv_tokens * self.drafter_kv_bytes_per_token / GIB
        plain_tokens = int(
            (self.kv_cache_gib + self.drafter_gib)
            * GIB
            // max(1, self.kv_bytes_per_token - self.drafter_kv_bytes_per_token)
        )
        return (
            f"{self.drafter_gib + kv:.1f} GiB per GPU stays with the drafter while speculation is "
            f"off (weights {self.drafter_gib:.1f} + its KV {kv:.1f}): a server started without it "
            f"would hold {plain_tokens:,} tokens instead of {self.kv_tokens:,}"
        )

    def describe(self) -> str:
        parts = [f"weights {self.weights_gib:.1f}"]
        if self.replicated_gib:
            parts.append(f"replicated {self.replicated_gib:.1f}")
        if self.drafter_gib:
            parts.append(f"drafter {self.drafter_gib:.1f}")
        parts.append(f"activations {self.activations_gib:.1f}")
        if self.workspace_gib:
            parts.append(f"workspace {self.workspace_gib:.1f}")
        if self.hidden_cache_gib:
            parts.append(f"hidden states {self.hidden_cache_gib:.1f}")
        parts.append(f"KV cache {self.kv_cache_gib:.1f}")
        return (
            f"{self.engine}, per GPU of {self.tensor_parallel}: {' + '.join(parts)} of "
            f"{self.usable_gib:.1f} GiB usable; KV {self.kv_bytes_per_token:,} B/token holds "
            f"{self.kv_tokens:,} tokens = {self.concurrent_max_length:.1f} requests of "
            f"{self.max_model_len:,}"
        )


def kv_bytes_per_token(model: TargetModel, tensor_parallel: int, kv_cache_dtype: str) -> int:
    """One token's KV cache on one GPU, every layer (vLLM's page size per token)."""
    assert model.attention is not None
    values = model.attention.kv_values_per_token_layer(tensor_parallel)
    return values * model.num_hidden_layers * KV_BYTES[kv_cache_dtype]


EAGLE3_GQA = 8
"""Query heads per KV head of an EAGLE-3 head with a Llama decoder layer (the published Kimi
drafters': num_key_value_heads = num_attention_heads / 8): a planning prior for its KV."""


def drafter_kv_bytes_per_token(
    model: TargetModel, drafter: Drafter, tensor_parallel: int, kv_cache_dtype: str
) -> int:
    """One token's KV of the drafter's one decoder layer on one GPU: vLLM keeps it in the same
    pages as the target's layers. An MLA decoder stores the target's latent (1,152 B in bf16
    for Kimi: 1.6% of the target's 70,272); a Llama one keys and values of its KV heads."""
    assert model.attention is not None
    attention = model.attention
    if drafter.decoder == "mla" and attention.kind == "mla":
        return attention.kv_values_per_token_layer(tensor_parallel) * KV_BYTES[kv_cache_dtype]
    heads = max(1, (attention.num_heads // EAGLE3_GQA) // tensor_parallel)
    head_dim = model.hidden_size // attention.num_heads
    return 2 * heads * head_dim * KV_BYTES[kv_cache_dtype]


def replicated_bytes(model: TargetModel) -> float:
    """What each tensor-parallel rank holds whole (vLLM builds them as ReplicatedLinear, or
    replicates them): MLA's down-projections and the MoE routers, in bf16. About 2 GiB for
    Kimi-K2.5 (61 x 7168 x 2112 + 60 x 384 x 7168 values)."""
    attention, found = model.attention, 0.0
    if attention is not None and attention.kind == "mla":
        latent = (
            (attention.q_lora_rank or 0)
            + (attention.kv_lora_rank or 0)
            + (attention.qk_rope_head_dim or 0)
        )
        found += model.num_hidden_layers * model.hidden_size * latent * 2
    if model.moe is not None:
        found += model.moe.moe_layers * model.moe.routed_experts * model.hidden_size * 2
    return found


MLA_WORKSPACE_TOKENS = 64 * 1024
MLA_BLOCK_SIZE = 16


def workspace_bytes(model: TargetModel, shape: EngineShape) -> float:
    """MLA's chunked-prefill workspace and up-projected context (vLLM 0.32, mla_attention.py
    determine_chunked_prefill_workspace_size) and the sampler's rows over the full vocabulary."""
    attention, tp, found = model.attention, shape.tensor_parallel, 0.0
    if attention is not None and attention.kind == "mla":
        tokens = min(
            max(8 * shape.max_model_len, 4 * shape.max_num_seqs * MLA_BLOCK_SIZE),
            MLA_WORKSPACE_TOKENS,
        )
        latent = (attention.kv_lora_rank or 0) + (attention.qk_rope_head_dim or 0)
        heads = max(1, attention.num_heads // tp)
        head = (attention.qk_nope_head_dim or 0) + (attention.v_head_dim or 0)
        found += tokens * latent * 2 + tokens * heads * head * 2
    rows = shape.max_num_seqs * (1 + shape.speculative_tokens)
    return found + rows * model.vocab_size * 4 * 2


def drafter_bytes(model: TargetModel, drafter: Drafter, tensor_parallel: int) -> float:
    """An EAGLE-3 head's bf16 weights on one GPU: its embedding over the full vocabulary, the fc
    over three captured layers, one decoder layer (~12 h^2), the lm_head over the draft
    vocabulary; sharded over the drafter's tensor-parallel ranks (vLLM: the target's)."""
    hidden = model.hidden_size
    params = (
        model.vocab_size * hidden + 3 * hidden * hidden + 12 * hidden * hidden
        + drafter.draft_vocab_size * hidden
    )  # fmt: skip
    ranks = drafter.draft_tensor_parallel_size or tensor_parallel
    return params * 2 / ranks


def plan(model: TargetModel, shape: EngineShape) -> MemoryPlan | None:
    """The memory plan of one engine, or None without model.attention to size its KV cache."""
    if model.attention is None:
        return None
    tp = shape.tensor_parallel
    usable = shape.gpu_memory_gb * 1e9 * shape.utilization
    whole = replicated_bytes(model)
    weights = (model.weights_gb * 1e9 - whole) / tp
    replicated = whole
    drafter = drafter_bytes(model, shape.drafter, tp) if shape.drafter else 0.0
    activations = (
        ACTIVATION_BASE_BYTES
        + shape.max_num_batched_tokens * model.hidden_size * 2 * ACTIVATION_FACTOR / tp
    )
    hidden_cache = shape.captured_layers * model.hidden_size * 2 * shape.max_num_batched_tokens
    per_token = kv_bytes_per_token(model, tp, shape.kv_cache_dtype)
    drafter_kv = (
        drafter_kv_bytes_per_token(model, shape.drafter, tp, shape.kv_cache_dtype)
        if shape.drafter
        else 0
    )
    per_token += drafter_kv
    workspace = workspace_bytes(model, shape)
    kv = usable - weights - replicated - drafter - activations - workspace - hidden_cache
    tokens = max(0, int(kv // per_token))
    return MemoryPlan(
        engine=shape.engine,
        tensor_parallel=tp,
        usable_gib=usable / GIB,
        weights_gib=weights / GIB,
        drafter_gib=drafter / GIB,
        activations_gib=activations / GIB,
        hidden_cache_gib=hidden_cache / GIB,
        kv_cache_gib=max(kv, 0.0) / GIB,
        kv_bytes_per_token=per_token,
        kv_tokens=tokens,
        max_model_len=shape.max_model_len,
        drafter_kv_bytes_per_token=drafter_kv,
        replicated_gib=replicated / GIB,
        workspace_gib=workspace / GIB,
    )


def require_fit(found: MemoryPlan, shape: EngineShape) -> None:
    """Refuse an engine that cannot hold one request of its max_model_len, with the numbers."""
    if not shape.strict or found.kv_tokens >= found.max_model_len:
        return
    short = found.kv_tokens
    fixes = [f"a max_model_len of at most {short:,} (model.max_model_len)"] if short >= 512 else []
    if shape.kv_cache_dtype == "auto":
        fixes.append(f"an fp8 KV cache ({shape.setting}.kv_cache_dtype: fp8, half the bytes)")
    fixes.append(f"a higher gpu_memory_utilization ({shape.setting}; now {shape.utilization})")
    raise UsageError(
        f"nothing was created: the {found.engine} engine cannot hold one request of "
        f"{found.max_model_len:,} tokens on {found.tensor_parallel} x {shape.gpu_memory_gb:g} GB: "
        f"{found.describe()}",
        hint="use " + ", or ".join(fixes),
    )


def engine_shapes(ctx: PlanInputs) -> list[EngineShape]:
    """The vLLM engines a plan starts, each with the sizes it is given."""
    cluster, model = ctx.cluster, ctx.model
    gpu_gb = cluster.gpu.memory_gb
    where = f"clusters.{ctx.cluster_name}.workloads"
    workloads = cluster.workloads
    found: list[EngineShape] = []
    if ctx.kind.release:
        serve = workloads.serve
        drafter = ctx.drafter if isinstance(ctx.drafter, Drafter) else None
        found.append(EngineShape(
            engine="serve", setting=f"{where}.serve", tensor_parallel=cluster.gpu.per_node,
            gpu_memory_gb=gpu_gb, utilization=serve.gpu_memory_utilization,
            max_model_len=model.max_model_len,
            max_num_batched_tokens=serve.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS,
            kv_cache_dtype=serve.kv_cache_dtype, drafter=drafter,
            max_num_seqs=serve.max_num_seqs, speculative_tokens=ctx.speculative_tokens or 0,
        ))  # fmt: skip
    elif ctx.kind.engine is not None:  # the extraction engine, or the replay's capture in its shape
        extract = workloads.extract
        found.append(EngineShape(
            engine=ctx.kind.engine,
            setting=f"{where}.extract", tensor_parallel=extract.gpus_per_shard,
            gpu_memory_gb=gpu_gb, utilization=extract.gpu_memory_utilization,
            max_model_len=model.max_model_len,
            max_num_batched_tokens=extract.max_num_batched_tokens, kv_cache_dtype="auto",
            captured_layers=len(ctx.layers().vllm_ids) if ctx.drafter else 0, strict=False,
        ))  # fmt: skip
    elif online.is_online(ctx):
        settings = workloads.train.online
        split = online.layout(ctx)
        found.append(EngineShape(
            engine="online target server", setting=f"{where}.train.online",
            tensor_parallel=split.server_gpus, gpu_memory_gb=gpu_gb,
            utilization=settings.gpu_memory_utilization,
            max_model_len=workloads.train.max_seq_len + 2,
            max_num_batched_tokens=DEFAULT_BATCHED_TOKENS, kv_cache_dtype="auto",
            captured_layers=len(ctx.layers().vllm_ids),
        ))  # fmt: skip
    return found


def memory_plans(ctx: PlanInputs) -> list[MemoryPlan]:
    """Every engine's plan; an engine that cannot hold one request of its length is refused."""
    plans = []
    for shape in engine_shapes(ctx):
        found = plan(ctx.model, shape)
        if found is not None:
            require_fit(found, shape)
            plans.append(found)
    return plans

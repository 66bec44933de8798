"""The step cost C(k, c) before anything is measured: a model of one engine step's time as a
function of the batch, the GPU, the target's experts and the kernel plan.

speedup = L / C(k, c), with C(k, c) = [T(c (k+1)) + k D] / T(c): a speculative step verifies k+1
tokens of each of c requests and runs k draft passes, against a plain step of c tokens. One step
of B tokens on the serve engine (tensor parallel over the node's GPUs) takes

    T(B) = fixed + max(memory(B), B / peak) + 0.2 min(memory(B), B / peak)
           + communication(B) + attention(c, B)

- fixed: what every step costs whatever its size (kernel launches, sampling, scheduling, the
  latency of the two all-reduces per layer), per GPU model.
- memory(B): the weights a step reads, per GPU, at the GPU's achieved bandwidth: the dense part
  (attention, shared expert, embeddings: bf16) and the routed experts the batch touches. With E
  experts and e per token, B tokens touch E (1 - (1 - e/E)^B) of them per layer: one token reads 8
  of Kimi's 384, four read ~31, 128 read nearly all. This is why a (k+1)-token verification costs
  more than one token on a mixture of experts even when a dense model's would be free.
- B / peak: the compute bound, the engine's token rate when it is compute-bound (a prior per GPU
  model, scaled by the active parameters).
- communication(B): the all-reduces' bytes, 2 per layer of B x hidden x 2 bytes, at the node's
  all-reduce bus bandwidth (PCIe or NVLink).
- attention: reading each request's KV cache for its context once per step (the decode path takes
  the k+1 queries of a request together); on a stack whose kernel plan verifies on the PREFILL
  path, every verification also re-expands the whole context from MLA's latent (the up-projection
  over the context, per request) and runs without full CUDA graphs.
- D: one draft pass (an EAGLE-3 head: its weights and a launch per pass).

The priors come from published figures and data sheets (docs/reference/step-cost.md names each);
the test holds them to the published speedups within a stated tolerance. A stored `run
calibrate` measurement replaces all of it for the configuration it measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from kimideploy.config.clusters import Cluster
from kimideploy.config.project import Project
from kimideploy.config.target import TargetModel
from kimideploy.plan.calibration import CostModel, DefaultCost
from kimideploy.plan.kernel_plan import stored_plan

PRIOR_CONTEXT_TOKENS = 2048
"""The context a decoding request has, on average, in the published measurements."""
ROUTING_NOVELTY = 0.15
"""How independent the routing of a request's next token is from its previous one's: 1 would
be as if each verified token were another request's (a planning prior; see the docs)."""
DRAFT_BATCH_DOUBLING = 64
"""A draft pass over this many requests costs twice one over a single request (the head's
layer and its lm_head over the draft vocabulary grow with the batch)."""
OVERLAP_LOSS = 0.2
"""The share of the smaller of a step's memory and compute times that does not hide under the
larger: kernels overlap reading weights with arithmetic imperfectly (a GEMM tile waits for its
weights, a MoE layer's expert GEMMs run one after another). Without it the model lets a batch's
tokens be free while memory-bound, and a verification look cheaper as the batch grows, which no
published measurement shows."""
EXPERT_BYTES_PER_PARAM = 0.53
"""INT4 experts with their group scales (4 bits + a bf16 scale per 32 weights)."""


@dataclass(frozen=True)
class GpuPrior:
    """What one GPU model brings to a decode step, for an 8-GPU tensor-parallel engine."""

    source: str
    bandwidth_tb_s: float
    """Memory bandwidth achieved by decode kernels (about 75% of the data sheet's)."""
    fixed_ms: float
    """Per step whatever its size: launches, sampling, scheduling, all-reduce latencies."""
    allreduce_gb_s: float
    """All-reduce bus bandwidth of the node for the step's message sizes."""
    peak_tokens_per_s: float
    """The engine's compute-bound token rate for 32B active parameters."""
    draft_ms: float
    """One EAGLE-3 draft pass (a launch-bound forward of one layer and the lm_head)."""
    prefill_verify_ms_per_request: float
    """Extra per request and verification when it takes MLA's prefill path at the prior context
    (the latent's up-projection over the context, and piecewise graphs)."""


GPU_PRIORS = {
    # RTX PRO 6000 Blackwell Server Edition, 8 on PCIe Gen5: 1.79 TB/s GDDR7 each; the all-reduce
    # is about half of a decode step at c=1 (the team's profile: 51.5%). Fitted to a tuned
    # stack's 1.37x at c=1 and 0.94x at c=128 (31.6% acceptance, k=3) and, on the prefill path,
    # to the hand-built pipeline's 0.66x at ~15%.
    "sm_120": GpuPrior("8x RTX PRO 6000 (PCIe)", 1.34, 3.0, 14.0, 6_000.0, 0.55, 5.0),
    # B200 / B300 in an NVL8 node: 8 TB/s HBM3e each, NVLink 5. Fitted to the published K2.x
    # EAGLE-3 figures on them: 1.3-1.9x at low concurrency (acceptance length 2.6-3.2 at k=3),
    # about 1x at 64-128 requests.
    "sm_100": GpuPrior("8x B200 (NVL8)", 6.0, 4.0, 450.0, 8_000.0, 1.0, 1.2),
    "sm_103": GpuPrior("8x B300 (NVL8)", 6.0, 4.0, 250.0, 14_000.0, 0.8, 1.2),
}


@dataclass(frozen=True)
class StepModel:
    prior: GpuPrior
    tensor_parallel: int
    layers: int
    hidden: int
    kv_bytes_per_token: int
    dense_bytes: float
    """Bytes read every step whatever the batch (bf16 attention, shared expert, embeddings)."""
    expert_bytes: float
    """One routed expert of every MoE layer."""
    experts: int
    experts_per_token: int
    moe_layers: int
    active_scale: float
    prefill_verification: bool

    def touched(self, tokens: float) -> float:
        """Routed experts per layer a batch of `tokens` reads (uniform routing)."""
        if self.experts <= 0:
            return 0.0
        untouched: float = (1 - self.experts_per_token / self.experts) ** tokens
        return self.experts * (1 - untouched)

    def memory_ms(self, tokens: float) -> float:
        read = self.dense_bytes + self.touched(tokens) * self.expert_bytes
        return read / self.tensor_parallel / (self.prior.bandwidth_tb_s * 1e12) * 1e3

    def step_ms(self, requests: int, tokens_each: int) -> float:
        tokens = requests * tokens_each
        # Consecutive tokens of one request route to overlapping experts: the k+1 of a
        # verification read fewer distinct experts than k+1 requests' tokens would.
        routed = requests * (1 + (tokens_each - 1) * ROUTING_NOVELTY)
        compute = tokens / (self.prior.peak_tokens_per_s / self.active_scale) * 1e3
        communication = (
            2 * self.layers * tokens * self.hidden * 2 / (self.prior.allreduce_gb_s * 1e9) * 1e3
        )
        attention = (
            requests * PRIOR_CONTEXT_TOKENS * self.kv_bytes_per_token
            / (self.prior.bandwidth_tb_s * 1e12) * 1e3
        )  # fmt: skip
        memory = self.memory_ms(routed)
        time = self.prior.fixed_ms + max(memory, compute) + OVERLAP_LOSS * min(memory, compute)
        time += communication + attention
        if tokens_each > 1 and self.prefill_verification:
            time += requests * self.prior.prefill_verify_ms_per_request
        return time

    def cost(self, k: int, concurrency: int) -> float:
        plain = self.step_ms(concurrency, 1)
        draft = self.prior.draft_ms * (1 + concurrency / DRAFT_BATCH_DOUBLING)
        speculative = self.step_ms(concurrency, k + 1) + k * draft
        return speculative / plain


def step_model(
    cluster: Cluster, model: TargetModel, prefill_verification: bool
) -> StepModel | None:
    """The model for one cluster's serve engine, or None where a part it needs is unknown (no
    prior for the GPU, or the target's attention or experts not described)."""
    prior = GPU_PRIORS.get(cluster.gpu.arch)
    if prior is None or model.attention is None:
        return None
    tp = cluster.gpu.per_node
    kv = model.attention.kv_values_per_token_layer(tp) * model.num_hidden_layers * 2
    moe = model.moe
    if moe is None:
        dense_only = model.weights_gb * 1e9
        return StepModel(prior, tp, model.num_hidden_layers, model.hidden_size, kv, dense_only,
                         0.0, 0, 0, 0, 1.0, prefill_verification)  # fmt: skip
    expert_bytes = moe.expert_params_m * 1e6 * EXPERT_BYTES_PER_PARAM * moe.moe_layers
    routed_active = moe.experts_per_token * moe.expert_params_m * 1e6 * moe.moe_layers
    dense = max(moe.active_params_b * 1e9 - routed_active, 0.0) * 2
    return StepModel(
        prior=prior,
        tensor_parallel=tp,
        layers=model.num_hidden_layers,
        hidden=model.hidden_size,
        kv_bytes_per_token=kv,
        dense_bytes=dense,
        expert_bytes=expert_bytes,
        experts=moe.routed_experts,
        experts_per_token=moe.experts_per_token,
        moe_layers=moe.moe_layers,
        active_scale=moe.active_params_b / 32,
        prefill_verification=prefill_verification,
    )


@dataclass(frozen=True)
class PriorCost:
    """The uncalibrated cost model: the step model with the GPU's priors and the kernel plan."""

    model: StepModel
    cluster: str
    stack: str

    @property
    def source(self) -> str:
        path = "PREFILL-path verification" if self.model.prefill_verification else "decode path"
        return (
            f"prior for {self.model.prior.source}, {self.stack}, {path} "
            f"(docs/reference/step-cost.md; `kimideploy run calibrate` measures it)"
        )

    def cost(self, k: int, concurrency: int) -> float:
        return self.model.cost(k, concurrency)


FALLBACK_PER_TOKEN = 0.1433
"""C(k) = 1 + k x this where the model has no prior for the GPU or the target is not described:
C(3) = 1.43, measured on a tuned 8x RTX PRO 6000 stack."""


def uncalibrated(project: Project, cluster_name: str, image_name: str | None = None) -> CostModel:
    """The cost model before `run calibrate`: a constant where the cluster sets one
    (step_cost_per_token), else the step model with the GPU's priors and the serve image's kernel
    plan (verification on the prefill path costs what it does)."""
    cluster = project.clusters[cluster_name]
    if cluster.step_cost_per_token is not None:
        return DefaultCost(cluster.step_cost_per_token, cluster_name)
    name = image_name or cluster.images.serve
    image = project.images[name]
    kernels = stored_plan(project, name, cluster.gpu.arch)
    prefill = kernels is not None and kernels.speculation_can_pay is False
    model = step_model(cluster, project.model_for(cluster_name), prefill)
    if model is None:
        return DefaultCost(FALLBACK_PER_TOKEN, cluster_name)
    return PriorCost(model, cluster_name, f"{name} (vLLM {image.vllm})")

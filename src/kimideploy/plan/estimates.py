"""How long a run takes, on how many GPUs, and what it costs: one estimate per stage, each with its
source and its spread, replaced by what the cluster measured as soon as a run of that stage has
finished there.

A stage is a number of units (its progress events' unit: datagen samples, extraction tokens,
training steps, bench levels, weight bytes) at a rate (units per second), plus the engine's
start where the stage starts one. The rate is, in order of preference:

1. measured: the newest finished run of this workload on this cluster (its progress events'
   rate, recorded by `run` when the run ends: services/runs/run_rates.py) for the same unit;
2. a prior: the step-cost model's decode throughput (datagen, bench), or the hand-built
   pipeline's figures on the PCIe host scaled by each GPU's compute prior (extraction 3,165
   tokens/s, training 5 epochs of 10,000 samples in 2.6 h), or a planning figure that says so
   (docs/reference/estimates.md names each).

A prior is given a spread of 0.5x-2x, a measured rate 0.8x-1.25x: the upper end is what the
rental limit judges. GPU-hours count the GPUs the stage holds (datagen and bench hold the serve
release's: nothing else can use them meanwhile), money is GPU-hours at the cluster's
`price_per_gpu_hour`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta

from kimideploy.config.clusters import Rental
from kimideploy.errors import UsageError
from kimideploy.plan import online
from kimideploy.plan.asks import ReplayAsk
from kimideploy.plan.inputs import PlanInputs
from kimideploy.plan.jobs import datagen_concurrency
from kimideploy.plan.replay import replay_drafters
from kimideploy.plan.stage_estimate import MeasuredRate, StageEstimate, span
from kimideploy.plan.step_cost import GPU_PRIORS, step_model

SEED_ARCH = "sm_120"
"""The GPU of the hand-built pipeline's figures (8x RTX PRO 6000, PCIe)."""
SEED_EXTRACT_TOKENS_PER_S = 3165.0
"""Hidden-state extraction on the PCIe host, one 8-GPU engine (the seed write-up)."""
SEED_TRAIN_TOKENS_PER_S_PER_GPU = 14.5e6 * 5 / (2.6 * 3600) / 8
"""5 epochs over 10,000 samples of ~1,450 tokens in 2.6 h on 8 GPUs (the seed write-up):
about 970 trained tokens per second per GPU."""
VOCAB_SAMPLES_PER_S = 200.0
"""Counting the target's tokens of each sample on a CPU (a planning figure)."""
HUB_DOWNLOAD_GBPS = 0.5
"""The hub's CDN to one pod with several streams (a planning figure: 0.1-1 GB/s is seen)."""
REGISTRY_GBPS = 0.1
"""An OCI registry push or pull of one drafter (a planning figure)."""
DRAFTER_GB = 3.0
"""An EAGLE-3 head for a 7168-wide target with its own embedding copy (a planning figure)."""
READ_GBPS = {"ReadWriteOnce": 2.0, "ReadWriteMany": 1.0}
"""Cold read of the weights before a measurement: a node's NVMe, a shared filesystem (planning
figures; the storage probe measures the claim: `host check --storage`)."""
ENGINE_FIXED_S = 150.0
"""An engine start besides reading the weights: imports, torch.compile from a warm cache,
profiling and graph capture (the start-up phases; a cold compile cache adds minutes)."""


def newest_rate(rates: tuple[MeasuredRate, ...], workload: str, unit: str) -> MeasuredRate | None:
    found = [r for r in rates if r.workload == workload and r.unit == unit]
    return found[-1] if found else None


def serve_gpus(ctx: PlanInputs) -> int:
    return ctx.cluster.gpu.per_node * ctx.cluster.workloads.serve.replicas


def decode_tokens_per_s(ctx: PlanInputs, concurrency: int) -> float | None:
    """The serve engine's output tokens per second at `concurrency` requests (no drafter), from
    the step-cost model; None where it has no prior for this GPU or target."""
    model = step_model(ctx.cluster, ctx.project.model, False)
    if model is None:
        return None
    per_replica = concurrency * 1000 / model.step_ms(concurrency, 1)
    return per_replica * ctx.cluster.workloads.serve.replicas


def _compute_scale(ctx: PlanInputs) -> float | None:
    """This GPU's compute prior against the seed's (the PCIe host's)."""
    prior, seed = GPU_PRIORS.get(ctx.cluster.gpu.arch), GPU_PRIORS[SEED_ARCH]
    return None if prior is None else prior.peak_tokens_per_s / seed.peak_tokens_per_s


def engine_start_s(ctx: PlanInputs, workload: str) -> tuple[float, str]:
    """One engine start: the measured one of this workload, else reading the weights at the
    measured (or prior) bandwidth plus the fixed phases."""
    gbps = ctx.storage_read_gbps
    where = "measured"
    if gbps is None:
        gbps = READ_GBPS.get(ctx.cluster.storage.models.access_mode, 1.0)
        where = "a prior"
    weights = ctx.project.model.weights_gb
    return (
        weights / gbps + ENGINE_FIXED_S,
        f"start {span(weights / gbps + ENGINE_FIXED_S)} ({weights:.0f} GB at {gbps:.1f} GB/s, "
        f"{where})",
    )


def _datagen(ctx: PlanInputs) -> StageEstimate | None:
    settings = ctx.cluster.workloads.datagen
    concurrency = datagen_concurrency(ctx) * settings.shards
    tokens = decode_tokens_per_s(ctx, min(concurrency, _serve_capacity(ctx)))
    if tokens is None:
        return None
    rate = tokens / settings.expected_tokens_per_sample
    return StageEstimate(
        "datagen", settings.samples, "samples", rate, 0.0, serve_gpus(ctx),
        "prior: the step-cost model's decode throughput (docs/reference/estimates.md)", False,
        f"{settings.samples:,} samples x {settings.expected_tokens_per_sample:,} tokens at "
        f"{tokens:,.0f} tokens/s ({concurrency} requests in flight)",
    )  # fmt: skip


def _serve_capacity(ctx: PlanInputs) -> int:
    serve = ctx.cluster.workloads.serve
    return serve.max_num_seqs * serve.replicas


def _extract(ctx: PlanInputs) -> StageEstimate | None:
    scale = _compute_scale(ctx)
    if scale is None:
        return None
    settings, datagen = ctx.cluster.workloads.extract, ctx.cluster.workloads.datagen
    tokens = datagen.samples * datagen.expected_tokens_per_sample
    per_engine = SEED_EXTRACT_TOKENS_PER_S * scale * settings.gpus_per_shard / 8
    start, start_text = engine_start_s(ctx, "extract")
    return StageEstimate(
        "extract", tokens, "tokens", per_engine * settings.shards, start,
        settings.shards * settings.gpus_per_shard,
        "prior: the PCIe host's 3,165 tokens/s per 8-GPU engine, scaled by the GPU's compute "
        "prior (docs/reference/estimates.md)", False,
        f"{tokens:,.0f} tokens over {settings.shards} engine(s) at {per_engine:,.0f} tokens/s "
        f"each; {start_text}", datagen.samples,
    )  # fmt: skip


def _train(ctx: PlanInputs) -> StageEstimate | None:
    scale = _compute_scale(ctx)
    if scale is None:
        return None
    train, datagen = ctx.cluster.workloads.train, ctx.cluster.workloads.datagen
    per_node = ctx.cluster.gpu.per_node
    trainer_gpus = online.check(ctx).trainer_gpus if online.is_online(ctx) else per_node
    ranks = trainer_gpus * train.nodes
    samples = datagen.samples * (1 - train.held_out_fraction)
    steps = train.epochs * math.ceil(samples / (train.batch_size * ranks))
    tokens_per_sample = min(datagen.expected_tokens_per_sample, train.max_seq_len)
    step_s = train.batch_size * tokens_per_sample / (SEED_TRAIN_TOKENS_PER_S_PER_GPU * scale)
    start, start_text = (
        engine_start_s(ctx, "train") if online.is_online(ctx) else (60.0, "start ~1 min")
    )
    return StageEstimate(
        "train", steps, "steps", 1 / step_s, start, per_node * train.nodes,
        "prior: the PCIe host's 5 epochs of 10,000 samples in 2.6 h, scaled by the GPU's "
        "compute prior (docs/reference/estimates.md)", False,
        f"{steps:,} steps ({_count(train.epochs, 'epoch')} x {samples:,.0f} samples / "
        f"{_count(ranks, 'rank')} x batch {train.batch_size}) at {step_s:.1f} s; {start_text}",
    )  # fmt: skip


def _bench(ctx: PlanInputs) -> StageEstimate | None:
    bench = ctx.cluster.workloads.bench
    seconds = 0.0
    for concurrency in bench.concurrency:
        tokens = decode_tokens_per_s(ctx, concurrency)
        if tokens is None:
            return None
        seconds += bench.num_prompts * bench.max_tokens / tokens
    seconds *= max(len(bench.prompt_sets), 1)
    levels = len(bench.concurrency) * max(len(bench.prompt_sets), 1)
    return StageEstimate(
        "bench", levels, "levels", levels / seconds, 0.0, serve_gpus(ctx),
        "prior: the step-cost model's decode throughput without a drafter (an upper bound: a "
        "drafter that pays shortens it)", False,
        f"{levels} levels x {bench.num_prompts} prompts x {bench.max_tokens} tokens",
    )  # fmt: skip


def _vocab(ctx: PlanInputs) -> StageEstimate:
    samples = ctx.cluster.workloads.datagen.samples
    return StageEstimate(
        "vocab", samples, "samples", VOCAB_SAMPLES_PER_S, 30.0, 0,
        "prior: a planning figure for tokenizing on a CPU", False,
        f"{samples:,} samples counted on a CPU",
    )  # fmt: skip


def _weights(ctx: PlanInputs) -> StageEstimate:
    gb = ctx.project.model.weights_gb
    return StageEstimate(
        "weights", gb * 1e9, "bytes", HUB_DOWNLOAD_GBPS * 1e9, 0.0, 0,
        "prior: a planning figure for the hub's CDN (0.1-1 GB/s is seen)", False,
        f"{gb:,.0f} GB downloaded onto the models claim",
    )  # fmt: skip


def _artifact(workload: str) -> Callable[[PlanInputs], StageEstimate]:
    def estimate(ctx: PlanInputs) -> StageEstimate:
        return StageEstimate(
            workload, DRAFTER_GB * 1e9, "bytes", REGISTRY_GBPS * 1e9, 10.0, 0,
            "prior: a planning figure for an OCI registry", False,
            f"about {DRAFTER_GB:g} GB through the registry",
        )  # fmt: skip

    return estimate


def _replay(ctx: PlanInputs) -> StageEstimate | None:
    asked = ctx.asked(ReplayAsk)
    prompts = sum(len(rows) for _, rows in asked.prompts) or 64
    tokens = decode_tokens_per_s(ctx, 8)
    if tokens is None:
        return None
    start, start_text = engine_start_s(ctx, "replay")
    drafters = len(replay_drafters(ctx))
    return StageEstimate(
        "replay", prompts, "prompts", tokens / 128, start, ctx.cluster.gpu.per_node,
        "prior: the step-cost model's decode throughput", False,
        f"{prompts} prompts answered and captured, {drafters} drafter(s) judged; {start_text}",
    )  # fmt: skip


ESTIMATORS: dict[str, Callable[[PlanInputs], StageEstimate | None]] = {
    "datagen": _datagen,
    "extract": _extract,
    "vocab": _vocab,
    "train": _train,
    "bench": _bench,
    "weights": _weights,
    "publish": _artifact("publish"),
    "pull": _artifact("pull"),
    "replay": _replay,
}


def estimate(ctx: PlanInputs, rates: tuple[MeasuredRate, ...] = ()) -> StageEstimate | None:
    """The stage's estimate, the prior replaced by the newest measured rate of this workload on
    this cluster where one was recorded for the same unit; None where no model covers it."""
    estimator = ESTIMATORS.get(ctx.workload)
    if estimator is None:
        return None
    prior = estimator(ctx)
    if prior is None:
        return None
    measured = newest_rate(rates, prior.workload, prior.unit)
    if measured is None:
        return prior
    startup = measured.startup_s if measured.startup_s is not None else prior.startup_s
    units, detail = prior.units, prior.detail.split(" at ")[0]
    if prior.samples is not None and measured.units_per_sample is not None:
        # The run measured what a sample holds; the config's figure was a planning guess.
        units = prior.samples * measured.units_per_sample
        detail = (
            f"{prior.samples:,} samples x {measured.units_per_sample:,.0f} {prior.unit} per "
            f"sample (measured)"
        )
    return StageEstimate(
        prior.workload, units, prior.unit, measured.rate, startup, prior.gpus,
        f"measured by run {measured.run_id} on this cluster ({measured.measured_at}): "
        f"{measured.rate:,.3g} {prior.unit}/s", True, detail, prior.samples,
    )  # fmt: skip


def rental_refusal(
    stage: StageEstimate | None,
    cluster_name: str,
    rental: Rental | None,
    now: datetime,
) -> UsageError | None:
    """A run whose upper estimate reaches into the rental's last `margin_hours` (or past its
    end) is refused before it starts: its outputs would have to be published from a cluster
    that is about to go, or would not be finished at all."""
    if stage is None or rental is None:
        return None
    limit = rental.ends - timedelta(hours=rental.margin_hours)
    done = now + timedelta(seconds=stage.high_s)
    if done <= limit:
        return None
    left = (rental.ends - now).total_seconds()
    return UsageError(
        f"run {stage.workload} on {cluster_name} could take up to {span(stage.high_s)} "
        f"(estimate {span(stage.seconds)}, {stage.source}): it would end at "
        f"{done:%Y-%m-%d %H:%M} UTC, past {limit:%Y-%m-%d %H:%M} UTC, the rental's end "
        f"({rental.ends:%Y-%m-%d %H:%M} UTC, {span(max(left, 0))} from now) less its "
        f"{rental.margin_hours:g} h margin for checkpoints and publishing",
        hint="--force starts it anyway; or make it shorter (`--set` fewer samples, epochs or "
        f"levels), or move clusters.{cluster_name}.rental.ends if the rental was extended",
    )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"

"""The lifecycle of a drafter on one cluster, planned before it starts: each stage's estimate
(plan/estimates.py) one after another, with the total time, GPU-hours and money; and the
estimates of the runs that are a sequence of serve loads (the bake-off, the calibration)."""

from __future__ import annotations

from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.config.loading import LoadedProject
from kimideploy.plan.calibration import DEFAULT_KS, DEFAULT_LENGTHS
from kimideploy.plan.model import ClusterAnswers, PlanRequest
from kimideploy.plan.resolve import resolve
from kimideploy.plan.stage_estimate import Lifecycle, StageEstimate, serve_cycles

LIFECYCLE_STAGES = ("weights", "datagen", "extract", "vocab", "train", "bench")


def lifecycle(
    loaded: LoadedProject,
    cluster: str,
    answers: ClusterAnswers,
    overrides: tuple[str, ...] = (),
) -> Lifecycle:
    """datagen through bench on `cluster` (the weights download where a Job fetches them,
    extraction where training is offline), each stage as its `run --dry-run` plans it."""
    profile = loaded.project.clusters[cluster]
    stages: list[StageEstimate] = []
    notes: list[str] = []
    for workload in LIFECYCLE_STAGES:
        if workload == "weights" and profile.weights_via != "job":
            notes.append(f"weights: `host sync-model` fills {cluster}'s hosts over SSH (not timed)")
            continue
        if workload == "extract" and profile.workloads.train.mode == "online":
            notes.append("extract: training is online (the target serves features to the trainer)")
            continue
        plan = resolve(loaded, PlanRequest(workload, cluster, None, overrides), answers)
        if plan.stage_estimate is None:
            notes.append(f"{workload}: no estimate model for it on {cluster}")
            continue
        stages.append(plan.stage_estimate)
    return Lifecycle(
        cluster, tuple(stages), profile.price_per_gpu_hour, tuple(notes), profile.total_gpus
    )


def serve_loads(
    loaded: LoadedProject,
    cluster: str,
    answers: ClusterAnswers,
    *,
    candidates: tuple[str, ...] | None,
    overrides: tuple[str, ...] = (),
) -> Lifecycle:
    """The bake-off (`candidates`: one load and one bench each, `none` included) or the
    calibration (None: a load without a drafter, then one per k, benched at each synthetic
    acceptance length)."""
    bench = resolve(loaded, PlanRequest("bench", cluster, NO_DRAFTER, overrides), answers)
    profile = loaded.project.clusters[cluster]
    if bench.stage_estimate is None:
        return Lifecycle(cluster, (), profile.price_per_gpu_hour, ("bench: no estimate model",))
    start = bench.engine_start_estimate_s
    if candidates is not None:
        names = tuple(dict.fromkeys((NO_DRAFTER, *candidates)))
        stage = serve_cycles(
            "bake-off", bench.stage_estimate, start, loads=len(names), benches=len(names),
            detail=f"{len(names)} serve loads and benches ({', '.join(names)})",
        )  # fmt: skip
    else:
        loads = 1 + len(DEFAULT_KS)
        benches = 1 + len(DEFAULT_KS) * len(DEFAULT_LENGTHS)
        stage = serve_cycles(
            "calibrate", bench.stage_estimate, start, loads=loads, benches=benches,
            detail=f"{loads} serve loads (none, k={','.join(map(str, DEFAULT_KS))}) and "
            f"{benches} benches (each k at {len(DEFAULT_LENGTHS)} acceptance lengths)",
        )  # fmt: skip
    return Lifecycle(cluster, (stage,), profile.price_per_gpu_hour)

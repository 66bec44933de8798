"""`kimideploy drafter doctor` and `drafter check --replay`: one replay Job on the cluster, then
the diagnosis (plan/drafter_doctor.py) from its result, the drafter's held-out figures and what
vLLM counted where it serves (the newest stored bench run of that drafter on that cluster)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimideploy.cluster.session import ClusterSession
from kimideploy.config.loading import LoadedProject
from kimideploy.errors import KimiDeployError, UsageError
from kimideploy.formats.bench_result import BenchResult
from kimideploy.formats.prompts import PromptFileError, load_prompts
from kimideploy.formats.vllm_metrics import BASIS_BY_LENGTH, conditional_rates
from kimideploy.plan.asks import ReplayAsk
from kimideploy.plan.drafter_doctor import Diagnosis, DoctorInputs, Measured, diagnose
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.resolve import serve_cost_model
from kimideploy.services.reporting import Reporter
from kimideploy.services.runs import batch_runs

USER_PROMPTS = "yours"


@dataclass(frozen=True)
class ReplayOutcome:
    run_id: str
    result: dict[str, Any]
    """The judge's result: {drafters: {name: ...}, capture: {...}}."""


def read_prompts(path: Path) -> tuple[dict[str, Any], ...]:
    """The user's prompt file as the bench reads it (JSON Lines or Parquet; plain prompts,
    ShareGPT or OpenAI conversations); an unusable file is a usage error naming its rows."""
    try:
        found = load_prompts(path)
    except (OSError, UnicodeDecodeError, PromptFileError) as exc:
        raise UsageError(f"--prompts {path}: cannot be read ({exc})") from exc
    if not found.prompts:
        problems = "; ".join(found.bad[:3]) or "the file is empty"
        raise UsageError(
            f"--prompts {path}: no usable prompt ({problems})",
            hint='one JSON object per line: {"prompt": ...} or {"messages": [...]}',
        )
    rows = []
    for prompt in found.prompts:
        row: dict[str, Any] = {"id": prompt.id, "messages": prompt.messages}
        if prompt.tools:
            row["tools"] = prompt.tools
        rows.append(row)
    return tuple(rows)


def run_replay(
    session: ClusterSession,
    loaded: LoadedProject,
    names: tuple[str, ...],
    cluster: str | None,
    *,
    prompts: tuple[dict[str, Any], ...],
    reporter: Reporter,
    poll_s: float = 2.0,
) -> ReplayOutcome:
    sets = ((USER_PROMPTS, prompts),) if prompts else ()
    ask = ReplayAsk(drafters=names, prompts=sets)
    request = PlanRequest("replay", cluster, names[0], ask=ask)
    started = batch_runs.start_run(session, loaded, request, reporter)
    # The capture on the serving engine, then the judgement on one GPU: two Jobs in turn.
    job = started.job
    engine = started.rendered.plan.engine_start  # the capture's; the judgement starts none
    while True:
        snapshot = batch_runs.follow_run(
            session, job, started.run_id, reporter, poll_s=poll_s, engine=engine
        )
        engine = None
        following = batch_runs.next_job(session, started, job, reporter)
        if following is None:
            break
        job = following
    result = batch_runs.run_results(snapshot).get("0")
    if not result or not isinstance(result.get("drafters"), dict):
        raise KimiDeployError(
            f"the replay Job {job} ended without a judgement",
            hint=f"`kimideploy logs {started.run_id}` shows what its containers did",
        )
    return ReplayOutcome(started.run_id, dict(result))


def measured(
    session: ClusterSession, loaded: LoadedProject, name: str, cluster: str, concurrency: int
) -> Measured | None:
    """The newest bench run of the drafter on the cluster, at the gated concurrency (else its
    lowest), with vLLM's per-position acceptance made conditional."""
    project = loaded.project
    runs = [
        b
        for b in session.bench_results(project.release_name("serve"))
        if b.drafter == name and b.cluster == cluster
    ]
    for bench in sorted(runs, key=lambda b: b.measured_at, reverse=True):
        label = f"bench run {bench.run_id} of {bench.measured_at[:10]}"
        found = measured_from_bench(bench.result, concurrency, label)
        if found is not None:
            return found
    return None


def measured_from_bench(result: BenchResult, concurrency: int, label: str) -> Measured | None:
    """A bench result's level at `concurrency` (else its lowest) as the doctor reads it."""
    counted = [lv for lv in result.levels if lv.mean_acceptance_length is not None]
    if not counted:
        return None
    level = min(counted, key=lambda lv: (lv.concurrency != concurrency, lv.concurrency))
    assert level.mean_acceptance_length is not None
    rates = list(level.per_position_acceptance or ())
    by_length = level.per_position_basis == BASIS_BY_LENGTH
    return Measured(
        level.mean_acceptance_length,
        rates if by_length else conditional_rates(rates),
        f"{label} ({level.prompt_set}, c={level.concurrency})",
    )


def diagnoses(
    loaded: LoadedProject,
    cluster: str,
    outcome: ReplayOutcome,
    measured_by_drafter: dict[str, Measured | None],
    *,
    calibrations: tuple[Any, ...],
    prompt_set: str | None,
) -> list[Diagnosis]:
    project = loaded.project
    costs, _, level = serve_cost_model(loaded, cluster, calibrations)
    model = project.model_for(cluster)
    out = []
    for name, replay in outcome.result["drafters"].items():
        drafter = project.eagle_drafter(name)
        held_figures, per_position = _held_out(drafter, replay)
        trained = replay.get("trained_for") or {}
        trained_for = "@".join(
            filter(None, (trained.get("trained_for"), trained.get("trained_for_revision")))
        )
        out.append(
            diagnose(
                DoctorInputs(
                    drafter=name,
                    cluster=cluster,
                    k=drafter.num_speculative_tokens,
                    replay=replay,
                    held_out=held_figures,
                    held_out_per_position=per_position,
                    costs=costs,
                    concurrency=level,
                    measured=measured_by_drafter.get(name),
                    served_model=f"{model.repo}@{model.revision}",
                    trained_for=trained_for,
                    prompt_set=prompt_set,
                )
            )
        )
    return out


def _held_out(drafter: Any, replay: dict[str, Any]) -> tuple[dict[int, float] | None, list[float]]:
    """The registry's held-out figures, else the ones the drafter's lineage carries."""
    if drafter.held_out is not None:
        lengths = {int(k): float(v) for k, v in drafter.held_out.mean_acceptance_length.items()}
        return lengths, list(drafter.held_out.acceptance_per_position)
    judged = replay.get("held_out")
    judged = judged if isinstance(judged, dict) else {}
    lengths = _by_depth(judged.get("mean_acceptance_length"))
    if not lengths:
        return None, []
    by_k = judged.get("by_k")
    depths = (
        {int(k): v for k, v in by_k.items() if _depth(k) and isinstance(v, dict)}
        if (isinstance(by_k, dict))
        else {}
    )
    deepest = depths[max(depths)] if depths else {}
    found = deepest.get("acceptance_per_position")
    rates = [float(r) for r in found if _number(r)] if isinstance(found, list) else []
    return lengths, rates


def _depth(key: Any) -> bool:
    return isinstance(key, str | int) and str(key).isdigit()


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _by_depth(found: Any) -> dict[int, float]:
    """A lineage's figures by draft depth, leaving out what is not a depth and a number: the
    lineage is a file in the drafter's folder, not something kimideploy vouches for."""
    if not isinstance(found, dict):
        return {}
    return {int(k): float(v) for k, v in found.items() if _depth(k) and _number(v)}

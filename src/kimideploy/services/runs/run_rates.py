"""The truth after a run: what it measured, kept on the cluster for the next estimate, and said
against what was predicted.

A finished run's rate is its progress events' rate (units per second while it worked, summed
over its indexes: services/runs/progress.py); everything else between the Job's start and its
completion (scheduling, the image, the engine's start, reading the inputs) is its fixed part, so
the next run of the same stage on the cluster is estimated as that fixed part plus its units at
that rate (plan/estimates.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kimideploy.cluster.jobs import JobSnapshot
from kimideploy.cluster.session import RATES, ClusterSession
from kimideploy.errors import ClusterError
from kimideploy.plan.stage_estimate import MeasuredRate, StageEstimate, money_text, span
from kimideploy.services.runs import progress


def _seconds_between(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    try:
        began = datetime.fromisoformat(start.replace("Z", "+00:00"))
        ended = datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError:
        return None
    seconds = (ended - began).total_seconds()
    return seconds if seconds >= 0 else None


def units_per_sample(logs: dict[int, str], unit: str) -> float | None:
    """What a sample held, from the indexes' results (extraction's {"samples", "tokens"}); None
    for a stage counted in samples or a result without both."""
    if unit == "samples":
        return None
    samples = units = 0.0
    for text in logs.values():
        results = [e for e in progress.parse_events(text) if e["event"] == "result"]
        found = results[-1] if results else {}
        if isinstance(found.get("samples"), int | float) and isinstance(
            found.get(unit), int | float
        ):
            samples += found["samples"]
            units += found[unit]
    return round(units / samples, 3) if samples > 0 and units > 0 else None


def measured_rate(
    snapshot: JobSnapshot, workload: str, run_id: str, gpus: int
) -> MeasuredRate | None:
    """What a succeeded run measured; None where it reported no progress or no times."""
    wall = _seconds_between(snapshot.started_at, snapshot.finished_at)
    found = progress.aggregate(snapshot.logs, snapshot.completions)
    if snapshot.phase != "complete" or wall is None or found is None or found.rate <= 0:
        return None
    working = found.done / found.rate
    return MeasuredRate(
        workload=workload,
        unit=found.unit,
        rate=round(found.rate, 6),
        startup_s=round(max(wall - working, 0.0), 1),
        wall_s=round(wall, 1),
        gpus=gpus,
        run_id=run_id,
        measured_at=snapshot.finished_at or "",
        units_per_sample=units_per_sample(snapshot.logs, found.unit),
    )


def record(session: ClusterSession, rate: MeasuredRate) -> str | None:
    """Keep it on the cluster; a failure to write is a note, never the run's failure."""
    try:
        session.record_measurement(RATES, rate.to_dict())
    except ClusterError as exc:
        return f"the run's rates were not kept ({exc.message})"
    return None


def against_prediction(
    predicted: StageEstimate | None, actual: MeasuredRate, price: float | None
) -> tuple[str, dict[str, Any]]:
    """The line `run` prints when a run ends, and the same as facts."""
    gpu_hours = actual.gpus * actual.wall_s / 3600
    money = f", {money_text(gpu_hours * price)}" if price is not None else ""
    facts: dict[str, Any] = {
        "wall_s": actual.wall_s,
        "gpu_hours": round(gpu_hours, 3),
        "money": None if price is None else round(gpu_hours * price, 2),
        "rate": actual.rate,
        "unit": actual.unit,
    }
    line = f"took {span(actual.wall_s)} on {actual.gpus} GPUs ({gpu_hours:,.1f} GPU-hours{money})"
    if predicted is not None:
        off = (actual.wall_s - predicted.seconds) / predicted.seconds
        facts.update(predicted_s=round(predicted.seconds, 1), off=round(off, 3))
        line += f"; predicted {span(predicted.seconds)} ({off:+.0%}, {predicted.source})"
    return line + "; kept for the next estimate on this cluster", facts

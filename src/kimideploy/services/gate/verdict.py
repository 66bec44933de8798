"""The promotion gate's arithmetic: which baseline is comparable, and keep or roll back.

No cluster here: the orchestration (services/gate/gating.py) feeds it stored bench results and the
result event of the bench pod, so every rule is unit-testable.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kimideploy.cluster.bench_results import StoredBench, measured_time
from kimideploy.formats.bench_result import BenchLevel, BenchResult, LevelKey

KEEP, ROLLBACK = "keep", "rollback"


class GateMeasurementError(Exception):
    """The gate could not measure (bench failed, counters missing, no baseline level)."""


def fingerprint(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def serve_fingerprint(objects: list[dict[str, Any]]) -> str:
    """What makes two non-speculative serve revisions perform alike: the vLLM container and the
    replica count. Labels and annotations (revision, config hash) do not change throughput."""
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    relevant = {k: container.get(k) for k in ("image", "command", "args", "env", "resources")}
    return fingerprint({"replicas": deployment["spec"].get("replicas", 1), **relevant})


def bench_fingerprint(
    prompt_sets: list[str],
    num_prompts: int,
    max_tokens: int,
    prompt_files: dict[str, str] | None = None,
) -> str:
    """What makes two bench runs comparable; prompt files are named only when used, so stored
    runs of the built-in sets keep their fingerprint."""
    fields: dict[str, object] = {
        "prompt_sets": prompt_sets,
        "num_prompts": num_prompts,
        "max": max_tokens,
    }
    used = {n: p for n, p in (prompt_files or {}).items() if n in prompt_sets}
    if used:
        fields["prompt_files"] = used
    return fingerprint(fields)


def pick_baseline(
    stored: list[StoredBench],
    *,
    cluster: str,
    serve_print: str,
    bench_print: str,
    needed: list[tuple[str, int]],
    max_age_h: float,
    now: datetime,
) -> tuple[StoredBench | None, str]:
    """The newest comparable non-speculative run, or None and why there is none."""
    baselines = [s for s in stored if s.drafter == "none" and s.cluster == cluster]
    if not baselines:
        return None, f"no non-speculative baseline has been measured on cluster {cluster}"
    same = [s for s in baselines if s.serve_fingerprint == serve_print]
    if not same:
        return None, (
            "the stored baselines were measured on a different serve configuration "
            "(image, vLLM flags or replicas changed)"
        )
    same = [s for s in same if s.bench_fingerprint == bench_print]
    if not same:
        return None, "the stored baselines used other bench settings (prompts or max_tokens)"
    covering = [s for s in same if s.result.covers(needed)]
    if not covering:
        wanted = ", ".join(f"{p} c={c}" for p, c in needed)
        return None, f"no stored baseline covers every gated level ({wanted})"
    newest = covering[-1]
    age_h = (now - _parse_time(newest.measured_at)).total_seconds() / 3600
    if age_h > max_age_h:
        return None, (
            f"the newest baseline (run {newest.run_id}) is {age_h:.0f} h old, "
            f"older than gate.baseline_max_age_h ({max_age_h:g} h)"
        )
    return newest, f"baseline run {newest.run_id} measured {newest.measured_at} ({age_h:.1f} h ago)"


def _parse_time(text: str) -> datetime:
    return measured_time(text)


def check_measured(result: BenchResult, needed: list[LevelKey], what: str) -> None:
    """Every needed level is present, had no failed request and produced tokens."""
    levels = result.by_key()
    for key in needed:
        level = levels.get(key)
        where = f"{what} at {key[0]} c={key[1]}"
        if level is None:
            raise GateMeasurementError(f"{where}: the bench result has no such level")
        if level.failed:
            errors = "; ".join(level.errors) or "no error text"
            raise GateMeasurementError(
                f"{where}: {level.failed} of {level.requests} requests failed ({errors})"
            )
        if not level.output_tokens or not level.output_tokens_per_s:
            raise GateMeasurementError(f"{where}: no output tokens were measured")
        if level.degenerate:
            raise GateMeasurementError(
                f"{where}: {level.degenerate_outputs} of {level.judged_outputs} outputs repeat "
                f"themselves (mean distinct-bigram share {level.distinct_bigrams}); acceptance "
                "on a loop is the loop's, not the traffic's: bench chat prompts the target "
                "answers (bench.prompt_files), not raw completions"
            )


@dataclass(frozen=True)
class Verdict:
    decision: str
    reason: str
    min_speedup: float
    levels: list[dict[str, Any]] = field(default_factory=list)
    run_id: str | None = None
    baseline_run: str | None = None
    baseline_note: str = ""
    gate_failed: bool = False
    fail_open: bool = False
    kernels: str | None = None
    """What the measured run's figures were measured on (BenchResult.kernels)."""
    kind = "gate"
    """What gave the verdict (a canary's says "canary"), for the line `up` prints."""

    @property
    def worst_speedup(self) -> float | None:
        values = [lv["speedup"] for lv in self.levels if lv.get("speedup") is not None]
        return min(values) if values else None

    def summary(self) -> str:
        worst = self.worst_speedup
        numbers = f" (worst {worst:.2f}x, needed {self.min_speedup:.2f}x)" if worst else ""
        label = "kept" if self.decision == KEEP else "rolled back"
        if self.fail_open:
            label = "kept (fail-open)"
        return f"{label}{numbers}: {self.reason}"

    def details(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "reason": self.reason,
            "summary": self.summary(),
            "min_speedup": self.min_speedup,
            "worst_speedup": self.worst_speedup,
            "levels": self.levels,
            "run_id": self.run_id,
            "baseline_run": self.baseline_run,
            "baseline_note": self.baseline_note,
            "gate_failed": self.gate_failed,
            "fail_open": self.fail_open,
            "kernels": self.kernels,
        }


def judge(
    measured: BenchResult,
    baseline: BenchResult,
    needed: list[LevelKey],
    min_speedup: float,
) -> tuple[bool, str, list[dict[str, Any]]]:
    """(keep, reason, per-level comparison); raises GateMeasurementError when it cannot decide."""
    check_measured(baseline, needed, "baseline")
    check_measured(measured, needed, "drafter")
    ours, theirs = measured.by_key(), baseline.by_key()
    compared, short = [], []
    for key in needed:
        level, base = ours[key], theirs[key]
        if level.acceptance_rate is None:
            raise GateMeasurementError(
                f"drafter at {key[0]} c={key[1]}: vLLM's speculative-decoding counters are missing "
                f"(metrics {level.metrics}); is the drafter enabled?"
            )
        speedup = level.output_tokens_per_s / base.output_tokens_per_s
        row = {
            "prompt_set": key[0],
            "concurrency": key[1],
            "tokens_per_s": level.output_tokens_per_s,
            "baseline_tokens_per_s": base.output_tokens_per_s,
            "speedup": round(speedup, 4),
            "acceptance_rate": level.acceptance_rate,
            "mean_acceptance_length": level.mean_acceptance_length,
            "per_position_acceptance": _listed(level.per_position_acceptance),
            "per_position_basis": level.per_position_basis,
            "counted_by": level.counted_by,
            "ttft_p50_s": level.ttft_p50_s,
            "tpot_p50_s": level.tpot_p50_s,
            "distinct_bigrams": level.distinct_bigrams,
            "passed": speedup >= min_speedup,
        }
        compared.append(row)
        if not row["passed"]:
            short.append(f"{key[0]} c={key[1]} {speedup:.2f}x")
    if short:
        return False, f"below {min_speedup:.2f}x at " + ", ".join(short), compared
    levels = ", ".join(
        f"{row['prompt_set']} c={row['concurrency']} {row['speedup']:.2f}x" for row in compared
    )
    return True, f"at least {min_speedup:.2f}x everywhere: {levels}", compared


def _listed(values: tuple[float, ...] | None) -> list[float] | None:
    return None if values is None else list(values)


def compare_with_baseline(
    measured: BenchResult, baseline: BenchResult | None
) -> list[dict[str, Any]]:
    """One row per measured level: throughput, latency, acceptance and, when the baseline measured
    the same prompt set at the same concurrency, its throughput and the speedup over it."""
    theirs = baseline.by_key() if baseline else {}
    rows = []
    for key, level in sorted(measured.by_key().items()):
        matched: BenchLevel | None = theirs.get(key)
        base = matched.output_tokens_per_s if matched else None
        ours = level.output_tokens_per_s
        rows.append(
            {
                "prompt_set": key[0],
                "concurrency": key[1],
                "tokens_per_s": ours,
                "baseline_tokens_per_s": base,
                "speedup": round(ours / base, 4) if base else None,
                "acceptance_rate": level.acceptance_rate,
                "mean_acceptance_length": level.mean_acceptance_length,
                "counted_by": level.counted_by,
                "ttft_p50_s": level.ttft_p50_s,
                "ttft_p99_s": level.ttft_p99_s,
                "tpot_p50_s": level.tpot_p50_s,
                "tpot_p99_s": level.tpot_p99_s,
            }
        )
    return rows

"""The bake-off table: every candidate's bench levels side by side with the non-speculative
baseline's, judged by the gate's own rule, and the method to serve at each concurrency.

A candidate is recommended at a concurrency when it passes the gate there on every prompt set
(at least `min_speedup` over no drafter on each) and has the best geometric-mean speedup over
the prompt sets among those that pass; where none passes, serving without speculation is the
recommendation. Each EAGLE-3 candidate's per-position acceptance, as the table measured it,
also gives its k per batch size against the cluster's calibrated step cost: the schedule
`k_schedule: auto` would serve (plan/k_schedule.py), shown where it varies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.formats.bench_result import BenchResult
from kimideploy.plan.calibration import CostModel
from kimideploy.plan.k_schedule import choose_schedule
from kimideploy.services.gate.verdict import GateMeasurementError, check_measured, judge


@dataclass(frozen=True)
class BakeoffRow:
    prompt_set: str
    concurrency: int
    candidate: str
    output_tokens_per_s: float
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    per_position_acceptance: list[float] | None
    speedup: float
    passed: bool
    per_position_basis: str | None = None
    """vllm_metrics' BASIS_*: exact, or approximate where drafts varied in length."""
    counted_by: str | None = None
    """verdict.counted_by: each response's own acceptance (`requests`) or the counters."""


@dataclass(frozen=True)
class Bakeoff:
    rows: list[BakeoffRow]
    recommended: dict[int, str]
    """concurrency -> the candidate to serve there (`none` where nothing pays everywhere)."""
    unmeasured: dict[str, str]
    """candidate -> why it could not be judged (its bench lacked a level or vLLM's counters)."""
    k_schedules: dict[str, str] = field(default_factory=dict)
    """EAGLE-3 candidate -> its k by batch size from the measured acceptance, or why not."""
    rounds: list[str] = field(default_factory=list)
    """With --rounds: each interleaved candidate's figures round by round (their spread)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": [vars(r) for r in self.rows],
            "recommended": {str(c): m for c, m in sorted(self.recommended.items())},
            "unmeasured": dict(self.unmeasured),
            "k_schedules": dict(self.k_schedules),
            "rounds": list(self.rounds),
        }


def bakeoff(
    results: dict[str, BenchResult],
    needed: list[tuple[str, int]],
    min_speedup: float,
) -> Bakeoff:
    """`results`: candidate -> its bench result (the `result` event), including NO_DRAFTER's."""
    baseline = results[NO_DRAFTER]
    rows: list[BakeoffRow] = []
    unmeasured: dict[str, str] = {}
    check_measured(baseline, needed, "baseline")
    levels = baseline.by_key()
    for prompt_set, concurrency in needed:
        tokens = levels[(prompt_set, concurrency)].output_tokens_per_s
        rows.append(
            BakeoffRow(prompt_set, concurrency, NO_DRAFTER, tokens, None, None, None, 1.0, True)
        )
    for name, measured in results.items():
        if name == NO_DRAFTER:
            continue
        try:
            _, _, compared = judge(measured, baseline, needed, min_speedup)
        except GateMeasurementError as exc:
            unmeasured[name] = str(exc)
            continue
        rows += [
            BakeoffRow(
                row["prompt_set"],
                row["concurrency"],
                name,
                float(row["tokens_per_s"]),
                row["acceptance_rate"],
                row["mean_acceptance_length"],
                row["per_position_acceptance"],
                float(row["speedup"]),
                bool(row["passed"]),
                row.get("per_position_basis"),
                row.get("counted_by"),
            )
            for row in compared
        ]
    return Bakeoff(rows, _recommend(rows, needed), unmeasured)


def _recommend(rows: list[BakeoffRow], needed: list[tuple[str, int]]) -> dict[int, str]:
    chosen = {}
    for concurrency in sorted({c for _, c in needed}):
        here = [r for r in rows if r.concurrency == concurrency and r.candidate != NO_DRAFTER]
        score: dict[str, float] = {}
        for candidate in {r.candidate for r in here}:
            # judge() returned a row for every needed level or raised, so all levels are here.
            mine = [r for r in here if r.candidate == candidate]
            if all(r.passed for r in mine):
                score[candidate] = math.exp(sum(math.log(r.speedup) for r in mine) / len(mine))
        chosen[concurrency] = max(score, key=lambda c: (score[c], c)) if score else NO_DRAFTER
    return chosen


def with_k_schedules(
    result: Bakeoff, ks: dict[str, int], costs: CostModel, max_num_seqs: int, *, vllm: str | None
) -> Bakeoff:
    """`ks`: the EAGLE-3 candidates and the k each served at. Its acceptance per position is the
    mean over the table's prompt sets and concurrencies (a property of the drafter and the
    traffic, not of the batch); the schedule is the one `k_schedule: auto` would serve."""
    schedules: dict[str, str] = {}
    for name, k in ks.items():
        measured = [
            r.per_position_acceptance
            for r in result.rows
            if r.candidate == name and r.per_position_acceptance
        ]
        if not measured:
            schedules[name] = "no per-position acceptance counted; k stays as served"
            continue
        depth = min(k, *(len(m) for m in measured))
        acceptance = [sum(m[i] for m in measured) / len(measured) for i in range(depth)]
        schedule = choose_schedule(
            "auto", costs, acceptance, depth, max_num_seqs=max_num_seqs, vllm=vllm
        )
        schedules[name] = schedule.describe()
    return replace(result, k_schedules=schedules)


def table_rows(result: Bakeoff) -> list[dict[str, Any]]:
    """One printable row per prompt set, concurrency and candidate, best first."""
    ordered = sorted(result.rows, key=lambda r: (r.prompt_set, r.concurrency, -r.speedup))
    return [
        {
            "prompt_set": r.prompt_set,
            "c": r.concurrency,
            "candidate": r.candidate,
            "tokens_per_s": round(r.output_tokens_per_s, 1),
            "acceptance": None if r.acceptance_rate is None else round(r.acceptance_rate, 3),
            "mean_length": None
            if r.mean_acceptance_length is None
            else round(r.mean_acceptance_length, 2),
            "per_position": _per_position(r),
            "counted": r.counted_by or "",
            "speedup": f"{r.speedup:.2f}x",
            "recommended": "yes" if result.recommended.get(r.concurrency) == r.candidate else "",
        }
        for r in ordered
    ]


def _per_position(row: BakeoffRow) -> str:
    """Per-position acceptance, marked `~` where it is approximate (drafts of varying length on
    an engine that does not count them by length: suffix decoding, n-gram)."""
    if not row.per_position_acceptance:
        return ""
    figures = " ".join(f"{p:.2f}" for p in row.per_position_acceptance)
    approximate = (row.per_position_basis or "").startswith("approximate")
    return f"~{figures}" if approximate else figures

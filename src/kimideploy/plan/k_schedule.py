"""k by batch size (`drafters.<d>.k_schedule: auto`): num_speculative_tokens_per_batch_size.

At each concurrency the calibration measured, the k in 0..num_speculative_tokens with the highest
predicted speedup for the drafter's measured acceptance (k = 0: no drafting at that batch size,
speedup 1.0, so a drafter stops costing throughput where it cannot pay). Ranges split at the
geometric midpoint between measured concurrencies, the first starts at batch size 1 (vLLM
requires it) and the last ends at max_num_seqs; neighbours with the same k merge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kimideploy.formats.extraction_engine import version_tuple
from kimideploy.plan.calibration import CostModel, MeasuredCost, drafter_speedup

MIN_VLLM = (0, 32)


@dataclass(frozen=True)
class KSchedule:
    ranges: tuple[tuple[int, int, int], ...] = ()
    """(first batch size, last batch size, k), inclusive; empty: one fixed k."""
    note: str = ""
    predicted: tuple[tuple[int, int, float], ...] = field(default=())
    """(concurrency, k, predicted speedup) at each measured concurrency."""

    def describe(self) -> str:
        if not self.ranges:
            return self.note
        spans = ", ".join(f"{a}-{b}: k={k}" for a, b, k in self.ranges)
        at = ", ".join(f"c={c} k={k} {s:.2f}x" for c, k, s in self.predicted)
        return f"k by batch size {spans}; predicted {at}"


def choose_schedule(
    mode: str,
    costs: CostModel,
    acceptance: list[float],
    k_max: int,
    *,
    max_num_seqs: int,
    vllm: str | None,
) -> KSchedule:
    if mode != "auto":
        return KSchedule(note=f"fixed k={k_max}")
    if vllm is None or version_tuple(vllm) < MIN_VLLM:
        return KSchedule(
            note=f"fixed k={k_max}: vLLM {vllm or 'none'} has no "
            "num_speculative_tokens_per_batch_size (needs >= 0.32)"
        )
    if not isinstance(costs, MeasuredCost):
        return KSchedule(
            note=f"fixed k={k_max}: k_schedule auto needs a calibration of this serve "
            "configuration (`kimideploy run calibrate`)"
        )
    if not acceptance:
        return KSchedule(
            note=f"fixed k={k_max}: k_schedule auto needs the drafter's measured acceptance"
        )
    levels = [c for c in costs.measured_concurrency() if c <= max_num_seqs] or [1]
    predicted = []
    for c in levels:
        options = [(1.0, 0)] + [
            (drafter_speedup(costs, acceptance, k, c), k) for k in range(1, k_max + 1)
        ]
        value, k = max(options, key=lambda o: (round(o[0], 6), -o[1]))
        predicted.append((c, k, round(value, 4)))
    ranges: list[list[int]] = []
    for i, (c, k, _) in enumerate(predicted):
        start = 1 if i == 0 else ranges[-1][1] + 1
        end = (
            max_num_seqs
            if i == len(predicted) - 1
            else max(start, math.floor(math.sqrt(c * predicted[i + 1][0])))
        )
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, k])
    return KSchedule(tuple((a, b, k) for a, b, k in ranges), "", tuple(predicted))

"""The speculative-decoding speedup model, calibrated on published measurements
(docs/reference/domain.md §6).

Per-token acceptance a and k draft tokens give E = (1 - a^(k+1)) / (1 - a) tokens per step; with
per-position conditional acceptance p_1..p_k, E = 1 + p_1 + p_1 p_2 + ... A step costs
C(k) = 1 + k * step_cost_per_token relative to a plain decode step (verifying k+1 tokens plus k
draft passes); speedup = E / C(k). vLLM's acceptance rate (accepted / drafted tokens) r gives
E = 1 + k r directly, and break-even is r = (C(k) - 1) / k.

Weak where: the cost is linear in k only near the calibrated k; it is a small-batch model (at
32-128 concurrent requests speculation ties or loses); acceptance measured on other prompts
does not transfer.
"""

from __future__ import annotations

from dataclasses import dataclass


def tokens_per_step(per_position: list[float]) -> float:
    """E = 1 + sum over i of the product of p_1..p_i (conditional acceptance per position)."""
    expected, survive = 1.0, 1.0
    for p in per_position:
        survive *= p
        expected += survive
    return expected


def rates_at_k(per_position: list[float], k: int) -> list[float]:
    """A drafter's conditional acceptance for k positions (the last measured one repeats)."""
    return list(per_position[:k]) + [per_position[-1]] * max(0, k - len(per_position))


def tokens_per_step_uniform(acceptance: float, k: int) -> float:
    if acceptance >= 1.0:
        return float(k + 1)
    return (1 - acceptance ** (k + 1)) / (1 - acceptance)


def step_cost(k: int, cost_per_token: float) -> float:
    return 1.0 + k * cost_per_token


def speedup_from_rate(rate: float, k: int, cost_per_token: float) -> float:
    """From vLLM's acceptance rate (accepted / drafted tokens)."""
    return (1 + k * rate) / step_cost(k, cost_per_token)


def break_even_rate(k: int, cost_per_token: float) -> float:
    return (step_cost(k, cost_per_token) - 1) / k


@dataclass(frozen=True)
class Estimate:
    tokens_per_step: float
    step_cost: float
    speedup: float
    break_even_rate: float

    def describe(self) -> str:
        verdict = "faster" if self.speedup > 1 else "SLOWER than no speculation"
        return (
            f"{self.speedup:.2f}x ({verdict}): {self.tokens_per_step:.2f} tokens/step at step cost "
            f"{self.step_cost:.2f}; break-even acceptance rate {self.break_even_rate:.1%}"
        )


def estimate(per_position: list[float], k: int, cost_per_token: float) -> Estimate:
    """Use the first k positions' acceptance (fewer measured positions: the last one repeats)."""
    measured = list(per_position[:k]) + [per_position[-1]] * max(0, k - len(per_position))
    expected = tokens_per_step(measured)
    cost = step_cost(k, cost_per_token)
    return Estimate(expected, cost, expected / cost, break_even_rate(k, cost_per_token))

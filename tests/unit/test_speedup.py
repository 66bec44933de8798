"""The speedup model reproduces the calibration points of docs/reference/domain.md §6."""

from __future__ import annotations

import pytest

from kimideploy.plan.speedup import (
    break_even_rate,
    estimate,
    speedup_from_rate,
    step_cost,
    tokens_per_step,
    tokens_per_step_uniform,
)

PCIE_COST = 0.43 / 3  # C(3) = 1.43 on a tuned 8x RTX PRO 6000 stack


def test_published_rtx6000_point() -> None:
    # 1.37x at a 31.6% acceptance rate with 3 draft tokens and C(3) ~ 1.43 (Kimi-K2.6)
    assert step_cost(3, PCIE_COST) == pytest.approx(1.43, abs=0.001)
    assert speedup_from_rate(0.316, 3, PCIE_COST) == pytest.approx(1.37, abs=0.01)


def test_the_teams_066x_implies_a_slow_verify_path() -> None:
    # ~15% acceptance gave 0.66x: E = 1.45 at k = 3, so C ~ 2.2 (cost 0.4 per token, not 0.143)
    implied_cost = ((1 + 3 * 0.15) / 0.66 - 1) / 3
    assert step_cost(3, implied_cost) == pytest.approx(2.2, abs=0.01)
    assert speedup_from_rate(0.15, 3, implied_cost) == pytest.approx(0.66, abs=0.005)
    assert speedup_from_rate(0.15, 3, PCIE_COST) == pytest.approx(1.01, abs=0.01)  # a tuned stack


def test_break_even() -> None:
    assert break_even_rate(3, PCIE_COST) == pytest.approx(0.1433, abs=1e-4)
    assert break_even_rate(5, 0.4) == pytest.approx(0.4)


def test_uniform_and_per_position_agree() -> None:
    assert tokens_per_step([0.6] * 3) == pytest.approx(tokens_per_step_uniform(0.6, 3))
    assert tokens_per_step_uniform(1.0, 3) == 4.0
    assert tokens_per_step([0.8, 0.5, 0.25]) == pytest.approx(1 + 0.8 + 0.4 + 0.1)


def test_estimate_uses_the_first_k_positions_and_says_when_it_is_slower() -> None:
    good = estimate([0.7, 0.6, 0.5, 0.4], 3, PCIE_COST)
    assert good.tokens_per_step == pytest.approx(1 + 0.7 + 0.42 + 0.21)
    assert "faster" in good.describe() and good.speedup > 1
    bad = estimate([0.1], 5, 0.4)
    assert bad.speedup < 1 and "SLOWER than no speculation" in bad.describe()

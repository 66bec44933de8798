"""`kimideploy calibrate show`: break-even acceptance per k and concurrency, the best k, and
where speculation cannot pay; `-o png` plots speedup against acceptance length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kimideploy.errors import UsageError
from kimideploy.plan.calibration import (
    Calibration,
    CostModel,
    MeasuredCost,
    best_k,
    break_even_length,
    speedup,
)

DEFAULT_PER_TOKEN = (0.6, 0.7, 0.8)
"""Per-token acceptance rates the best-k column is shown for (Kimi EAGLE-3 drafters measure
0.15 to 0.8)."""


def rows(calibration: Calibration, per_token: tuple[float, ...]) -> list[dict[str, Any]]:
    costs = MeasuredCost(calibration)
    fitted = {(s.k, s.concurrency): s for s in calibration.costs}
    out = []
    for c in costs.measured_concurrency():
        row: dict[str, Any] = {"concurrency": c}
        for k in calibration.ks:
            fit = fitted.get((k, c))
            row[f"break-even k={k}"] = round(break_even_length(costs, k, c), 2) if fit else None
        row["cost/draft token"] = round(costs.per_token(c), 4)
        row["fit residual"] = max(
            (s.residual for (_, cc), s in fitted.items() if cc == c), default=None
        )
        for rate in per_token:
            k, value = best_k(costs, rate, c, calibration.ks)
            row[f"best k @a={rate}"] = f"k={k} {value:.2f}x" if value > 1 else "none pays"
        out.append(row)
    return out


def prior_rows(
    costs: CostModel, ks: tuple[int, ...], levels: list[int], per_token: tuple[float, ...]
) -> list[dict[str, Any]]:
    """The same table from a cost model nothing measured (the prior the plan uses until `run
    calibrate`): break-even acceptance length per k and concurrency, and the best k."""
    out = []
    for c in levels:
        row: dict[str, Any] = {"concurrency": c}
        for k in ks:
            row[f"break-even k={k}"] = round(break_even_length(costs, k, c), 2)
        row["cost/draft token"] = round((costs.cost(1, c) - 1), 4)
        for rate in per_token:
            k, value = best_k(costs, rate, c, list(ks))
            row[f"best k @a={rate}"] = f"k={k} {value:.2f}x" if value > 1 else "none pays"
        out.append(row)
    return out


def cannot_pay(calibration: Calibration) -> list[str]:
    """Per concurrency, the acceptance length below which no measured k pays; then the same for
    the upper half of the measured concurrencies taken together (where a drafter must be best)."""
    costs = MeasuredCost(calibration)
    levels = costs.measured_concurrency()
    bounds = {c: min(break_even_length(costs, k, c) for k in calibration.ks) for c in levels}
    lines = [f"at c={c} no k pays below acceptance length {v:.2f}" for c, v in bounds.items()]
    if len(levels) > 1:
        start = levels[len(levels) // 2]
        lower = min(bounds[c] for c in levels if c >= start)
        lines.append(f"at c >= {start} no k pays below acceptance length {lower:.2f}")
    return lines


def header(calibration_id: str, calibration: Calibration) -> str:
    state = "complete" if calibration.complete else "partial (`run calibrate` resumes it)"
    return (
        f"calibration {calibration_id} of cluster {calibration.cluster}, measured "
        f"{calibration.measured_at} on {calibration.image} ({calibration.gpus}; drafter "
        f"{calibration.drafter}; k={calibration.ks}, acceptance lengths {calibration.lengths}; "
        f"baseline run {calibration.baseline_run}; {state})"
    )


def write_png(calibration: Calibration, output: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UsageError(
            "-o png needs matplotlib", hint="pip install -e '.[report]' installs it"
        ) from exc
    costs = MeasuredCost(calibration)
    levels = costs.measured_concurrency()
    figure, axes = plt.subplots(1, len(levels), figsize=(4.2 * len(levels), 3.8), squeeze=False)
    for axis, c in zip(axes[0], levels, strict=True):
        for k in calibration.ks:
            xs = [1 + i * k / 20 for i in range(21)]
            axis.plot(xs, [speedup(costs, k, x, c) for x in xs], label=f"k={k}")
            measured = [p for p in calibration.points if p.k == k and p.concurrency == c]
            axis.scatter([p.length for p in measured], [p.speedup for p in measured], s=12)
        axis.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        axis.set_title(f"c={c}")
        axis.set_xlabel("acceptance length")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("speedup over no speculation")
    axes[0][-1].legend(fontsize=8)
    figure.suptitle(
        f"{calibration.cluster}: measured {calibration.date} on {calibration.image}", fontsize=9
    )
    figure.tight_layout()
    figure.savefig(output, dpi=110)
    plt.close(figure)

"""What `run train` ends with: the drafter's held-out acceptance per k, against what it needs to
pay on each cluster that could serve it (the measured step cost where a calibration applies, else
the cluster's constant, saying which). This is the figure that would have stopped the 15% drafter
before a 25-minute load."""

from __future__ import annotations

from typing import Any

from kimideploy.config.loading import LoadedProject
from kimideploy.plan import calibration
from kimideploy.plan.resolve import serve_cost_model


def held_out_lines(
    loaded: LoadedProject,
    drafter: str,
    result: dict[str, Any],
    calibrations: dict[str, tuple[Any, ...]],
) -> list[str]:
    """Lines for the terminal; `calibrations` holds each cluster's calibrations (read from the
    cluster this run used, the local copies for the others)."""
    judged = result.get("held_out")
    selected = result.get("selected") or {}
    if not isinstance(judged, dict) or not judged.get("mean_acceptance_length"):
        return [
            f"drafter {drafter}: no held-out judgement ({selected.get('reason', 'none recorded')});"
            " set train.held_out_fraction > 0 to know its acceptance before serving"
        ]
    lengths = {int(k): float(v) for k, v in judged["mean_acceptance_length"].items()}
    spreads = {
        int(n): one["ci95"]
        for n, one in (judged.get("by_k") or {}).items()
        if isinstance(one, dict) and one.get("ci95")
    }
    k = int(result.get("num_speculative_tokens") or max(lengths))
    shown = ", ".join(
        f"k={n} {v:.2f}" + (f" [{spreads[n][0]:.2f}-{spreads[n][1]:.2f}]" if n in spreads else "")
        for n, v in sorted(lengths.items())
    )
    turns = f", {judged['turns']} turns" if judged.get("turns") else ""
    lines = [
        f"held-out mean acceptance length of {drafter} ({judged.get('samples')} samples never "
        f"trained on{turns}{'; [95% interval]' if spreads else ''}): {shown}",
        "  these stand for conversations like the training data's; on other prompts "
        f"`kimideploy drafter check {drafter} --replay FILE` predicts",
        f"written: {selected.get('reason', 'step ' + str(selected.get('step')))}",
    ]
    length = lengths.get(k)
    if length is None:
        return lines
    low, high = spreads.get(k, (length, length))
    for cluster in sorted(loaded.project.clusters):
        costs, source, level = serve_cost_model(loaded, cluster, calibrations.get(cluster, ()))
        even = calibration.break_even_length(costs, k, level)
        verdict = (
            "pays" if low > even else "does NOT pay" if high < even else "may not pay (straddles)"
        )
        lines.append(
            f"  {cluster}: break-even acceptance length {even:.2f} at k={k}, c={level} -> "
            f"{verdict} ({length:.2f}); step cost: {source}"
        )
    return lines

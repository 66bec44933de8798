"""Which acceptance a prediction rests on, and how each figure is labelled where users decide.

Three kinds of evidence, most trusted first:
- measured: `drafters.<d>.acceptance`, per-position acceptance measured by serving (bench, gate);
- held-out: `drafters.<d>.held_out` (or the drafter's own kimideploy-lineage.json), what its
  training run measured on conversations it never trained on, counted as vLLM counts;
- published: `drafters.<d>.published`, what the drafter's publisher reported (a prior, on other
  prompts and often another stack), usable only at the k it was measured at.
Predictions (`up --dry-run`, `drafter check`, the refusal in `up`, `run train`'s summary) take the
first that exists; `drafter list` and `drafter check` show every one, each with its label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kimideploy.config.drafters import Drafter, HeldOutAcceptance, ModelFreeMethod
from kimideploy.plan.speedup import rates_at_k, tokens_per_step

Source = Literal["measured", "held-out", "published"]


@dataclass(frozen=True)
class Evidence:
    source: Source
    length: float
    """Mean acceptance length at the k asked for."""
    per_position: tuple[float, ...] | None
    """Conditional acceptance per position, when known (lets other k be predicted)."""
    note: str
    interval: tuple[float, float] | None = None
    """A 95% interval of `length` (held-out: a bootstrap over the judged turns), when known."""

    def label(self) -> str:
        """How the figure is shown everywhere: what it is, the length, where it comes from."""
        if self.source == "measured":
            return f"measured mean acceptance length {self.length:.2f} ({self.note})"
        if self.source == "held-out":
            spread = f", 95% {self.interval[0]:.2f}-{self.interval[1]:.2f}" if self.interval else ""
            return f"held-out mean acceptance length {self.length:.2f}{spread} ({self.note})"
        return f"prior: published mean acceptance length {self.length:.2f}, {self.note}"


def held_out_length(held_out: HeldOutAcceptance, k: int) -> float | None:
    if k in held_out.mean_acceptance_length:
        return held_out.mean_acceptance_length[k]
    if held_out.acceptance_per_position:
        return tokens_per_step(rates_at_k(list(held_out.acceptance_per_position), k))
    return None


def all_evidence(
    drafter: Drafter | ModelFreeMethod, k: int, held_out: HeldOutAcceptance | None = None
) -> list[Evidence]:
    """Every kind of evidence there is for this drafter at k, most trusted first. `held_out`
    (from a lineage file) stands in for the registry's when the registry has none. A model-free
    method has only what serving measured: nothing predicts it before a bench."""
    found = []
    if drafter.acceptance:
        rates = tuple(drafter.acceptance)
        length = tokens_per_step(rates_at_k(list(rates), k))
        found.append(Evidence("measured", length, rates, f"served; per position {list(rates)}"))
    if not isinstance(drafter, Drafter):
        return found
    judged = drafter.held_out or held_out
    if judged is not None:
        length_at = held_out_length(judged, k)
        if length_at is not None:
            where = f"run {judged.run}, " if judged.run else ""
            step = f", step {judged.step}" if judged.step is not None else ""
            judged_rates = tuple(judged.acceptance_per_position) or None
            turns = f", {judged.turns} turns" if judged.turns else ""
            note = f"training {where}{judged.samples} samples never trained on{turns}{step}"
            spread = judged.ci95.get(k)
            found.append(
                Evidence(
                    "held-out",
                    length_at,
                    judged_rates,
                    note,
                    (spread[0], spread[1]) if spread else None,
                )
            )
    published = drafter.published
    if published is not None and published.num_speculative_tokens == k:
        note = f"{published.source}; not measured here"
        found.append(Evidence("published", published.mean_length, None, note))
    return found


def evidence(
    drafter: Drafter | ModelFreeMethod, k: int, held_out: HeldOutAcceptance | None = None
) -> Evidence | None:
    found = all_evidence(drafter, k, held_out)
    return found[0] if found else None

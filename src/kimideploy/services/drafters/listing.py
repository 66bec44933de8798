"""Drafter registry views."""

from __future__ import annotations

from typing import Any

from kimideploy.config.drafters import Drafter, to_vllm_layer_ids
from kimideploy.config.project import Project
from kimideploy.plan.acceptance import held_out_length
from kimideploy.plan.speedup import rates_at_k, tokens_per_step


def drafter_rows(project: Project) -> list[dict[str, Any]]:
    """One row per drafter, with layer ids shown as written and as vLLM will read them."""
    rows = []
    for name, d in sorted(project.drafters.items()):
        if d.source.hub:
            source = f"hub:{d.source.hub.repo}@{d.source.hub.revision[:8]}"
        elif d.source.oci:
            source = f"oci:{d.source.oci.repository}@{d.source.oci.digest[:19]}"
        else:
            source = f"volume:{d.source.path}"
        rows.append(
            {
                "name": name,
                "method": d.method,
                "source": source,
                "tokens": d.num_speculative_tokens,
                "layer_ids": d.aux_layer_ids,
                "convention": d.layer_id_convention,
                "vllm_ids": to_vllm_layer_ids(d.aux_layer_ids, d.layer_id_convention),
                "draft_vocab": d.draft_vocab_size,
                "trained_for": d.lineage.trained_for,
                "variant": d.lineage.trained_for_variant or "default",
                # The publisher's figure is a prior; training's held-out judgement comes next;
                # what serving measured wins (plan/acceptance.py orders them for predictions).
                "prior_length": _prior(d),
                "held_out_length": _held_out(d),
                "measured_length": _measured(d),
                "status": d.status,
            }
        )
    return rows


def _prior(drafter: Drafter) -> str | None:
    published = drafter.published
    if published is None:
        return None
    values = published.mean_acceptance_length.values()
    spread = f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else f"{min(values):.2f}"
    return f"{spread} @k={published.num_speculative_tokens} (published)"


def _held_out(drafter: Drafter) -> str | None:
    judged = drafter.held_out
    if judged is None:
        return None
    k = drafter.num_speculative_tokens
    length = held_out_length(judged, k)
    run = f", run {judged.run}" if judged.run else ""
    return None if length is None else f"{length:.2f} @k={k} (held-out{run})"


def _measured(drafter: Drafter) -> str | None:
    if not drafter.acceptance:
        return None
    k = drafter.num_speculative_tokens
    return f"{tokens_per_step(rates_at_k(list(drafter.acceptance), k)):.2f} @k={k}"

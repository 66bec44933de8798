"""Drafter registry views."""

from __future__ import annotations

from typing import Any

from kimideploy.config.drafters import Drafter, ModelFreeMethod, NgramMethod, to_vllm_layer_ids
from kimideploy.config.project import Project
from kimideploy.plan.acceptance import held_out_length
from kimideploy.plan.speedup import rates_at_k, tokens_per_step


def drafter_rows(project: Project) -> list[dict[str, Any]]:
    """One row per registry entry: EAGLE-3 drafters with layer ids shown as written and as vLLM
    will read them; model-free methods with their own settings in place of a source."""
    rows = []
    for name, d in sorted(project.drafters.items()):
        row = _drafter_row(d) if isinstance(d, Drafter) else _method_row(d)
        rows.append({"name": name, "method": d.method, **row, "status": d.status})
    return rows


def _drafter_row(d: Drafter) -> dict[str, Any]:
    if d.source.hub:
        source = f"hub:{d.source.hub.repo}@{d.source.hub.revision[:8]}"
    elif d.source.oci:
        source = f"oci:{d.source.oci.repository}@{d.source.oci.digest[:19]}"
    else:
        source = f"volume:{d.source.path}"
    return {
        "source": source if d.decoder == "llama" else f"{source} ({d.decoder})",
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
        "measured_length": _measured(d.acceptance, d.num_speculative_tokens),
    }


def _method_row(d: ModelFreeMethod) -> dict[str, Any]:
    if isinstance(d, NgramMethod):
        settings = f"n-gram {d.prompt_lookup_min}..{d.prompt_lookup_max}"
    else:
        settings = f"suffix tree depth {d.max_tree_depth}, {d.max_cached_requests} responses"
    return {
        "source": f"model-free ({settings})",
        "tokens": d.num_speculative_tokens,
        "layer_ids": None,
        "convention": None,
        "vllm_ids": None,
        "draft_vocab": None,
        "trained_for": None,
        "variant": None,
        "prior_length": None,
        "held_out_length": None,
        "measured_length": _measured(d.acceptance, d.num_speculative_tokens),
    }


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
    spread = judged.ci95.get(k)
    within = f" [95% {spread[0]:.2f}-{spread[1]:.2f}, {judged.turns} turns]" if spread else ""
    return None if length is None else f"{length:.2f}{within} @k={k} (held-out{run})"


def _measured(acceptance: list[float], k: int) -> str | None:
    if not acceptance:
        return None
    return f"{tokens_per_step(rates_at_k(list(acceptance), k)):.2f} @k={k}"

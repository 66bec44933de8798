"""Drafter registry views."""

from __future__ import annotations

from typing import Any

from kimideploy.config.drafters import to_vllm_layer_ids
from kimideploy.config.project import Project


def drafter_rows(project: Project) -> list[dict[str, Any]]:
    """One row per drafter, with layer ids shown as written and as vLLM will read them."""
    rows = []
    for name, d in sorted(project.drafters.items()):
        source = (
            f"hub:{d.source.hub.repo}@{d.source.hub.revision[:8]}"
            if d.source.hub
            else f"volume:{d.source.path}"
        )
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
                "status": d.status,
            }
        )
    return rows

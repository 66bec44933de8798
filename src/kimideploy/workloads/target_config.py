"""Does the target checkpoint on the volume match what the spec says about it? Checked from its
config.json in a millisecond, before an engine loads (25 minutes for the real target).

A checkpoint with fewer layers than the config declares makes vLLM's extraction die deep inside
the engine with a tensor-shape error, because the final-layer id `num_hidden_layers` names a layer
that does not exist; a different hidden size makes every stored feature the wrong width.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kimideploy.config.specs import TargetRef
from kimideploy.workloads.runtime import BadInputError


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """A multimodal wrapper (Kimi-K2.5) keeps the decoder's sizes in its text_config."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def check(target: TargetRef) -> None:
    path = Path(target.path) / "config.json"
    try:
        config = text_config(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise BadInputError(f"cannot read the target's {path}: {exc}") from exc
    wrong = [
        f"{key} is {config.get(key)}, the spec says {wanted}"
        for key, wanted in (
            ("num_hidden_layers", target.num_hidden_layers),
            ("hidden_size", target.hidden_size),
        )
        if config.get(key) != wanted
    ]
    if wrong:
        raise BadInputError(
            f"the target checkpoint {path} does not match the config: {'; '.join(wrong)}; fix "
            f"model.num_hidden_layers / model.hidden_size in kimideploy.yaml or sync "
            f"{target.repo}@{target.revision[:12]}"
        )

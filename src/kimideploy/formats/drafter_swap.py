"""Which drafter may replace the one a running vLLM serves, by its files alone.

A swap writes new values into the draft model vLLM built at start-up; it cannot rebuild it. vLLM
built that model from the running drafter's config.json (layers, widths, the draft vocabulary,
the target layers whose hidden states it captures for the drafter: eagle_aux_hidden_state_layer_ids)
and sized every parameter from it; its `load_weights` writes each tensor of the checkpoint into
the parameter of the same name, and a drafter that carries no embedding or LM head shares the
target's. So a candidate may replace the running drafter exactly when

- its config.json is the running one's, key for key, except the keys that record where or with
  what a file was written (NEUTRAL_CONFIG_KEYS): every other key either sizes a parameter, names
  the captured layers or changes how vLLM computes the draft; and
- its safetensors hold the same tensor names with the same dtype and shape: a tensor the running
  drafter did not have would be written into whatever vLLM maps the name to (an embedding shared
  with the target included), and one it lacks would keep the running drafter's values.

What the weights are trained for (target, chat template, layer convention) is not in this rule:
`drafter check` judges that from the lineage before kimideploy asks for a swap, as for a rollout.
Both vLLM's side (workloads/drafter_swap_engine.py, before any weight is touched) and kimideploy's
plan read this one rule.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kimideploy.formats.safetensors_files import read_headers

DRAFTER_FILES_BACKEND = "kimideploy-drafter-files"
"""kimideploy's weight-transfer backend (workloads/drafter_swap_engine.py), as the serve args
name it in `--weight-transfer-config`."""
DEV_ROUTES_GUARD = "kimideploy.workloads.drafter_swap.DevRoutesGuard"
"""The `--middleware` that keeps vLLM's development routes to the pod itself."""
DRAFTER_KEEPER = "kimideploy.workloads.drafter_swap.DrafterKeeper"
"""The `--middleware` that keeps the served drafter the one the release's spec names."""
KEEPER_PATH = "/kimideploy/drafter"
"""Where the keeper answers what it serves (read-only; kimideploy reads it through the API
server's pod proxy, as `watch` reads /metrics)."""
STARTED_WITH_ENV = "KIMIDEPLOY_DRAFTER_STARTED_WITH"
"""The serve container's variable naming the drafter version its `--speculative-config` loads:
vLLM answers "default" for it until the first swap."""
WANTED_SPEC_ENV = "KIMIDEPLOY_WANTED_DRAFTER_SPEC"
"""The serve container's variable naming the mounted spec.json whose drafter the keeper serves."""
SWAP_REFUSED = "cannot replace the running drafter"
"""How the engine's answer begins when the rule below refuses a candidate (nothing was written)."""


def drafter_version(drafter: str) -> str:
    """The label a served drafter carries (vLLM's weight_version after a swap): its registry name.
    A name that comes to mean other files changes the `--speculative-config` model path, which
    makes the revision a rollout (services/release/swap.py), never a silent no-op."""
    return drafter


NEUTRAL_CONFIG_KEYS = (
    ("_name_or_path",),
    ("transformers_version",),
    ("speculators_version",),
    ("speculators_config", "verifier", "name_or_path"),
)
"""Where or with which library version the files were written: a path on the machine that trained
the drafter, not what vLLM builds. The target a drafter was trained for is the lineage's word."""


def _without_neutral_keys(config: dict[str, Any]) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(config))
    for path in NEUTRAL_CONFIG_KEYS:
        node: Any = copy
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return copy


def _config_differences(running: Any, candidate: Any, where: str = "") -> list[str]:
    if isinstance(running, dict) and isinstance(candidate, dict):
        out: list[str] = []
        for key in sorted(set(running) | set(candidate)):
            path = f"{where}.{key}" if where else key
            if key not in candidate:
                out.append(f"config.json {path}: the running drafter has it, the candidate not")
            elif key not in running:
                out.append(f"config.json {path}: the candidate has it, the running drafter not")
            else:
                out.extend(_config_differences(running[key], candidate[key], path))
        return out
    if running != candidate:
        return [
            f"config.json {where}: running {json.dumps(running)}, candidate {json.dumps(candidate)}"
        ]
    return []


def _read_config(folder: Path) -> dict[str, Any]:
    try:
        config: dict[str, Any] = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{folder / 'config.json'}: cannot be read ({exc})") from exc
    return config


def _tensor_differences(running: dict[str, Any], candidate: dict[str, Any]) -> list[str]:
    out = [
        f"tensor {name}: only the running drafter has it"
        for name in sorted(set(running) - set(candidate))
    ]
    out += [
        f"tensor {name}: only the candidate has it"
        for name in sorted(set(candidate) - set(running))
    ]
    for name in sorted(set(running) & set(candidate)):
        was = (running[name].get("dtype"), running[name].get("shape"))
        now = (candidate[name].get("dtype"), candidate[name].get("shape"))
        if was != now:
            out.append(f"tensor {name}: running {was[0]} {was[1]}, candidate {now[0]} {now[1]}")
    return out


def swap_refusals(running: Path, candidate: Path) -> list[str]:
    """Why `candidate`'s files cannot replace `running`'s in a live vLLM (empty: they can)."""
    try:
        was, now = _read_config(running), _read_config(candidate)
    except ValueError as exc:
        return [str(exc)]
    reasons = _config_differences(_without_neutral_keys(was), _without_neutral_keys(now))
    running_tensors, running_broken = read_headers(running)
    candidate_tensors, candidate_broken = read_headers(candidate)
    reasons += [f"{running}: {problem}" for problem in running_broken]
    reasons += [f"{candidate}: {problem}" for problem in candidate_broken]
    if not candidate_tensors and not candidate_broken:
        reasons.append(f"{candidate}: no safetensors file")
    reasons += _tensor_differences(running_tensors, candidate_tensors)
    return reasons

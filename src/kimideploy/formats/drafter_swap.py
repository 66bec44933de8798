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

A swapped-in drafter passes no init container, so the engine's read of the candidate is its only
check, made between two scheduler steps of a serving engine: `hold_drafter` reads the folder once,
as untrusted input (regular files only, through the folder's own descriptor, no link followed, no
FIFO waited on, bounded sizes), and the judgement, the sha256 check and the load all use those
bytes. A file replaced on the volume during the swap changes nothing that is loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimideploy.formats.bounded_io import (
    JSON_LIMIT,
    UnreadableFileError,
    open_folder,
    parse_json_object,
    read_bytes,
)
from kimideploy.formats.safetensors_files import checked_header

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
SPECULATION_PATH = "/kimideploy/speculation"
"""Where the keeper switches speculation off and on in its own server (POST `?enabled=false` or
`true`; GET reports), only from the pod itself with its token, as the development routes."""
SPECULATION_SWITCH_ENV = "KIMIDEPLOY_SPECULATION_SWITCH"
"""Set to 1 on a serve container whose vLLM carries patch 0002 (the speculation switch): the
patched vLLM then captures the k = 0 decode graphs at start-up too."""
SPECULATION_SWITCH_PATCH = "0002-speculation-switch.patch"
"""The vLLM 0.32 patch that gives the engine its switch (docker/patches/vllm-0.32.0)."""
SPEC_SPECULATION_KEY = "speculation"
"""The serve spec's key for whether the keeper keeps speculation on (absent: on)."""
SPEC_SHA256_KEY = "drafter_sha256"
"""The serve spec's key for the wanted drafter's files by sha256 (config/specs.ServeSpec)."""
DRAFTERS_ROOT_ENV = "KIMIDEPLOY_DRAFTERS_ROOT"
"""The serve container's variable naming the one folder (the models mount) whose drafters the
keeper may swap in: a spec naming any other folder is refused."""


def folder_id(folder: str, models_mount: str) -> str:
    """A drafter folder as the keeper's public answer names it: its path inside the models mount
    (the same on every node, whatever the mount's own path), hashed: comparable with the
    release's drafter path (services/release/swap.py), not readable as a path. A folder outside
    the mount is named whole (it was refused anyway)."""
    root = models_mount.rstrip("/") + "/"
    inside = folder[len(root) :] if folder.startswith(root) else folder
    return hashlib.sha256(inside.encode()).hexdigest()[:16]


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


GIB = 1024**3
DRAFTER_BYTES_LIMIT = 16 * GIB
"""All of a candidate's safetensors together: an EAGLE-3 drafter for a 7168-wide target is 1-5 GB
(with its own copy of the 163,840-token embedding); a planted larger file is not read."""


@dataclass
class HeldDrafter:
    """A drafter folder read once into memory: its config, each safetensors file's bytes and
    header, and what was wrong with any of them (`problems`: the folder is refused)."""

    folder: Path
    config: dict[str, Any] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, tuple[dict[str, Any], int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def tensors(self) -> dict[str, Any]:
        """Tensor name -> {dtype, shape, data_offsets} across the files."""
        out: dict[str, Any] = {}
        for header, _ in self.headers.values():
            out.update({k: v for k, v in header.items() if k != "__metadata__"})
        return out

    def tensor_digest(self, name: str) -> str | None:
        """sha256 of one tensor's bytes (and its dtype and shape), or None where it has none."""
        for file, (header, base) in self.headers.items():
            info = header.get(name)
            if name != "__metadata__" and isinstance(info, dict):
                start, stop = (int(v) for v in info["data_offsets"])
                digest = hashlib.sha256(json.dumps([info["dtype"], info["shape"]]).encode())
                digest.update(memoryview(self.files[file])[base + start : base + stop])
                return digest.hexdigest()
        return None

    def sha256s(self) -> dict[str, str]:
        """File name -> sha256, for config.json (as read) and each safetensors file."""
        return {name: hashlib.sha256(data).hexdigest() for name, data in self.files.items()}


def hold_drafter(folder: Path, limit: int = DRAFTER_BYTES_LIMIT) -> HeldDrafter:
    """`folder`'s config.json and safetensors, read once through the folder's descriptor. Never
    raises for what is in the folder: every problem is in `problems`."""
    held = HeldDrafter(folder)
    try:
        dir_fd = open_folder(folder)
    except UnreadableFileError as exc:
        held.problems.append(str(exc))
        return held
    try:
        names = sorted(os.listdir(dir_fd))  # noqa: PTH208 (the open folder's descriptor)
        try:
            raw = read_bytes(Path("config.json"), JSON_LIMIT, dir_fd=dir_fd)
            held.files["config.json"] = raw
            held.config = parse_json_object(raw, str(folder / "config.json"))
        except UnreadableFileError as exc:
            held.problems.append(_named(exc, folder))
        left = limit
        for name in (n for n in names if n.endswith(".safetensors")):
            try:
                data = read_bytes(Path(name), left, dir_fd=dir_fd)
                held.headers[name] = checked_header(data, str(folder / name))
            except UnreadableFileError as exc:
                held.problems.append(_named(exc, folder))
                continue
            held.files[name] = data
            left -= len(data)
    finally:
        os.close(dir_fd)
    if not held.headers and not held.problems:
        held.problems.append(f"{folder}: no safetensors file")
    return held


def _named(exc: UnreadableFileError, folder: Path) -> str:
    """The reader names files relative to the folder's descriptor; say which folder."""
    text = str(exc)
    return text if text.startswith(str(folder)) else f"{folder}/{text}"


def sha256_mismatches(held: HeldDrafter, expected: dict[str, str]) -> list[str]:
    """Where the held files differ from the sha256s a release recorded for them."""
    found = held.sha256s()
    out = []
    for name, digest in sorted(expected.items()):
        if name not in found:
            out.append(f"{held.folder / name}: missing (the release lists it)")
        elif found[name] != digest:
            out.append(
                f"{held.folder / name}: sha256 {found[name][:12]}..., the release recorded "
                f"{digest[:12]}..."
            )
    return out


def swap_refusals(running: HeldDrafter, candidate: HeldDrafter) -> list[str]:
    """Why `candidate`'s files cannot replace `running`'s in a live vLLM (empty: they can)."""
    if candidate.problems or running.problems:
        return [*running.problems, *candidate.problems]
    reasons = _config_differences(
        _without_neutral_keys(running.config), _without_neutral_keys(candidate.config)
    )
    return reasons + _tensor_differences(running.tensors(), candidate.tensors())


def shared_refusals(running: HeldDrafter, candidate: HeldDrafter, shared: set[str]) -> list[str]:
    """The candidate's tensors whose parameter vLLM shares with the target (`shared`, by name)
    and whose values differ from the running drafter's: writing one would change the target's
    outputs, and skipping it would serve values the candidate does not have."""
    return [
        f"tensor {name}: its parameter is the target's own (vLLM shares it with the drafter), and "
        "the candidate's values differ from the running drafter's; writing it would change the "
        "target's outputs. Restart to serve this drafter (`--no-swap`)"
        for name in sorted(shared)
        if candidate.tensor_digest(name) != running.tensor_digest(name)
    ]

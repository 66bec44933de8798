"""`kimideploy data inspect PATH`: a dataset's manifest, counts, convention, storage, and checks.

Validation reads files without torch: every JSON line of a conversation chunk, every safetensors
header (its declared tensors must fit the file exactly), so a truncated or corrupt file is named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimideploy.errors import UsageError
from kimideploy.safetensors_files import safetensors_problem


@dataclass
class Inspection:
    path: Path
    kind: str
    manifests: list[dict[str, Any]] = field(default_factory=list)
    files: int = 0
    samples: int = 0
    tokens: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)


def inspect(path: Path) -> Inspection:
    if not path.exists():
        raise UsageError(
            f"{path}: no such dataset", hint="pass a datagen output or extraction folder"
        )
    chunks = sorted(path.rglob("chunk-*.jsonl"))
    tensors = sorted(path.rglob("*.safetensors"))
    result = Inspection(
        path, "hidden states" if tensors else "conversations" if chunks else "unknown"
    )
    for manifest in sorted(path.rglob("manifest.json")):
        result.manifests.append(json.loads(manifest.read_text()))
    for chunk in chunks:
        result.files += 1
        result.bytes += chunk.stat().st_size
        for number, line in enumerate(
            chunk.read_text(encoding="utf-8", errors="replace").splitlines(), 1
        ):
            try:
                json.loads(line)
                result.samples += 1
            except ValueError:
                result.problems.append(
                    f"{chunk}:{number}: not a complete JSON line (truncated write?)"
                )
    for tensor in tensors:
        result.files += 1
        result.bytes += tensor.stat().st_size
        problem, tokens = safetensors_problem(tensor)
        if problem:
            result.problems.append(f"{tensor}: {problem}")
        else:
            result.samples += 1
            result.tokens += tokens
    return result


def summary(result: Inspection) -> dict[str, Any]:
    first = result.manifests[0] if result.manifests else {}
    return {
        "path": str(result.path),
        "kind": result.kind,
        "files": result.files,
        "samples": result.samples,
        "tokens": result.tokens or None,
        "bytes": result.bytes,
        "bytes_per_token": round(result.bytes / result.tokens, 1) if result.tokens else None,
        "layer_ids": first.get("layer_ids"),
        "convention": first.get("convention"),
        "vllm_layer_ids": first.get("vllm_layer_ids"),
        "dtype": first.get("dtype"),
        "model_revision": (first.get("model") or {}).get("revision"),
        "manifests": len(result.manifests),
        "problems": result.problems,
    }

"""`kimideploy data inspect PATH`: a dataset's manifest, counts, convention, storage, and checks.

Validation reads files without torch: every JSON line of a conversation chunk, every safetensors
header (its declared tensors must fit the file exactly), so a truncated or corrupt file is named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimideploy.config.fingerprints import FINGERPRINT_FILE, flatten
from kimideploy.errors import UsageError
from kimideploy.formats import chat_template
from kimideploy.formats.bounded_io import (
    CHUNK_LIMIT,
    UnreadableFileError,
    json_lines,
    read_json_object,
)
from kimideploy.formats.safetensors_files import read_header, read_integers, safetensors_problem


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
    fingerprint: dict[str, Any] = field(default_factory=dict)


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
        try:
            result.manifests.append(read_json_object(manifest))
        except UnreadableFileError as exc:
            result.problems.append(str(exc))
    record = path / FINGERPRINT_FILE
    if record.exists() or record.is_symlink():
        try:
            result.fingerprint = read_json_object(record)
        except UnreadableFileError as exc:
            result.problems.append(str(exc))
    for chunk in chunks:
        result.files += 1
        try:
            for line in json_lines(chunk, CHUNK_LIMIT):
                if line.problem is None:
                    result.samples += 1
                else:
                    result.problems.append(f"{chunk}:{line.number}: {line.problem}")
            result.bytes += chunk.lstat().st_size
        except UnreadableFileError as exc:
            result.problems.append(str(exc))
    for tensor in tensors:
        result.files += 1
        result.bytes += tensor.lstat().st_size
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
        "fingerprint": result.fingerprint.get("id")
        or "none (written before fingerprints: its inputs are unknown)",
        "made from": ", ".join(
            f"{k}={json.dumps(v)}"
            for k, v in flatten(
                {**result.fingerprint.get("fields", {}), **result.fingerprint.get("observed", {})}
            ).items()
        )
        or None,
        "problems": result.problems,
    }


TRAINED_OPEN, TRAINED_CLOSE = "[[trained]]", "[[/trained]]"
"""Around the tokens the loss covers, in a sample printed by `data inspect --sample`."""


def _marked(tokenizer: Any, ids: list[int], mask: list[int]) -> str:
    """The text of the tokens, with each run of trained tokens between the markers."""
    pieces, start = [], 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or mask[end] != mask[start]:
            text = tokenizer.decode(ids[start:end], skip_special_tokens=False)
            pieces.append(f"{TRAINED_OPEN}{text}{TRAINED_CLOSE}" if mask[start] else text)
            start = end
    return "".join(pieces)


def sample_view(path: Path, number: int, model: Path | None) -> dict[str, Any]:
    """Sample `number` (from 0) as the target sees it: text with the trained span marked (needs
    the model's tokenizer and template: `model`), token counts, and for features the layers
    stored. The same renderer as the pods (workloads/chat_template.py)."""
    try:
        return _sample_view(path, number, model)
    except UnreadableFileError as exc:
        raise UsageError(
            str(exc), hint="`kimideploy data inspect PATH` lists every problem"
        ) from exc


def _sample_view(path: Path, number: int, model: Path | None) -> dict[str, Any]:
    result = inspect(path)
    tensors = sorted(path.rglob("*.safetensors"))
    if result.kind == "hidden states":
        if not 0 <= number < len(tensors):
            raise UsageError(f"--sample {number}: {path} has {len(tensors)} samples (0-based)")
        file = tensors[number]
        ids, mask = read_integers(file, "input_ids"), read_integers(file, "loss_mask")
        header, _ = read_header(file)
        manifest = next(
            (m for m in result.manifests if f"shard-{m.get('shard', 0):05d}" == file.parent.name),
            {},
        )
        layers = header.get("aux_hidden_states", {}).get("shape", [0])[0]
        view: dict[str, Any] = {
            "sample": f"{number} of {len(tensors)} ({file.stem})",
            "layers stored": f"{layers} at {manifest.get('layer_ids')} "
            f"({manifest.get('convention')} convention; vLLM ids "
            f"{manifest.get('vllm_layer_ids')}), and the final layer (pre-norm)",
        }
    elif result.kind == "conversations":
        samples = _conversation_samples(path)
        if not 0 <= number < len(samples):
            raise UsageError(f"--sample {number}: {path} has {len(samples)} samples (0-based)")
        if model is None:
            raise UsageError(
                "--sample of a conversations folder renders it with the target's chat template",
                hint="pass --model DIR: the synced model revision (its tokenizer and template)",
            )
        tokenizer = chat_template.load_tokenizer(model)
        rendered = chat_template.render_sample(tokenizer, samples[number])
        ids, mask = rendered.ids, rendered.loss_mask
        view = {"sample": f"{number} of {len(samples)} ({samples[number]['id']})"}
    else:
        raise UsageError(f"{path}: neither a conversations nor a hidden-states folder")
    view["tokens"] = f"{len(ids)} ({sum(mask)} trained)"
    if model is not None:
        view["text"] = _marked(chat_template.load_tokenizer(model), ids, mask)
    else:
        view["token ids"] = " ".join(
            f"[{t}]" if m else str(t) for t, m in zip(ids, mask, strict=True)
        )
    return view


def _conversation_samples(path: Path) -> list[dict[str, Any]]:
    """Every readable sample; a cut or corrupt line is skipped (`data inspect` lists it)."""
    return [
        line.value
        for chunk in sorted(path.rglob("chunk-*.jsonl"))
        for line in json_lines(chunk, CHUNK_LIMIT)
        if line.problem is None and isinstance(line.value, dict)
    ]

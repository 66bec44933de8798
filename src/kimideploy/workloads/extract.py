"""extract: hidden states of the aux layers (in the declared convention) plus the final layer.

Reference path on transformers (tests, and checking the production path on a GPU): one forward
pass per sample with output_hidden_states. HF's hidden_states[k] is the residual stream entering
decoder layer k, so vLLM's id k reads hidden_states[k] and SGLang's id k (the output of layer k)
reads hidden_states[k + 1]. One safetensors file per sample, written atomically; a restarted shard
skips finished samples. Refuses to start when the volume cannot hold what is left to write.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from kimideploy.config.specs import ExtractSpec
from kimideploy.workloads.conversations import my_samples, tokenize_segments
from kimideploy.workloads.runtime import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    BadInputError,
    Progress,
    Stopper,
    atomic_write,
    emit,
    log,
    shard_index,
)

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def hidden_state_indexes(ids: list[int], convention: str) -> list[int]:
    """Positions in HF's hidden_states tuple for layer ids written in `convention`."""
    return list(ids) if convention == "vllm" else [k + 1 for k in ids]


def sample_file(out: Path, sample_id: str) -> Path:
    return out / f"{sample_id}.safetensors"


def run(spec: ExtractSpec) -> int:
    if spec.backend != "transformers":
        raise BadInputError(
            "extract backend 'vllm' is not part of this version; set "
            "clusters.<name>.workloads.extract.backend: transformers"
        )
    index = shard_index()
    samples = my_samples(Path(spec.conversations_dir), spec.shards, index)
    if not samples:
        raise BadInputError(
            f"{spec.conversations_dir}: no generated conversations for shard {index}"
        )
    out = Path(spec.output_dir) / f"shard-{index:05d}"
    out.mkdir(parents=True, exist_ok=True)
    todo = [s for s in samples if not sample_file(out, s["id"]).is_file()]
    _check_space(spec, out, len(todo) / len(samples))
    return _extract(spec, index, out, samples, todo)


def _check_space(spec: ExtractSpec, out: Path, remaining: float) -> None:
    needed = int(spec.expected_bytes / spec.shards * remaining)
    free = shutil.disk_usage(out).free
    if needed > free:
        raise BadInputError(
            f"{out}: {free / 1e9:,.1f} GB free but this shard still needs about "
            f"{needed / 1e9:,.1f} GB (samples x tokens x bytes per token); "
            "grow the hidden-states claim or use online training"
        )


def _extract(
    spec: ExtractSpec,
    index: int,
    out: Path,
    samples: list[dict[str, Any]],
    todo: list[dict[str, Any]],
) -> int:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, spec.dtype)
    tokenizer = AutoTokenizer.from_pretrained(spec.target.path)
    model = AutoModelForCausalLM.from_pretrained(spec.target.path, torch_dtype=dtype).eval()
    positions = hidden_state_indexes(spec.layers.ids, spec.layers.convention)
    stopper = Stopper()
    progress = Progress("extract", "tokens", 0)
    start, tokens, written = time.monotonic(), 0, 0
    log(f"shard {index}: {len(samples)} samples, {len(samples) - len(todo)} already extracted")
    for sample in todo:
        if stopper.stopping:
            return EXIT_INTERRUPTED
        ids, mask = tokenize_segments(tokenizer, sample["segments"])
        with torch.no_grad():
            states = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        tensors = {
            "input_ids": torch.tensor(ids, dtype=torch.int64),
            "loss_mask": torch.tensor(mask, dtype=torch.uint8),
            "aux_hidden_states": torch.stack([states[p][0] for p in positions])
            .to(dtype)
            .contiguous(),
            "last_hidden_state": states[-1][0].to(dtype).contiguous(),
        }
        tmp = out / f".{sample['id']}.tmp"
        save_file(
            tensors, str(tmp), metadata={"id": sample["id"], "convention": spec.layers.convention}
        )
        tmp.replace(sample_file(out, sample["id"]))
        tokens += len(ids)
        written += sample_file(out, sample["id"]).stat().st_size
        progress.total += len(ids)
        elapsed = max(time.monotonic() - start, 1e-6)
        progress.advance(len(ids), mb_per_s=round(written / 1e6 / elapsed, 3))
    return _finish(spec, index, out, samples, tokens, written, time.monotonic() - start)


def _finish(
    spec: ExtractSpec,
    index: int,
    out: Path,
    samples: list[dict[str, Any]],
    tokens: int,
    written: int,
    seconds: float,
) -> int:
    layers = len(spec.layers.ids) + 1
    minimum = layers * spec.target.hidden_size * DTYPE_BYTES[spec.dtype]
    tokenizer_file = Path(spec.target.path) / "tokenizer.json"
    manifest = {
        "kind": "kimideploy.hidden-states.v1",
        "shard": index,
        "shards": spec.shards,
        "samples": len(samples),
        "layer_ids": spec.layers.ids,
        "convention": spec.layers.convention,
        "vllm_layer_ids": spec.layers.vllm_ids,
        "final_layer": True,
        "dtype": spec.dtype,
        "hidden_size": spec.target.hidden_size,
        "bytes_per_token_minimum": minimum,
        "bytes_per_token": round(written / tokens, 1) if tokens else None,
        "model": {"repo": spec.target.repo, "revision": spec.target.revision},
        "tokenizer_sha256": hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()
        if tokenizer_file.is_file()
        else None,
        "backend": spec.backend,
    }
    atomic_write(out / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode())
    emit(
        {
            "event": "result",
            "stage": "extract",
            "shard": index,
            "samples": len(samples),
            "tokens": tokens,
            "tokens_per_s": round(tokens / max(seconds, 1e-6), 1),
            "mb_per_s": round(written / 1e6 / max(seconds, 1e-6), 2),
            "bytes_per_token": manifest["bytes_per_token"],
            "bytes_per_token_minimum": minimum,
        }
    )
    return EXIT_OK

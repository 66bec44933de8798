"""One extraction shard on disk, for both backends: atomic sample files, progress in tokens and
MB/s, the drain flag, and the manifest written at the end."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from kimideploy.config.specs import ExtractSpec
from kimideploy.workloads.runtime import EXIT_OK, Progress, Stopper, atomic_write, emit, log

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def sample_file(out: Path, sample_id: str) -> Path:
    return out / f"{sample_id}.safetensors"


def save_sample(spec: ExtractSpec, out: Path, sample_id: str, tensors: dict[str, Any]) -> int:
    """Write one sample's tensors next to the others and rename it in; returns its size."""
    from safetensors.torch import save_file

    tmp = out / f".{sample_id}.tmp"
    metadata = {"id": sample_id, "convention": spec.layers.convention, "backend": spec.backend}
    save_file(tensors, str(tmp), metadata=metadata)
    final = sample_file(out, sample_id)
    tmp.replace(final)
    return final.stat().st_size


class ShardWriter:
    """Both backends' bookkeeping: atomic sample files, progress in tokens and MB/s, the drain
    flag, and the manifest at the end."""

    def __init__(
        self,
        spec: ExtractSpec,
        index: int,
        out: Path,
        samples: list[dict[str, Any]],
        *,
        todo: list[dict[str, Any]],
    ) -> None:
        self.spec, self.index, self.out, self.samples = spec, index, out, samples
        self.stopper = Stopper()
        self.progress = Progress("extract", "tokens", 0)
        self.start, self.tokens, self.written = time.monotonic(), 0, 0
        log(f"shard {index}: {len(samples)} samples, {len(samples) - len(todo)} already extracted")

    def add(self, sample_id: str, tensors: dict[str, Any], tokens: int) -> None:
        self.written += save_sample(self.spec, self.out, sample_id, tensors)
        self.tokens += tokens
        self.progress.total += tokens
        elapsed = max(time.monotonic() - self.start, 1e-6)
        self.progress.advance(tokens, mb_per_s=round(self.written / 1e6 / elapsed, 3))

    def finish(self) -> int:
        seconds = time.monotonic() - self.start
        return finish(
            self.spec, self.index, self.out, self.samples, self.tokens, self.written, seconds
        )


def finish(
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
        "final_layer": "pre-norm",  # the residual entering the final norm (vLLM id = layers)
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

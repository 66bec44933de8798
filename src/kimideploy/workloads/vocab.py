"""vocab: the draft vocabulary maps from target-token frequencies over generated tokens (CPU).

d2t[i] is the offset from draft id i to its target id (target = i + d2t[i]); t2d is a boolean mask
over the target vocabulary marking the tokens the draft vocabulary keeps. This is the layout
speculators writes into EAGLE-3 checkpoints and vLLM reads.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from kimideploy.config.specs import VocabSpec
from kimideploy.formats.chat_template import load_tokenizer
from kimideploy.workloads import dataset_record
from kimideploy.workloads.conversations import iter_samples, sample_tokens
from kimideploy.workloads.dataset_record import rendering_inputs
from kimideploy.workloads.runtime import EXIT_OK, BadInputError, Progress, atomic_write, emit, log

MAPS_FILE = "vocab_maps.safetensors"


def draft_vocabulary(counts: Counter[int], draft_size: int, vocab_size: int) -> list[int]:
    """The `draft_size` most frequent target ids (ties by id), padded with the lowest unused ids,
    sorted ascending (so offsets d2t are non-negative and non-decreasing)."""
    chosen = [
        token for token, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:draft_size]
    ]
    chosen_set = set(chosen)
    filler = (t for t in range(vocab_size) if t not in chosen_set)
    while len(chosen) < draft_size:
        chosen.append(next(filler))
    return sorted(chosen)


def build_maps(target_ids: list[int], vocab_size: int) -> tuple[Any, Any]:
    import torch

    d2t = torch.tensor([t - i for i, t in enumerate(target_ids)], dtype=torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[torch.tensor(target_ids, dtype=torch.int64)] = True
    return d2t, t2d


def load_vocab_maps(folder: Path, vocab_size: int) -> tuple[Any, Any]:
    """Read and check the maps (the training step's loader): shapes, mask count, consistency."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(folder / MAPS_FILE))
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    if t2d.dtype != torch.bool or t2d.shape != (vocab_size,):
        raise BadInputError(f"t2d must be bool[{vocab_size}], found {t2d.dtype}{list(t2d.shape)}")
    targets = torch.arange(len(d2t)) + d2t
    if int(t2d.sum()) != len(d2t) or not bool(t2d[targets].all()):
        raise BadInputError("d2t and t2d disagree: the maps were written by different runs")
    return d2t, t2d


def run(spec: VocabSpec) -> int:
    tokenizer = load_tokenizer(spec.target.path)
    observed = rendering_inputs(
        Path(spec.conversations_dir), spec.fingerprint.get("conversations"), tokenizer
    )
    dataset_record.claim(Path(spec.output_dir), spec.fingerprint, observed)
    counts: Counter[int] = Counter()
    samples = list(iter_samples(Path(spec.conversations_dir)))
    if not samples:
        raise BadInputError(f"{spec.conversations_dir}: no generated conversations")
    progress = Progress("vocab", "samples", len(samples))
    for sample in samples:
        ids, mask = sample_tokens(tokenizer, sample)
        counts.update(t for t, m in zip(ids, mask, strict=True) if m)
        progress.advance()
    vocab_size = spec.target.vocab_size
    target_ids = draft_vocabulary(counts, spec.draft_vocab_size, vocab_size)
    d2t, t2d = build_maps(target_ids, vocab_size)
    from safetensors.torch import save_file

    out = Path(spec.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{MAPS_FILE}.tmp"
    save_file({"d2t": d2t, "t2d": t2d}, str(tmp))
    tmp.replace(out / MAPS_FILE)
    total = sum(counts.values())
    covered = sum(counts[t] for t in target_ids)
    report = {
        "draft_vocab_size": spec.draft_vocab_size,
        "vocab_size": vocab_size,
        "samples": len(samples),
        "generated_tokens": total,
        "distinct_tokens": len(counts),
        "coverage": round(covered / total, 6) if total else 0.0,
    }
    atomic_write(out / "vocab.json", json.dumps(report, indent=2, sort_keys=True).encode())
    coverage = f"{report['coverage']:.2%}"
    log(f"draft vocabulary of {spec.draft_vocab_size} covers {coverage} of generated tokens")
    emit({"event": "result", "stage": "vocab", **report})
    return EXIT_OK

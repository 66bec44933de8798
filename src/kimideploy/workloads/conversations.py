"""Reading datagen's output: every finished sample of every shard, in a stable order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def iter_samples(root: Path) -> Iterator[dict[str, Any]]:
    for chunk in sorted(root.glob("shard-*/chunk-*.jsonl")):
        for line in chunk.read_text(encoding="utf-8").splitlines():
            if line:
                yield json.loads(line)


def my_samples(root: Path, shards: int, index: int) -> list[dict[str, Any]]:
    """This shard's samples: sorted by id so every pod agrees on the split."""
    samples = sorted(iter_samples(root), key=lambda s: s["id"])
    return [s for i, s in enumerate(samples) if i % shards == index]


def tokenize_segments(tokenizer: Any, segments: list[list[Any]]) -> tuple[list[int], list[int]]:
    """Token ids and the loss mask (1 on generated assistant tokens only), segment by segment."""
    ids: list[int] = []
    mask: list[int] = []
    for text, generated in segments:
        piece = tokenizer.encode(text, add_special_tokens=False)
        piece_ids = piece.ids if hasattr(piece, "ids") else list(piece)
        ids.extend(piece_ids)
        mask.extend([1 if generated else 0] * len(piece_ids))
    return ids, mask

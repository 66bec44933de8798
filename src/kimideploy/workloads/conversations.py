"""Reading datagen's output: every finished sample of every shard, in a stable order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kimideploy.formats.chat_template import render_sample


def iter_samples(root: Path) -> Iterator[dict[str, Any]]:
    for chunk in sorted(root.glob("shard-*/chunk-*.jsonl")):
        for line in chunk.read_text(encoding="utf-8").splitlines():
            if line:
                yield json.loads(line)


def my_samples(root: Path, shards: int, index: int) -> list[dict[str, Any]]:
    """This shard's samples: sorted by id so every pod agrees on the split."""
    samples = sorted(iter_samples(root), key=lambda s: s["id"])
    return [s for i, s in enumerate(samples) if i % shards == index]


def sample_tokens(tokenizer: Any, sample: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Token ids and the loss mask (1 on the generated turn only), by the target's template."""
    rendered = render_sample(tokenizer, sample)
    return rendered.ids, rendered.loss_mask

"""Reading datagen's output: every finished sample of every shard, in a stable order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kimideploy.formats.bounded_io import CHUNK_LIMIT, UnreadableFileError, read_bytes
from kimideploy.formats.chat_template import render_sample
from kimideploy.workloads.runtime import BadInputError


def iter_samples(root: Path) -> Iterator[dict[str, Any]]:
    """Every sample of every chunk; a chunk that is not a regular file of JSON lines (a link, a
    truncated write) is a bad input naming the file and line."""
    for chunk in sorted(root.glob("shard-*/chunk-*.jsonl")):
        try:
            text = read_bytes(chunk, CHUNK_LIMIT).decode("utf-8")
        except (UnreadableFileError, UnicodeDecodeError) as exc:
            raise BadInputError(f"{chunk}: {exc}", hint=REGENERATE) from exc
        for number, line in enumerate(text.splitlines(), 1):
            if not line:
                continue
            try:
                sample = json.loads(line)
            except ValueError as exc:
                raise BadInputError(
                    f"{chunk}:{number}: not a sample ({exc})", hint=REGENERATE
                ) from exc
            if not isinstance(sample, dict) or "id" not in sample:
                raise BadInputError(f"{chunk}:{number}: not a sample (no id)", hint=REGENERATE)
            yield sample


REGENERATE = "move the chunk aside and run datagen again: it makes the missing samples again"


def my_samples(root: Path, shards: int, index: int) -> list[dict[str, Any]]:
    """This shard's samples: sorted by id so every pod agrees on the split."""
    samples = sorted(iter_samples(root), key=lambda s: s["id"])
    return [s for i, s in enumerate(samples) if i % shards == index]


def sample_tokens(tokenizer: Any, sample: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Token ids and the loss mask (1 on the generated turn only), by the target's template."""
    rendered = render_sample(tokenizer, sample)
    return rendered.ids, rendered.loss_mask

"""The replay sample: the held-out conversations a drafter was judged on, written beside it by
training and carried wherever it goes (every file of the folder is published and pulled).

Each row is the conversation as datagen stored it (structure: messages, tools, the generated
turn) plus the token ids and loss mask training rendered it to. `drafter doctor` replays them on
the serving engine: the same conversations with the served features, rendered by the served
template, answered by the served target, so that each difference from the held-out figures
training recorded has one cause.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kimideploy.formats.bounded_io import UnreadableFileError, read_bytes
from kimideploy.formats.chat_template import RENDERED_FIELDS
from kimideploy.workloads.conversations import iter_samples
from kimideploy.workloads.runtime import BadInputError, atomic_write

REPLAY_SAMPLE_FILE = "replay-sample.jsonl"
SAMPLE_LIMIT = 64 * 1024 * 1024
"""256 conversations of a few thousand tokens are a few MB; a bigger file is not ours."""


def write(
    folder: Path, conversations_dir: Path, rendered: dict[str, tuple[list[int], list[int]]]
) -> int:
    """`rendered`: sample id -> (training's token ids, loss mask). Returns the rows written; a
    conversation that is no longer in `conversations_dir` is left out."""
    rows = []
    for sample in iter_samples(conversations_dir):
        if sample["id"] in rendered:
            ids, mask = rendered[sample["id"]]
            kept = {key: sample[key] for key in RENDERED_FIELDS if key in sample}
            rows.append({**kept, "input_ids": ids, "loss_mask": mask})
    rows.sort(key=lambda row: row["id"])
    atomic_write(folder / REPLAY_SAMPLE_FILE, "".join(json.dumps(r) + "\n" for r in rows).encode())
    return len(rows)


def read(folder: Path) -> list[dict[str, Any]] | None:
    """The rows, or None when the drafter carries no replay sample (trained elsewhere, or with
    held_out_fraction 0)."""
    path = folder / REPLAY_SAMPLE_FILE
    if not path.exists():
        return None
    try:
        text = read_bytes(path, SAMPLE_LIMIT).decode("utf-8")
        rows = [json.loads(line) for line in text.splitlines() if line]
    except (UnreadableFileError, UnicodeDecodeError, ValueError) as exc:
        raise BadInputError(
            f"{path}: not a replay sample ({exc})",
            hint="copy the drafter again (its files are checked against their sha256 on pull)",
        ) from exc
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise BadInputError(f"{path}:{number}: a {type(row).__name__}, not an object")
        ids, mask = row.get("input_ids"), row.get("loss_mask")
        if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask):
            raise BadInputError(f"{path}:{number}: no token ids with a loss mask of their length")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise BadInputError(f"{path}:{number}: token ids that are not token ids")
    return rows

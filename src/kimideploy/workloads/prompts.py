"""Reading a prompt dataset: JSON Lines or Parquet, plain prompts or ShareGPT conversations."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
}


@dataclass(frozen=True)
class Prompt:
    index: int
    id: str
    messages: list[dict[str, str]]


@dataclass
class PromptSet:
    prompts: list[Prompt] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    sha256: str = ""


def _rows(path: Path) -> list[Any]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # only the datagen image needs pyarrow

        return list(pq.read_table(path).to_pylist())
    rows: list[Any] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line) if line.strip() else None)
        except ValueError:
            rows.append(ValueError(line[:80]))
    return rows


def _messages(row: Any) -> list[dict[str, str]]:
    """A row's conversation up to (not including) the answer to generate."""
    if isinstance(row, dict) and isinstance(row.get("prompt"), str):
        messages = [{"role": "user", "content": row["prompt"]}]
        if isinstance(row.get("system"), str):
            messages.insert(0, {"role": "system", "content": row["system"]})
        return messages
    turns = row.get("conversations") or row.get("messages") if isinstance(row, dict) else None
    if not isinstance(turns, list):
        raise ValueError("neither 'prompt' nor 'conversations'/'messages'")
    messages = []
    for item in turns:
        role = SHAREGPT_ROLES.get(str(item.get("from") or item.get("role")))
        if role is None:
            raise ValueError(f"unknown role {item.get('from') or item.get('role')!r}")
        messages.append(
            {"role": role, "content": str(item.get("value") or item.get("content") or "")}
        )
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()  # regenerate the last answer with the target model
    return messages


def load_prompts(path: Path) -> PromptSet:
    """Every usable prompt with a stable id; bad or empty rows are counted, not fatal."""
    result = PromptSet(sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    for index, row in enumerate(_rows(path)):
        try:
            if isinstance(row, Exception):
                raise ValueError(f"not JSON: {row}")
            if row is None:
                raise ValueError("empty line")
            messages = _messages(row)
            if not messages or not messages[-1]["content"].strip():
                raise ValueError("empty prompt")
        except ValueError as exc:
            result.bad.append(f"row {index}: {exc}")
            continue
        canonical = json.dumps(messages, sort_keys=True).encode()
        result.prompts.append(
            Prompt(index, hashlib.sha256(canonical).hexdigest()[:16] + f"-{index}", messages)
        )
    return result

"""Reading a prompt dataset: JSON Lines or Parquet, plain prompts, ShareGPT or OpenAI conversations.
The datagen and bench pods read theirs with it, and the CLI reads the user's (`drafter doctor
--prompts`, `drafter check --replay`) the same way.

An OpenAI-style row (`messages`) keeps what the chat template renders: `tools` beside the
messages, and on the turns `tool_calls`, `tool_call_id`, `name` and an assistant's `reasoning`
(or `reasoning_content`), so a prompt with tool declarations and earlier thinking reaches the
target as it would in production.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHAREGPT_ROLES = {
    "system": "system",
    "tool": "tool",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
}


KEPT_FIELDS = ("tool_calls", "tool_call_id", "name", "reasoning")


@dataclass(frozen=True)
class Prompt:
    index: int
    id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


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


def _messages(row: Any) -> list[dict[str, Any]]:
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
        message: dict[str, Any] = {
            "role": role,
            "content": str(item.get("value") or item.get("content") or ""),
        }
        message.update({key: item[key] for key in KEPT_FIELDS if item.get(key) is not None})
        if "reasoning" not in message and item.get("reasoning_content") is not None:
            message["reasoning"] = item["reasoning_content"]  # the name vLLM reads
        messages.append(message)
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
            tools = row.get("tools") if isinstance(row, dict) else None
            if tools is not None and not isinstance(tools, list):
                raise ValueError("'tools' is not a list")
        except ValueError as exc:
            result.bad.append(f"row {index}: {exc}")
            continue
        canonical = json.dumps([messages, tools] if tools else messages, sort_keys=True).encode()
        prompt_id = hashlib.sha256(canonical).hexdigest()[:16] + f"-{index}"
        result.prompts.append(Prompt(index, prompt_id, messages, tools or None))
    return result

"""Reading a prompt dataset: JSON Lines or Parquet, plain prompts, ShareGPT or OpenAI conversations.
The datagen and bench pods read theirs with it, and the CLI reads the user's (`drafter doctor
--prompts`, `drafter check --replay`) the same way.

An OpenAI-style row (`messages`) keeps what the chat template renders: `tools` beside the
messages, and on the turns `tool_calls`, `tool_call_id`, `name` and an assistant's `reasoning`
(or `reasoning_content`), so a prompt with tool declarations and earlier thinking reaches the
target as it would in production.

Rows are lines split at "\n" only: U+2028, U+0085 and the other characters `str.splitlines()`
breaks at are legal unescaped inside a JSON string, and a prompt holding one stays whole. A
leading UTF-8 byte-order mark is not part of the first row. OpenAI content-part lists are joined
from their text parts; a part of another type (an image) is a bad row that says so.
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


class PromptFileError(ValueError):
    """The file as a whole cannot be read in this environment (a missing reader)."""


@dataclass
class PromptSet:
    prompts: list[Prompt] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    sha256: str = ""


def _rows(path: Path) -> list[Any]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # only the datagen image needs pyarrow
        except ImportError as exc:
            raise PromptFileError(
                f"{path}: reading Parquet needs pyarrow, which is not installed here "
                "(pip install pyarrow, or convert the file to JSON Lines)"
            ) from exc
        return list(pq.read_table(path).to_pylist())
    text = path.read_text(encoding="utf-8-sig")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the file's final newline ends the last row; it starts none
    rows: list[Any] = []
    for line in lines:
        line = line.removesuffix("\r")
        try:
            rows.append(json.loads(line) if line.strip() else None)
        except RecursionError:
            rows.append(ValueError("nested too deeply to be a prompt"))
        except ValueError:
            rows.append(ValueError(f"not JSON: {line[:80]}"))
    return rows


def _content(value: Any) -> str:
    """A turn's text: a string, or the text parts of an OpenAI content-part list joined."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for number, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind != "text" or not isinstance(part.get("text"), str):
                raise ValueError(
                    f"content part {number} is {kind!r}: only text parts can be prompted"
                )
            texts.append(part["text"])
        return "".join(texts)
    raise ValueError(f"content is a {type(value).__name__}, not text or a list of text parts")


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
    for number, item in enumerate(turns):
        if not isinstance(item, dict):
            raise ValueError(f"turn {number} is a {type(item).__name__}, not an object")
        role = SHAREGPT_ROLES.get(str(item.get("from") or item.get("role")))
        if role is None:
            raise ValueError(f"unknown role {item.get('from') or item.get('role')!r}")
        text = item.get("value") if item.get("value") is not None else item.get("content")
        message: dict[str, Any] = {"role": role, "content": _content(text)}
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
                raise ValueError(str(row))
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

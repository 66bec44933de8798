"""Kimi-K2.5's chat format, exactly as the model sees it at serving time (thinking included)."""

from __future__ import annotations

from typing import Any

ROLE_TOKENS = {"system": "<|im_system|>", "user": "<|im_user|>", "assistant": "<|im_assistant|>"}
MIDDLE, END, THINK, END_THINK = "<|im_middle|>", "<|im_end|>", "<think>", "</think>"


def turn(role: str, content: str) -> str:
    return f"{ROLE_TOKENS[role]}{role}{MIDDLE}{content}{END}"


def render(messages: list[dict[str, Any]], reasoning: str, answer: str) -> list[tuple[str, bool]]:
    """Segments of the conversation as (text, is_generated): earlier assistant turns carry an
    empty <think></think>; the generated turn wraps its reasoning in thinking tokens."""
    segments: list[tuple[str, bool]] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "assistant":
            segments.append((turn(role, f"{THINK}{END_THINK}{content}"), False))
        else:
            segments.append((turn(role, content), False))
    segments.append((f"{ROLE_TOKENS['assistant']}assistant{MIDDLE}", False))
    segments.append((f"{THINK}{reasoning}{END_THINK}{answer}{END}", True))
    return segments


def text_of(segments: list[tuple[str, bool]]) -> str:
    return "".join(text for text, _ in segments)

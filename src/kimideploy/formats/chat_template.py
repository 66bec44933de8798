"""One renderer for data and serving: the target's own chat template, applied as vLLM applies it.

Shared by the pods (extraction, vocab, training) and the CLI (`data inspect --sample`), so both
show and train on the same tokens; transformers is imported only when a tokenizer is loaded.

A generated sample is stored as structure (the prompt's messages and tools, and the generated
assistant turn: reasoning, answer, tool calls), never as text. Extraction, vocab and training turn
it into tokens here, with the tokenizer and chat template of the pinned model revision on the
models volume, after the normalisation vLLM gives an OpenAI request before its template sees it
(vllm/renderers/chat_utils.py in 0.32: an assistant's `reasoning` is passed as `reasoning` and
`reasoning_content`, tool-call arguments become objects, an empty `tool_calls` is dropped). So the
template's default system turn, its tool declarations, how it keeps or drops the thinking of
earlier assistant turns: all of it is what the serving engine renders, and the pipeline tier checks
the ids against vLLM's own /tokenize.

The loss mask comes from the template's structure: the tokens of the conversation up to the
generation prompt (`add_generation_prompt=True`) are context, everything after them, the turn the
target generated and its end-of-turn token, is trained. A template whose prompt rendering is not a
prefix of its full rendering is refused: the boundary would be a guess.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimideploy.errors import UsageError

SAMPLE_FORMAT = "kimideploy.conversation.v2"
"""Structure only (messages, tools, the generated turn); v1 samples held hand-rendered text."""
RENDERED_FIELDS = ("format", "id", "messages", "tools", "reasoning", "answer", "tool_calls")
"""What `render_sample` reads of a sample."""


class SampleRenderError(UsageError):
    """A sample or a tokenizer that cannot be rendered as the target sees it (exit 2)."""


@dataclass(frozen=True)
class RenderedSample:
    ids: list[int]
    loss_mask: list[int]
    text: str
    prompt_tokens: int


def generated_turn(sample: dict[str, Any]) -> dict[str, Any]:
    """The assistant message the target produced, in OpenAI's shape."""
    turn: dict[str, Any] = {"role": "assistant", "content": sample.get("answer") or ""}
    if sample.get("reasoning"):
        turn["reasoning"] = sample["reasoning"]
    if sample.get("tool_calls"):
        turn["tool_calls"] = sample["tool_calls"]
    return turn


def _arguments(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value:
        try:
            parsed = json.loads(value)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


PASSED_ON = {"assistant": ("tool_calls",), "tool": ("tool_call_id",)}
"""Besides role and content (and `name`), what vLLM 0.32 keeps of a message per role; the rest
(an assistant's `reasoning_content` too: vLLM reads `reasoning`) never reaches the template."""


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What vLLM hands the template for these OpenAI messages (new dicts, the input unchanged)."""
    out = []
    for original in messages:
        role = original["role"]
        message: dict[str, Any] = {"role": role, "content": original.get("content") or ""}
        for key in PASSED_ON.get(role, ()):
            if original.get(key) is not None:
                message[key] = copy.deepcopy(original[key])
        if isinstance(original.get("name"), str):
            message["name"] = original["name"]
        if role == "assistant":
            if original.get("reasoning") is not None:
                message["reasoning"] = message["reasoning_content"] = original["reasoning"]
            if message.get("tool_calls") == []:
                message.pop("tool_calls")
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                function["arguments"] = _arguments(function.get("arguments"))
        out.append(message)
    return out


def _apply(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, **options: Any) -> Any:
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools or None, return_dict=False, **options
        )
    except Exception as exc:  # the template's own refusal (a role it does not know, ...)
        raise SampleRenderError(
            f"the target's chat template cannot render a sample: {exc}"
        ) from exc


def render_sample(tokenizer: Any, sample: dict[str, Any]) -> RenderedSample:
    """Token ids and loss mask of one generated sample, as the target sees it when serving."""
    if sample.get("format") != SAMPLE_FORMAT:
        raise SampleRenderError(
            f"sample {sample.get('id')}: written by an older datagen (hand-rendered text, no "
            f"'{SAMPLE_FORMAT}' structure), which the chat template cannot re-render",
            hint="run datagen again: it writes a new dataset folder",
        )
    tools = sample.get("tools")
    prompt = template_messages(sample["messages"])
    full = template_messages([*sample["messages"], generated_turn(sample)])
    prompt_text = _apply(tokenizer, prompt, tools, tokenize=False, add_generation_prompt=True)
    text = _apply(tokenizer, full, tools, tokenize=False, add_generation_prompt=False)
    if not text.startswith(prompt_text):
        raise SampleRenderError(
            f"sample {sample.get('id')}: the chat template renders the conversation up to the "
            "generation prompt differently from the start of the whole conversation, so where "
            "the generated turn begins is not defined"
        )
    ids = list(_apply(tokenizer, full, tools, tokenize=True, add_generation_prompt=False))
    prompt_ids = list(_apply(tokenizer, prompt, tools, tokenize=True, add_generation_prompt=True))
    if ids[: len(prompt_ids)] != prompt_ids:
        raise SampleRenderError(
            f"sample {sample.get('id')}: the generation prompt's tokens are not a prefix of the "
            "conversation's (a token spans the boundary)"
        )
    mask = [0] * len(prompt_ids) + [1] * (len(ids) - len(prompt_ids))
    return RenderedSample(ids, mask, text, len(prompt_ids))


def load_tokenizer(model_dir: str | Path) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=True)
    if not getattr(tokenizer, "chat_template", None):
        raise SampleRenderError(
            f"{model_dir}: the tokenizer has no chat template, so samples cannot be rendered as "
            "the target sees them",
            hint="sync the pinned revision completely (its tokenizer_config.json or "
            "chat_template.jinja holds the template)",
        )
    return tokenizer


def template_fingerprint(tokenizer: Any) -> dict[str, str]:
    """What decides the rendering: the template text and the vocabulary."""
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named templates: the default one renders chats
        template = template.get("default") or json.dumps(template, sort_keys=True)
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    return {
        "chat_template_sha256": hashlib.sha256(str(template).encode()).hexdigest(),
        "tokenizer_sha256": hashlib.sha256(vocab.encode()).hexdigest(),
    }

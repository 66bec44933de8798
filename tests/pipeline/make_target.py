"""Make and train the pipeline tier's tiny target: run with the CPU vLLM venv's python.

`python make_target.py OUT [--steps N] [--seed S]` writes a Llama (6 layers, hidden 128, 4 heads
of 32: vLLM's CPU attention needs head size >= 32) and a byte-level BPE tokenizer with Kimi's
chat tokens and a Kimi-shaped chat template, then trains it on conversations in the bench
workload's prompt shapes (kimideploy.workloads.bench.make_prompts) with answers a deterministic
function of the prompt. A random target gives near-uniform logits, so every drafter gets ~0
acceptance and nothing can be learned; this one's greedy continuations have structure a drafter
can learn from its hidden states. Prints one JSON line with the final loss.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import jinja2.sandbox
import torch
from corpus import answer, prompts  # (this folder is on sys.path: run as a script)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL = ["<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>",
           "<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
           "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"]  # fmt: skip
HERE = Path(__file__).resolve().parent
# Kimi-K2.5's turn layout (default system turn, thinking, tool calls), shared with the workload
# tests; the target is trained on exactly what this template renders, as a real target is.
CHAT_TEMPLATE = (HERE.parent / "fixtures" / "chat_templates" / "kimi_shaped.jinja").read_text()
BATCH = 8


def conversation(prompt: str) -> list[dict[str, str]]:
    reasoning, reply = answer(prompt)
    return [{"role": "user", "content": prompt},
            {"role": "assistant", "content": reply, "reasoning_content": reasoning}]  # fmt: skip


def conversation_text(prompt: str) -> str:
    """The template's rendering, for training the tokenizer before one exists."""
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.filters["tojson"] = json.dumps
    rendered: str = environment.from_string(CHAT_TEMPLATE).render(
        messages=conversation(prompt), tools=None, add_generation_prompt=False
    )
    return rendered


def build_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tokenizer.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                                   pad_token="<|im_end|>", bos_token=None,
                                   model_input_names=["input_ids", "attention_mask"])  # fmt: skip
    fast.chat_template = CHAT_TEMPLATE
    return fast


def train(out: Path, steps: int, seed: int) -> float:
    torch.manual_seed(seed)
    texts = prompts(seed + 1, 2000)
    corpus = [conversation_text(p) for p in texts]
    tokenizer = build_tokenizer(corpus)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                         num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=512, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                         tie_word_embeddings=False)  # fmt: skip
    model = LlamaForCausalLM(config)
    encoded = [tokenizer.apply_chat_template(conversation(p), tokenize=True, return_dict=False)
               for p in texts]  # fmt: skip
    assert tokenizer.decode(encoded[0]) == corpus[0]  # the BPE saw what training sees
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps)
    rng = random.Random(seed)
    loss = float("nan")
    model.train()
    for _ in range(steps):
        batch = rng.sample(encoded, BATCH)
        width = max(len(ids) for ids in batch)
        ids = torch.full((BATCH, width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((BATCH, width), -100, dtype=torch.long)
        for row, sample in enumerate(batch):
            ids[row, : len(sample)] = torch.tensor(sample)
            labels[row, : len(sample)] = torch.tensor(sample)
        result = model(input_ids=ids, labels=labels)
        result.loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        loss = float(result.loss.detach())
        if os.environ.get("TINY_TARGET_TRACE"):
            print(f"step loss {loss:.3f}", file=sys.stderr)
    model.eval()
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return loss


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(2)
    started = time.monotonic()
    loss = train(args.out, args.steps, args.seed)
    print(json.dumps({"loss": loss, "steps": args.steps, "seconds": time.monotonic() - started}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

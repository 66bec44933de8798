"""Make and train the pipeline tier's informative target: run with the CPU vLLM venv's python.

`python make_target.py OUT [--steps-previous N] [--steps N] [--seed S]` writes two checkpoints of
one tiny Llama (6 layers, hidden 128, 4 heads of 32: vLLM's CPU attention needs head size >= 32)
with a byte-level BPE tokenizer carrying Kimi's chat tokens:

- OUT/previous: trained on the standard library's conversations (stdlib_corpus.py) rendered with
  a Kimi-K2-shaped template (no thinking), as Kimi-K2 was a non-thinking model;
- OUT/served: `previous` trained further on the same conversations with the Kimi-K2.5-shaped
  template (thinking first), as K2.5 continued from K2. The tier serves this one.

Both directories carry the K2.5-shaped template, so a drafter trained on `previous` differs from a
correct one only in the target weights it was trained for (the "drafter for Kimi-K2 served on
K2.5" mistake). Prints one JSON line with the final losses.
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
import stdlib_corpus  # (this folder is on sys.path: run as a script)
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL = ["<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>",
           "<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
           "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"]  # fmt: skip
TEMPLATES = Path(__file__).resolve().parent.parent / "fixtures" / "chat_templates"
SERVED_TEMPLATE = (TEMPLATES / "kimi_shaped.jinja").read_text()
PREVIOUS_TEMPLATE = (TEMPLATES / "kimi_k2_shaped.jinja").read_text()
VOCAB_SIZE = 1024
MAX_TOKENS = 256
BATCH = 8
LR = 3e-3


def render(template: str, conversations: list[list[dict[str, str]]]) -> list[str]:
    """The template's rendering, for training the tokenizer before one exists."""
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.filters["tojson"] = json.dumps
    compiled = environment.from_string(template)
    return [compiled.render(messages=c, tools=None, add_generation_prompt=False)
            for c in conversations]  # fmt: skip


def build_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tokenizer.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                                   pad_token="<|im_end|>", bos_token=None,
                                   model_input_names=["input_ids", "attention_mask"])  # fmt: skip
    fast.chat_template = SERVED_TEMPLATE
    return fast


def encode(tokenizer: PreTrainedTokenizerFast, template: str, conversations: list) -> list:
    tokenizer.chat_template = template
    encoded = [tokenizer.apply_chat_template(c, tokenize=True, return_dict=False)[:MAX_TOKENS]
               for c in conversations]  # fmt: skip
    tokenizer.chat_template = SERVED_TEMPLATE
    return encoded


def train(model: LlamaForCausalLM, encoded: list, steps: int, seed: int, pad: int) -> float:
    """`steps` AdamW steps with a one-cycle schedule on batches of similar length."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=LR, total_steps=steps)
    rng = random.Random(seed)
    by_length = sorted(encoded, key=len)
    loss = float("nan")
    model.train()
    for _ in range(steps):
        start = rng.randrange(max(len(by_length) - BATCH, 1))
        batch = by_length[start : start + BATCH]  # neighbours in length: little padding
        width = max(len(ids) for ids in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        for row, sample in enumerate(batch):
            ids[row, : len(sample)] = torch.tensor(sample)
            labels[row, : len(sample)] = torch.tensor(sample)
        result = model(input_ids=ids, labels=labels)
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        loss = float(result.loss.detach())
    model.eval()
    return loss


def save(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.chat_template = SERVED_TEMPLATE
    tokenizer.save_pretrained(out)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps-previous", type=int, default=500)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("KIMIDEPLOY_TARGET_THREADS", "2")))
    torch.manual_seed(args.seed)
    started = time.monotonic()
    conversations = [i.conversation() for i in stdlib_corpus.select("target")]
    tokenizer = build_tokenizer(render(SERVED_TEMPLATE, conversations))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384,
                         num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=512, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                         tie_word_embeddings=False)  # fmt: skip
    model = LlamaForCausalLM(config)
    pad = tokenizer.pad_token_id
    previous_loss = train(model, encode(tokenizer, PREVIOUS_TEMPLATE, conversations),
                          args.steps_previous, args.seed, pad)  # fmt: skip
    save(model, tokenizer, args.out / "previous")
    served_loss = train(model, encode(tokenizer, SERVED_TEMPLATE, conversations), args.steps,
                        args.seed + 1, pad)  # fmt: skip
    save(model, tokenizer, args.out / "served")
    print(json.dumps({"loss_previous": previous_loss, "loss": served_loss,
                      "steps_previous": args.steps_previous, "steps": args.steps,
                      "corpus": stdlib_corpus.corpus_digest(),
                      "seconds": round(time.monotonic() - started, 1)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

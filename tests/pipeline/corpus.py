"""The tiny target's conversations: the bench workload's two prompt shapes with answers that are a
deterministic function of the prompt (no torch here: the tests import it to write datagen's prompts).
"""

from __future__ import annotations

import random
import re

TOPICS = ["tensor parallelism", "speculative decoding", "KV caches", "mixture of experts",
          "PCIe versus NVLink", "quantization", "attention", "batching"]  # fmt: skip
FACTS = ["splits each layer across devices", "drafts tokens the target then verifies",
         "keep keys and values of earlier tokens", "route each token to a few experts",
         "move tensors between GPUs at different speeds", "stores weights in fewer bits",
         "mixes information between tokens", "serves many requests in one step"]  # fmt: skip


def answer(prompt: str) -> tuple[str, str]:
    """(reasoning, answer): deterministic in the prompt, so greedy decoding has structure."""
    numbers = re.findall(r"\d+", prompt)
    if prompt.startswith("Think step by step") and len(numbers) >= 3:
        a, b, c = numbers[:3]
        reasoning = f"first {a} times {b}, then minus {c}. check {a} {b} {c}."
        return reasoning, f"the answer is {a} times {b} minus {c}."
    topic = next((t for t in TOPICS if t in prompt), TOPICS[0])
    fact = FACTS[TOPICS.index(topic)]
    reasoning = f"the engineer asks about {topic}. {topic} {fact}."
    return reasoning, f"{topic} {fact}. in short, {topic} {fact}."


def prompts(seed: int, count: int) -> list[str]:
    """The bench workload's two prompt shapes, with other numbers and indexes (held out)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        if i % 2:
            a, b, c = rng.randint(12, 99), rng.randint(12, 99), rng.randint(100, 999)
            out.append(f"Think step by step: what is {a} * {b} - {c}? "
                       "Check the result before answering.")  # fmt: skip
        else:
            topic = TOPICS[rng.randrange(len(TOPICS))]
            out.append(
                f"In a few sentences, explain {topic} to an engineer (#{rng.randint(0, 999)})."
            )
    return out

"""Held-out judgement: the acceptance vLLM would count for a drafter, measured during training on
samples it never trained on.

Training loss and speculators' own per-position accuracy are measured on the batches being
trained, with the ground-truth token fed to every later draft step (teacher forcing) and the
target's choice restricted to the draft vocabulary. What vLLM counts is different, and this module
measures that instead, on held-out features:

- the drafter conditions on its own earlier drafts (each step's input token is the previous
  step's draft, mapped to the target vocabulary through d2t), as EAGLE-3 does when serving;
- a draft is accepted when it equals the target's greedy choice over the *full* vocabulary
  (lm_head of the final norm of the target's last hidden state), and only while every earlier
  draft of the same step was accepted: position i accepted given positions < i accepted;
- drafts are counted where greedy speculative decoding would make them: a walk over each
  held-out assistant turn that drafts k tokens, accepts a prefix of length a, emits a + 1 tokens
  (the bonus token) and drafts again from there. The mean acceptance length at k is
  1 + accepted / drafts, the quantity vLLM reports as `mean acceptance length`; per-position
  acceptance is accepted-at-position-i / accepted-at-position-(i-1), vLLM's per-position counter
  made conditional.

The walk equals serving exactly when the held-out text is the target's own greedy output (datagen
at temperature 0); with sampled conversations it is the acceptance greedy serving would get on
text of that distribution.

Which samples are held out is decided by a salted hash of the sample id, so the split does not
depend on order, shard layout or the number of samples, and a resumed run (or another rank)
computes the same one.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

SPLIT_SALT = "kimideploy-heldout-v1"
SPLIT_RULE = "sha256('kimideploy-heldout-v1:' + sample id) as a fraction of 2**64 < fraction"


def is_held_out(sample_id: str, fraction: float) -> bool:
    digest = hashlib.sha256(f"{SPLIT_SALT}:{sample_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


@dataclass(frozen=True)
class Split:
    """Which sample indexes train and which judge; `record` goes into checkpoints and lineage."""

    train: list[int]
    held_out: list[int]
    record: dict[str, Any]


def split_samples(ids: list[str], fraction: float, max_held_out: int) -> Split:
    """Held-out by sample id; at most `max_held_out` of them are evaluated (the first by id), the
    others are still never trained on."""
    held = [i for i, sample_id in enumerate(ids) if is_held_out(sample_id, fraction)]
    train = [i for i in range(len(ids)) if i not in set(held)]
    judged = sorted(held, key=lambda i: ids[i])[:max_held_out]
    digest = hashlib.sha256("\n".join(sorted(ids[i] for i in held)).encode()).hexdigest()
    record = {
        "rule": SPLIT_RULE,
        "fraction": fraction,
        "held_out_samples": len(held),
        "judged_samples": len(judged),
        "training_samples": len(train),
        "held_out_ids_sha256": digest,
    }
    return Split(train, judged, record)


@dataclass
class Walk:
    """Draft counts of greedy speculative decoding at one k."""

    k: int
    drafts: int = 0
    accepted: int = 0
    at_position: list[int] = field(default_factory=list)

    def add(self, accepted: int) -> None:
        self.drafts += 1
        self.accepted += accepted
        for i in range(accepted):
            self.at_position[i] += 1

    def figures(self) -> dict[str, Any]:
        drafts = max(self.drafts, 1)
        conditional, before = [], drafts
        for count in self.at_position:
            conditional.append(round(count / before, 4) if before else 0.0)
            before = count
        return {
            "k": self.k,
            "drafts": self.drafts,
            "mean_acceptance_length": round(mean_length(self.accepted, self.drafts), 4),
            "acceptance_rate": round(self.accepted / (drafts * self.k), 4),
            "acceptance_per_position": conditional,
        }


def mean_length(accepted: int, drafts: int) -> float:
    """Mean acceptance length from summed counts: 1 (the bonus token) + accepted per draft."""
    return 1 + accepted / max(drafts, 1)


def walk(lengths: list[int], k: int) -> Walk:
    """Greedy speculative decoding over one assistant turn whose draft-start positions accept
    `lengths[p]` tokens in a row (at most the evaluated depth): draft k, accept min(L, k), move on
    by the accepted tokens plus the bonus token."""
    result = Walk(k, at_position=[0] * k)
    position = 0
    while position < len(lengths):
        accepted = min(lengths[position], k)
        result.add(accepted)
        position += accepted + 1
    return result


def combine(walks: list[Walk], k: int) -> Walk:
    total = Walk(k, at_position=[0] * k)
    for one in walks:
        total.drafts += one.drafts
        total.accepted += one.accepted
        total.at_position = [a + b for a, b in zip(total.at_position, one.at_position, strict=True)]
    return total


def judge_turns(per_turn_lengths: list[list[int]], depth: int) -> dict[int, Walk]:
    """The walks at every k up to `depth` over the turns' accepted-in-a-row counts."""
    return {
        k: combine([walk(lengths, k) for lengths in per_turn_lengths], k)
        for k in range(1, depth + 1)
    }


BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
"""Fixed, so the same judgement prints the same interval on every run and every machine."""


def paired_difference(
    base: list[list[int]], other: list[list[int]], k: int, resamples: int = BOOTSTRAP_RESAMPLES
) -> dict[str, Any]:
    """How much `other`'s mean acceptance length at k differs from `base`'s when both judge the
    same turns (same order: two feature sets, one drafter, or two drafters, one feature set), with
    a 95% interval from a paired bootstrap over turns.

    Pairing is what makes small costs measurable: most positions are accepted or rejected alike
    under both, and resampling whole turns for both at once cancels that shared variation (a
    difference of 0.03 tokens per step is lost in the spread of two unpaired means of a few
    hundred drafts each). Turns are the resampling unit because positions within a turn are not
    independent: the walk's draft-start positions depend on what was accepted before them."""
    if len(base) != len(other):
        raise ValueError(f"paired judgements of {len(base)} and {len(other)} turns")
    counts = [
        (a.accepted, a.drafts, b.accepted, b.drafts)
        for a, b in ((walk(x, k), walk(y, k)) for x, y in zip(base, other, strict=True))
    ]

    def difference(rows: list[tuple[int, int, int, int]]) -> float:
        totals = [sum(column) for column in zip(*rows, strict=True)] or [0, 0, 0, 0]
        return mean_length(totals[2], totals[3]) - mean_length(totals[0], totals[1])

    draw = random.Random(BOOTSTRAP_SEED)
    spread = sorted(
        difference([counts[draw.randrange(len(counts))] for _ in counts])
        for _ in range(resamples if counts else 0)
    )
    low, high = (
        (spread[int(0.025 * resamples)], spread[int(0.975 * resamples) - 1]) if spread else (0, 0)
    )
    return {
        "k": k,
        "turns": len(counts),
        "difference": round(difference(counts), 4),
        "ci95": [round(low, 4), round(high, 4)],
        "method": f"paired bootstrap over turns, {resamples} resamples",
    }


def interval(
    per_turn: list[list[int]], k: int, resamples: int = BOOTSTRAP_RESAMPLES
) -> list[float]:
    """A 95% interval of the mean acceptance length at k from a bootstrap over turns (the unit
    that is independent: positions within a turn are not, as paired_difference says), seeded so
    that the same judgement prints the same interval everywhere."""
    counts = [(one.accepted, one.drafts) for one in (walk(lengths, k) for lengths in per_turn)]
    if not counts:
        return [1.0, 1.0]
    draw = random.Random(BOOTSTRAP_SEED)
    spread = []
    for _ in range(resamples):
        chosen = [counts[draw.randrange(len(counts))] for _ in counts]
        spread.append(mean_length(sum(a for a, _ in chosen), sum(d for _, d in chosen)))
    spread.sort()
    low, high = spread[int(0.025 * resamples)], spread[int(0.975 * resamples) - 1]
    return [round(low, 4), round(high, 4)]


def figures(
    walks: dict[int, Walk], samples: int, per_turn: list[list[int]] | None = None
) -> dict[str, Any]:
    """What is printed, stored with the checkpoint and written into the lineage: per k the counts
    and, from the turns themselves, how far the mean can be from what serving the same
    distribution will count (a 95% bootstrap interval over the judged turns)."""
    by_k = {str(k): w.figures() for k, w in sorted(walks.items())}
    if per_turn is not None:
        for k, one in by_k.items():
            one["ci95"] = interval(per_turn, int(k))
            one["turns"] = len(per_turn)
    return {
        "depth": max(walks),
        "samples": samples,
        "turns": len(per_turn) if per_turn is not None else None,
        "by_k": by_k,
        "mean_acceptance_length": {k: f["mean_acceptance_length"] for k, f in by_k.items()},
    }


class TargetHead:
    """The target's greedy choice from its last hidden state: lm_head(norm(h)) over the whole
    vocabulary, the verification vLLM does. Loaded once from the target checkpoint."""

    def __init__(self, target_path: str, eps: float, device: Any) -> None:
        from speculators.utils.loading import load_model_layers

        weights = load_model_layers(["lm_head.weight", "model.norm.weight"], target_path)
        if "lm_head.weight" not in weights:  # tied embeddings
            weights["lm_head.weight"] = load_model_layers(["embed_tokens.weight"], target_path)[
                "embed_tokens.weight"
            ]
        self.head = weights["lm_head.weight"].to(device)
        self.norm = weights["model.norm.weight"].to(device)
        self.eps = eps

    def greedy(self, last_hidden: Any, chunk: int = 2048) -> Any:
        """Token ids [T] for hidden states [T, H], in chunks (T x vocabulary logits at once can be
        tens of GB for a 164K vocabulary)."""
        import torch

        out = []
        for start in range(0, last_hidden.shape[0], chunk):
            h = last_hidden[start : start + chunk].to(self.head.dtype)
            variance = h.float().pow(2).mean(-1, keepdim=True)
            normed = (h.float() * torch.rsqrt(variance + self.eps)).to(self.head.dtype) * self.norm
            out.append(torch.argmax(normed @ self.head.T, dim=-1))
        return torch.cat(out)


def load_drafter(path: str, attention: str, verifier: str) -> Any:
    """A speculators EAGLE-3 checkpoint with the attention implementation chosen here (the model
    fixes it, and its mask builder, when it is built) and `verifier` as its target: the path its
    config recorded is a folder of the cluster that trained it, and speculators reads it on load.

    Always in fp32, whatever the files hold: transformers 5 loads a checkpoint in its own dtype
    by default, and a bf16 base drafter would then meet fp32 features at the first step (or be
    trained without fp32 master weights); bf16 compute comes from autocast, not the weights."""
    import torch
    from speculators.models.eagle3.config import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel

    config = Eagle3SpeculatorConfig.from_pretrained(path)
    config.transformer_layer_config._attn_implementation = attention
    config.speculators_config.verifier.name_or_path = verifier
    return Eagle3DraftModel.from_pretrained(path, config=config, dtype=torch.float32)


def autocast(device: Any, precision: str) -> Any:
    """The forward passes' precision: bf16 autocast over fp32 weights (as speculators' trainer
    runs), or plain fp32."""
    import torch

    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def feature_dtype(precision: str) -> Any:
    """The dtype features are packed in: bf16 stays bf16 (autocast computes in it anyway, at half
    the memory of an fp32 copy), fp32 training gets fp32."""
    import torch

    return torch.bfloat16 if precision == "bf16" else torch.float32


PACKED_KEYS = (
    "input_ids",
    "hidden_states",
    "verifier_last_hidden_states",
    "loss_mask",
    "position_ids",
    "document_ids",
)


FLEX_BLOCK = 128
"""FlexAttention's block size. A packed sequence whose length is not a multiple of it fails at the
first step on a GPU with torch 2.11 ("block_mask was created for block_mask.shape=(1, 1, 7808,
15616) but got q_len=7739", seen on an H200; bench/MEASUREMENTS.md): the block mask is built for
the rounded-up length. speculators' own trainer packs to a fixed length for the same reason."""


def pack_multiple(device: Any) -> int:
    """What packed lengths are rounded up to: FlexAttention's block on a GPU (the drafter attends
    through it there), nothing on a CPU (eager attention takes any length)."""
    return FLEX_BLOCK if str(device).startswith("cuda") else 1


def pack(
    saved: list[dict[str, Any]],
    max_seq_len: int,
    device: Any,
    dtype: Any = None,
    *,
    multiple: int = 1,
) -> dict[str, Any]:
    """Samples (input_ids, loss_mask, aux_hidden_states [layers, T, H], last_hidden_state) packed
    into one sequence as speculators trains on it (document ids keep attention within a sample),
    the features in `dtype` (default fp32), padded to a multiple of `multiple` positions with a
    document of its own that nothing is trained or judged on."""
    import torch
    from speculators.models.eagle3.data import shift_batch

    dtype = dtype or torch.float32
    parts = []
    for doc, one in enumerate(saved):
        aux = one["aux_hidden_states"].to(dtype)  # [layers, T, H]
        length = min(int(one["input_ids"].shape[0]), max_seq_len + 1)
        sample = {
            "input_ids": one["input_ids"][:length],
            "hidden_states": aux.permute(1, 0, 2).reshape(aux.shape[1], -1)[:length],
            "verifier_last_hidden_states": one["last_hidden_state"].to(dtype)[:length],
            "loss_mask": one["loss_mask"][:length].bool(),
            "lengths": torch.tensor([length]),
            "position_ids": torch.arange(length),
        }
        shifted = shift_batch(sample)
        shifted["document_ids"] = torch.full_like(shifted["input_ids"], doc)
        parts.append(shifted)
    total = sum(int(p["input_ids"].shape[0]) for p in parts)
    padding = -total % multiple
    if padding:
        parts.append(_padding(parts[0], padding, len(parts)))
    cuda = torch.device(device).type == "cuda"
    return {
        k: torch.cat([p[k] for p in parts])[None].to(device, non_blocking=cuda) for k in PACKED_KEYS
    }


def _padding(like: dict[str, Any], length: int, document: int) -> dict[str, Any]:
    """`length` positions shaped like a packed sample: zeros, no loss, its own document."""
    import torch

    return {
        "input_ids": torch.zeros(length, dtype=like["input_ids"].dtype),
        "hidden_states": like["hidden_states"].new_zeros(length, like["hidden_states"].shape[-1]),
        "verifier_last_hidden_states": like["verifier_last_hidden_states"].new_zeros(
            length, like["verifier_last_hidden_states"].shape[-1]
        ),
        "loss_mask": torch.zeros(length, dtype=like["loss_mask"].dtype),
        "position_ids": torch.arange(length, dtype=like["position_ids"].dtype),
        "document_ids": torch.full((length,), document, dtype=like["document_ids"].dtype),
    }


def judge_batch(model: Any, head: TargetHead, batch: dict[str, Any], depth: int) -> list[list[int]]:
    """Accepted-in-a-row counts per draft-start position of each packed sample's trained span."""
    targets = head.greedy(batch["verifier_last_hidden_states"][0])
    return turns(rollout(model, batch, depth, targets), batch)


def to_target_ids(draft: Any, d2t: Any) -> Any:
    """Draft-vocabulary indexes to target token ids, as vLLM maps them (index + d2t[index])."""
    return draft if d2t is None else draft + d2t[draft]


def rollout(model: Any, batch: dict[str, Any], depth: int, targets: Any) -> Any:
    """Accepted-in-a-row counts [T] per draft-start position of one packed batch: the drafter run
    `depth` steps on its own drafts (speculators' Eagle3DraftModel modules, the forward pass of
    its training-time test with the one change that makes it serving: each step's input token
    is the previous step's draft, not the ground truth)."""
    import torch
    from speculators.models.eagle3.attention import (
        extend_dense_mask_for_draft_tokens,
        extend_mask_for_draft_tokens,
    )
    from transformers import DynamicCache

    hidden = batch["hidden_states"]
    tokens, doc_ids = batch["input_ids"], batch["document_ids"]
    positions, mask = batch["position_ids"], batch["loss_mask"][0].bool()
    total = hidden.shape[1]
    docs = doc_ids.squeeze(0)
    attention = model._build_attn_mask(docs, total, hidden.device) if model.uses_full_attn else None
    sliding = (
        model._build_attn_mask(docs, total, hidden.device, model.sliding_window)
        if model.uses_sliding_window_attn
        else None
    )
    if model.input_norm is not None:
        hidden = model.input_norm(hidden)
    if model.fc_norm is not None:
        chunks = hidden.chunk(len(model.fc_norm), dim=-1)
        hidden = torch.cat([n(c) for n, c in zip(model.fc_norm, chunks, strict=True)], dim=-1)
    hidden = model.fc(hidden)
    cache = DynamicCache()
    alive = mask.clone()
    lengths = torch.zeros(total, dtype=torch.long, device=hidden.device)
    d2t = getattr(model, "d2t", None)
    for step in range(depth):
        hidden = torch.cat([model.embed_tokens(tokens), hidden], dim=-1)
        rotary = model.rotary_emb(hidden, positions)
        cache_position = torch.arange(step * total, (step + 1) * total, device=hidden.device)
        for index, layer in enumerate(model.layers):
            layer_mask = sliding if index in model.sliding_window_indices else attention
            hidden = layer(
                hidden,
                attention_mask=layer_mask,
                position_ids=positions,
                past_key_values=cache,
                cache_position=cache_position,
                position_embeddings=rotary,
            )
        if model.config.norm_output:
            hidden = model.norm(hidden)
            logits = model.lm_head(hidden)
        else:
            logits = model.lm_head(model.norm(hidden))
        drafted = to_target_ids(torch.argmax(logits, dim=-1), d2t)  # [1, T]
        # Step `step` from start p predicts the token the target chooses at p + step.
        ok = torch.zeros(total, dtype=torch.bool, device=hidden.device)
        if step < total:
            span = total - step
            same_doc = docs[step:] == docs[:span]
            ok[:span] = (drafted[0, :span] == targets[step:]) & same_doc & mask[step:]
        alive &= ok
        lengths += alive.long()
        tokens = drafted
        if model._attn_impl == "simple_flex_attention":
            attention = extend_mask_for_draft_tokens(attention) if attention is not None else None
            sliding = extend_mask_for_draft_tokens(sliding) if sliding is not None else None
        else:
            if attention is not None:
                attention = extend_dense_mask_for_draft_tokens(attention, total)
            if sliding is not None:
                sliding = extend_dense_mask_for_draft_tokens(sliding, total)
        positions = positions + 1
    return lengths


def turns(lengths: Any, batch: dict[str, Any]) -> list[list[int]]:
    """The draft-start positions of each packed sample's trained span, as lists of lengths."""
    docs = batch["document_ids"][0].tolist()
    mask = batch["loss_mask"][0].bool().tolist()
    values = lengths.tolist()
    out: dict[int, list[int]] = {}
    for position, (doc, trained) in enumerate(zip(docs, mask, strict=True)):
        if trained:
            out.setdefault(doc, []).append(values[position])
    return [out[doc] for doc in sorted(out)]

"""extract: hidden states of the aux layers (in the declared convention) plus the final layer.

Production path (`backend: vllm`, extract_vllm.py): the states vLLM itself computes, through
vLLM's extract_hidden_states speculative method (pinned: vLLM 0.32). Reference path on
transformers (tests, and checking the production path on a GPU): one forward pass per sample with
output_hidden_states.
HF's hidden_states[k] is the residual stream entering decoder layer k, so vLLM's id k reads
hidden_states[k] and SGLang's id k (the output of layer k) reads hidden_states[k + 1]; the final
layer is the residual entering the final norm. One safetensors file per sample, written
atomically; a restarted shard skips finished samples. Refuses to start when the volume cannot hold
what is left to write.
"""

from __future__ import annotations

import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

from kimideploy.config.specs import ExtractSpec
from kimideploy.formats.chat_template import load_tokenizer
from kimideploy.workloads import dataset_record, extract_vllm, target_config
from kimideploy.workloads.conversations import my_samples, sample_tokens
from kimideploy.workloads.dataset_record import rendering_inputs
from kimideploy.workloads.runtime import (
    EXIT_INTERRUPTED,
    BadInputError,
    shard_index,
)
from kimideploy.workloads.shards import ShardWriter, sample_file


def hidden_state_indexes(ids: list[int], convention: str) -> list[int]:
    """Positions in HF's hidden_states tuple for layer ids written in `convention`."""
    return list(ids) if convention == "vllm" else [k + 1 for k in ids]


def run(spec: ExtractSpec) -> int:
    target_config.check(spec.target)
    index = shard_index()
    samples = my_samples(Path(spec.conversations_dir), spec.shards, index)
    if not samples:
        raise BadInputError(
            f"{spec.conversations_dir}: no generated conversations for shard {index}"
        )
    tokenizer = load_tokenizer(spec.target.path)
    observed = rendering_inputs(
        Path(spec.conversations_dir), spec.fingerprint.get("conversations"), tokenizer
    )
    if spec.backend == "vllm":  # the engine that computes the states, as installed in the pod
        observed["engine_version"] = f"vllm {metadata.version('vllm')}"
    dataset_record.claim(Path(spec.output_dir), spec.fingerprint, observed)
    out = Path(spec.output_dir) / f"shard-{index:05d}"
    out.mkdir(parents=True, exist_ok=True)
    todo = [s for s in samples if not sample_file(out, s["id"]).is_file()]
    _check_space(spec, out, len(todo) / len(samples))
    if spec.backend == "vllm":
        return extract_vllm.extract(spec, index, out, samples, todo)
    return _extract(spec, index, out, samples, todo=todo)


def _final_norm_input(model: Any) -> list[Any]:
    """A list that receives, on each forward pass, the residual stream entering the final norm."""
    captured: list[Any] = []
    norm = getattr(model.get_decoder(), "norm", None)
    if norm is None:
        raise BadInputError(
            f"{type(model).__name__}: no final norm found on its decoder; the reference path "
            "supports Llama- and DeepSeek-V3-shaped models"
        )
    norm.register_forward_hook(lambda _module, inputs, _output: captured.append(inputs[0]))
    return captured


def _check_space(spec: ExtractSpec, out: Path, remaining: float) -> None:
    needed = int(spec.expected_bytes / spec.shards * remaining)
    free = shutil.disk_usage(out).free
    if needed > free:
        raise BadInputError(
            f"{out}: {free / 1e9:,.1f} GB free but this shard still needs about "
            f"{needed / 1e9:,.1f} GB (samples x tokens x bytes per token); "
            "grow the hidden-states claim or use online training"
        )


def _extract(
    spec: ExtractSpec,
    index: int,
    out: Path,
    samples: list[dict[str, Any]],
    *,
    todo: list[dict[str, Any]],
) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, spec.dtype)
    tokenizer = load_tokenizer(spec.target.path)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(spec.target.path, dtype=dtype).to(device).eval()
    positions = hidden_state_indexes(spec.layers.ids, spec.layers.convention)
    final_norm_input = _final_norm_input(model)
    shard = ShardWriter(spec, index, out, samples, todo=todo)
    for sample in todo:
        if shard.stopper.stopping:
            return EXIT_INTERRUPTED
        ids, mask = sample_tokens(tokenizer, sample)
        with torch.no_grad():
            states = model(torch.tensor([ids], device=device), output_hidden_states=True)
        tensors = {
            "input_ids": torch.tensor(ids, dtype=torch.int64),
            "loss_mask": torch.tensor(mask, dtype=torch.uint8),
            "aux_hidden_states": torch.stack([states.hidden_states[p][0] for p in positions])
            .to("cpu", dtype)
            .contiguous(),
            # HF's last hidden state is after the final norm; the drafter's training target
            # (speculators: lm_head(norm(last))) and vLLM's layer id num_layers want it before.
            "last_hidden_state": final_norm_input.pop()[0].to("cpu", dtype).contiguous(),
        }
        shard.add(sample["id"], tensors, len(ids))
    return shard.finish()

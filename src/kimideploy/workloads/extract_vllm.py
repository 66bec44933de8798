"""extract, production path: the hidden states vLLM itself computes, on the extraction image.

vLLM 0.18 has a speculative method, `extract_hidden_states`, whose "drafter" only caches the
target's aux hidden states (the layers named by `eagle_aux_hidden_state_layer_ids`, in vLLM's
convention) into a KV-cache-shaped buffer, and a KV connector, `ExampleHiddenStatesConnector`,
that writes each request's buffer to `<shared_storage_path>/<request id>.safetensors` as
`hidden_states [tokens, layers, hidden]` and `token_ids [tokens]`, returning the path in the
request's `kv_transfer_params["hidden_states_path"]`. Each conversation is sent as token ids with
max_tokens 1 (a prefill; the one sampled token is discarded), then converted to this pipeline's
sample format and checked token by token.

The final layer is asked for as id `num_hidden_layers` (the residual stream leaving the last
layer, before the final norm): Llama offers it natively, DeepSeek-V3 / Kimi-K2.5 through the
extraction image's patch 0001 (docker/patches/vllm-0.18.0). Prefix caching is off: a cached
prefix is not recomputed, so its hidden states would never reach the connector.

Runs only where vLLM runs: a GPU (vLLM 0.18's CPU runner refuses speculative decoding). The tests
check the engine configuration against the pinned vLLM on CPU and the conversion on files in the
connector's layout; `scripts/gpu-check-extract` compares it with the reference path on a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kimideploy.config.specs import ExtractSpec
from kimideploy.formats import extraction_engine
from kimideploy.formats.chat_template import load_tokenizer
from kimideploy.workloads import connector_files
from kimideploy.workloads.conversations import sample_tokens
from kimideploy.workloads.runtime import EXIT_INTERRUPTED
from kimideploy.workloads.shards import ShardWriter

BATCH = 64
"""Conversations per generate() call: big enough to keep the GPUs busy, small enough that a
SIGTERM drain finishes within the pod's grace period."""


class ExtractionMismatchError(Exception):
    """vLLM's file does not belong to the sample (token ids or shape differ)."""


def aux_layer_ids(spec: ExtractSpec) -> list[int]:
    """The drafter's layers in vLLM's convention, then the final pre-norm layer."""
    return extraction_engine.aux_layer_ids(spec.layers.vllm_ids, spec.target.num_hidden_layers)


def engine_kwargs(spec: ExtractSpec, storage: Path) -> dict[str, Any]:
    """vllm.LLM(**these): checked against the pinned vLLM's own config builder by the tests."""
    return extraction_engine.llm_kwargs(
        spec.target, spec.tensor_parallel_size, spec.dtype, list(spec.layers.vllm_ids), str(storage)
    )


def convert(
    saved: dict[str, Any], ids: list[int], mask: list[int], aux_count: int, dtype: Any
) -> dict[str, Any]:
    """The connector's [tokens, layers, hidden] file as this pipeline's sample tensors."""
    import torch

    states, tokens = saved["hidden_states"], saved["token_ids"]
    if tokens.tolist() != ids:
        raise ExtractionMismatchError(
            f"vLLM's file holds {len(tokens)} tokens that differ from the sample's {len(ids)}"
        )
    if states.dim() != 3 or states.shape[0] != len(ids) or states.shape[1] != aux_count + 1:
        raise ExtractionMismatchError(
            f"vLLM's hidden states have shape {list(states.shape)}, expected "
            f"[{len(ids)}, {aux_count + 1}, hidden]"
        )
    return {
        "input_ids": torch.tensor(ids, dtype=torch.int64),
        "loss_mask": torch.tensor(mask, dtype=torch.uint8),
        "aux_hidden_states": states[:, :aux_count].permute(1, 0, 2).to(dtype).contiguous(),
        "last_hidden_state": states[:, aux_count].to(dtype).contiguous(),
    }


def extract(
    spec: ExtractSpec,
    index: int,
    out: Path,
    samples: list[dict[str, Any]],
    todo: list[dict[str, Any]],
) -> int:
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    dtype = getattr(torch, spec.dtype)
    storage = out / ".vllm-hidden-states"
    storage.mkdir(exist_ok=True)
    tokenizer = load_tokenizer(spec.target.path)
    llm = LLM(**engine_kwargs(spec, storage))
    once = SamplingParams(max_tokens=1, temperature=0.0)
    aux_count = len(spec.layers.vllm_ids)
    shard = ShardWriter(spec, index, out, samples, todo)
    for first in range(0, len(todo), BATCH):
        if shard.stopper.stopping:
            return EXIT_INTERRUPTED
        batch = todo[first : first + BATCH]
        encoded = [sample_tokens(tokenizer, s) for s in batch]
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in encoded]
        outputs = llm.generate(prompts, once, use_tqdm=False)
        for sample, (ids, mask), output in zip(batch, encoded, outputs, strict=True):
            path = Path((output.kv_transfer_params or {}).get("hidden_states_path") or "")
            if not path.name or not connector_files.exists(path):
                raise ExtractionMismatchError(
                    f"vLLM reported no hidden-states file for sample {sample['id']}"
                )
            saved = connector_files.read(path)
            shard.add(sample["id"], convert(saved, ids, mask, aux_count, dtype), len(ids))
            connector_files.remove(path)
    return shard.finish()

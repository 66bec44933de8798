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

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kimideploy.config.specs import ExtractSpec
from kimideploy.formats import extraction_engine
from kimideploy.formats.chat_template import load_tokenizer
from kimideploy.workloads import connector_files
from kimideploy.workloads.conversations import sample_tokens
from kimideploy.workloads.runtime import EXIT_INTERRUPTED, BadInputError, log
from kimideploy.workloads.shards import ShardWriter

BATCH = 64
"""Conversations per generate() call: big enough to keep the GPUs busy, small enough that a
SIGTERM drain finishes within the pod's grace period."""


class ExtractionMismatchError(Exception):
    """vLLM's file does not belong to the sample (token ids or shape differ)."""


def aux_layer_ids(spec: ExtractSpec) -> list[int]:
    """The drafter's layers in vLLM's convention, then the final pre-norm layer."""
    return extraction_engine.aux_layer_ids(spec.layers.vllm_ids, spec.target.num_hidden_layers)


def engine_kwargs(spec: ExtractSpec, storage: Path, longest_sample: int) -> dict[str, Any]:
    """vllm.LLM(**these): checked against the pinned vLLM's own config builder by the tests."""
    size = extraction_engine.EngineSize(
        max_model_len=extraction_engine.sized_for(longest_sample, spec.max_model_len),
        gpu_memory_utilization=spec.gpu_memory_utilization,
        max_num_batched_tokens=spec.max_num_batched_tokens,
    )
    return extraction_engine.llm_kwargs(
        spec.target,
        tensor_parallel_size=spec.tensor_parallel_size,
        dtype=spec.dtype,
        vllm_ids=list(spec.layers.vllm_ids),
        storage=str(storage),
        size=size,
    )


def convert(
    saved: dict[str, Any], ids: list[int], mask: list[int], aux_count: int, *, dtype: Any
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


def too_long(spec: ExtractSpec, encoded: list[tuple[str, int]]) -> None:
    """Refuse, before the engine loads, samples the model cannot hold (plus the sampled token)."""
    over = [(sample_id, n) for sample_id, n in encoded if n + 1 > spec.max_model_len]
    if over:
        listed = ", ".join(f"{sample_id} ({n} tokens)" for sample_id, n in over[:5])
        raise BadInputError(
            f"{len(over)} conversations are longer than the model's max_model_len "
            f"{spec.max_model_len} allows: {listed}",
            hint="raise model.max_model_len if the model supports it, or drop those "
            "conversations (datagen's max_tokens bounds new ones)",
        )


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
    storage = Path(spec.scratch_dir) if spec.scratch_dir else out / ".vllm-hidden-states"
    storage.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(spec.target.path)
    encoded = [sample_tokens(tokenizer, s) for s in todo]
    too_long(spec, [(s["id"], len(ids)) for s, (ids, _) in zip(todo, encoded, strict=True)])
    longest = max((len(ids) for ids, _ in encoded), default=1)
    kwargs = engine_kwargs(spec, storage, longest)
    log(
        f"engine: max_model_len {kwargs['max_model_len']} (longest sample {longest} tokens), "
        f"gpu_memory_utilization {kwargs['gpu_memory_utilization']}, "
        f"max_num_batched_tokens {kwargs['max_num_batched_tokens']}, connector to {storage}"
    )
    llm = LLM(**kwargs)
    once = SamplingParams(max_tokens=1, temperature=0.0)
    aux_count = len(spec.layers.vllm_ids)
    shard = ShardWriter(spec, index, out, samples, todo=todo)

    def save_batch(first: int, outputs: list[Any]) -> None:
        """Read each request's file from the scratch folder, check and convert it, write the
        sample to the shared volume once, delete the scratch file."""
        for offset, output in enumerate(outputs):
            sample, (ids, mask) = todo[first + offset], encoded[first + offset]
            path = Path((output.kv_transfer_params or {}).get("hidden_states_path") or "")
            if not path.name or not connector_files.exists(path):
                raise ExtractionMismatchError(
                    f"vLLM reported no hidden-states file for sample {sample['id']}"
                )
            saved = connector_files.read(path)
            shard.add(sample["id"], convert(saved, ids, mask, aux_count, dtype=dtype), len(ids))
            connector_files.remove(path)

    # The conversion of one batch runs while the engine prefills the next: the GPUs do not wait
    # on the filesystem. One batch converts at a time, so at most two batches of files are in
    # the scratch folder.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="convert") as converter:
        pending: Future[None] | None = None
        for first in range(0, len(todo), BATCH):
            if shard.stopper.stopping:
                break
            prompts = [
                TokensPrompt(prompt_token_ids=ids) for ids, _ in encoded[first : first + BATCH]
            ]
            outputs = llm.generate(prompts, once, use_tqdm=False)
            if pending is not None:
                pending.result()  # a failed conversion stops the run here, with its error
            pending = converter.submit(save_batch, first, outputs)
        if pending is not None:
            pending.result()
    if shard.stopper.stopping:
        return EXIT_INTERRUPTED
    return shard.finish()

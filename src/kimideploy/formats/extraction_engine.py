"""vLLM's hidden-state extraction setup (vLLM >= 0.18, pinned 0.32), in one place for its two users.

The extract workload passes these to `vllm.LLM(...)`; online training renders them as `vllm serve`
flags for the target server beside each trainer (plan/online.py). Both must ask vLLM for the same
layers the same way, or a drafter trained online would read other features than one trained
offline; the pipeline tests run both against the pinned vLLM 0.32 (its CPU build).

`extract_hidden_states` is a speculative method whose "drafter" only caches the target's aux hidden
states; `ExampleHiddenStatesConnector` writes each request's states to
`<shared_storage_path>/<request id>.safetensors` as `hidden_states [tokens, layers, hidden]` and
`token_ids [tokens]` and returns the path in `kv_transfer_params["hidden_states_path"]`. The final
layer is asked for as id `num_hidden_layers` (the residual stream before the final norm), which
Llama always offered and DeepSeek-V2/V3 (Kimi-K2's backbone) offer natively from vLLM 0.32 (vLLM
PR #46973; 0.18 needed a patch kimideploy no longer carries). Prefix caching is off: a cached
prefix is not recomputed, so its states would never reach the connector. From 0.32 the connector
writes after the reply, under a `.lock` file (workloads/connector_files.py reads it safely).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

CONNECTOR = "ExampleHiddenStatesConnector"
METHOD = "extract_hidden_states"
MIN_VLLM = (0, 18)
"""The extract_hidden_states method and ExampleHiddenStatesConnector arrived in vLLM 0.18."""
NATIVE_FINAL_LAYER = (0, 32)
DEEPSEEK_SHAPED = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2"})
"""Text models whose final pre-norm state vLLM hands out only from NATIVE_FINAL_LAYER on."""


def image_problem(vllm: str | None, text_model_type: str) -> str | None:
    """Why an image cannot extract this target's hidden states (None when it can)."""
    found = version_tuple(vllm) if vllm else None
    if found is None or found < MIN_VLLM:
        return f"has vLLM {vllm or 'none'}; hidden-state extraction needs vLLM >= 0.18"
    if text_model_type in DEEPSEEK_SHAPED and found < NATIVE_FINAL_LAYER:
        return (
            f"has vLLM {vllm}, which cannot hand out the final pre-norm layer of a "
            f"{text_model_type} target; that needs vLLM >= 0.32"
        )
    return None


def version_tuple(text: str) -> tuple[int, int]:
    major, minor, *_ = (text.lstrip("v") + ".0").split(".")
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def aux_layer_ids(vllm_ids: list[int], num_hidden_layers: int) -> list[int]:
    """The drafter's layers in vLLM's convention, then the final pre-norm layer."""
    return [*vllm_ids, num_hidden_layers]


def speculative_config(vllm_ids: list[int], num_hidden_layers: int) -> dict[str, Any]:
    return {
        "method": METHOD,
        "num_speculative_tokens": 1,
        "draft_model_config": {
            "hf_config": {
                "eagle_aux_hidden_state_layer_ids": aux_layer_ids(vllm_ids, num_hidden_layers)
            }
        },
    }


@dataclass(frozen=True)
class EngineSize:
    """How big the extraction engine is made. Left to vLLM, it sizes for the model's own context
    (262,144 tokens for Kimi-K2.5) at its default memory utilisation, and finds after the
    25-minute load that one such request does not fit; every engine kimideploy starts is given
    these instead."""

    max_model_len: int
    """The longest sequence the engine must hold: the longest sample plus the one sampled token."""
    gpu_memory_utilization: float
    max_num_batched_tokens: int
    """Tokens per engine step: prefill-only work batches many prompts' prefills at once."""


def llm_kwargs(
    target: Any,
    *,
    tensor_parallel_size: int,
    dtype: str,
    vllm_ids: list[int],
    storage: str,
    size: EngineSize,
) -> dict[str, Any]:
    """`vllm.LLM(**these)` for the extraction engine of `target` (a spec's TargetRef)."""
    return {
        "model": target.path,
        "tokenizer": target.path,
        "served_model_name": target.served_name,
        "tensor_parallel_size": tensor_parallel_size,
        "dtype": dtype,
        "trust_remote_code": True,
        "enable_prefix_caching": False,
        "max_model_len": size.max_model_len,
        "gpu_memory_utilization": size.gpu_memory_utilization,
        "max_num_batched_tokens": max(size.max_num_batched_tokens, MIN_BATCHED_TOKENS),
        "speculative_config": speculative_config(vllm_ids, target.num_hidden_layers),
        "kv_transfer_config": kv_transfer_config(storage),
    }


MIN_BATCHED_TOKENS = 256
"""vLLM refuses a token budget below its block-aligned minimum; tiny test engines use this."""


def sized_for(longest_sample: int, limit: int) -> int:
    """max_model_len for samples of at most `longest_sample` tokens: the sample and the one
    token sampled after its prefill, rounded up to a multiple of 256 (vLLM's KV blocks), at most
    the model's own limit."""
    wanted = longest_sample + 1
    return min(-(-wanted // 256) * 256, limit)


def kv_transfer_config(storage: str) -> dict[str, Any]:
    return {
        "kv_connector": CONNECTOR,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": storage},
    }


def serve_flags(vllm_ids: list[int], num_hidden_layers: int, storage: str) -> list[str]:
    """The extraction flags of `vllm serve` (model, port and sizes come from the caller)."""
    return [
        "--no-enable-prefix-caching",
        "--speculative-config",
        json.dumps(speculative_config(vllm_ids, num_hidden_layers)),
        "--kv-transfer-config",
        json.dumps(kv_transfer_config(storage)),
    ]

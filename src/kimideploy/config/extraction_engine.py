"""vLLM 0.18's hidden-state extraction setup, in one place for its two users.

The extract workload passes these to `vllm.LLM(...)`; online training renders them as `vllm serve`
flags for the target server beside each trainer (plan/online.py). Both must ask vLLM for the same
layers the same way, or a drafter trained online would read other features than one trained
offline; the tests check both forms against the pinned vLLM 0.18's own parsers.

`extract_hidden_states` is a speculative method whose "drafter" only caches the target's aux hidden
states; `ExampleHiddenStatesConnector` writes each request's states to
`<shared_storage_path>/<request id>.safetensors` as `hidden_states [tokens, layers, hidden]` and
`token_ids [tokens]` and returns the path in `kv_transfer_params["hidden_states_path"]`. The final
layer is asked for as id `num_hidden_layers` (the residual stream before the final norm). Prefix
caching is off: a cached prefix is not recomputed, so its states would never reach the connector.
"""

from __future__ import annotations

import json
from typing import Any

CONNECTOR = "ExampleHiddenStatesConnector"
METHOD = "extract_hidden_states"


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
        "--speculative-config", json.dumps(speculative_config(vllm_ids, num_hidden_layers)),
        "--kv-transfer-config", json.dumps(kv_transfer_config(storage)),
    ]  # fmt: skip

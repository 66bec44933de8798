"""What an image's kernel plan is derived under: the target's and a drafter's config.json as vLLM
reads them, built from the facts the project declares (model.attention, model.moe, its EAGLE-3
drafters), the tensor-parallel size and k. images/kernel_check.py builds the engine's own
VllmConfig from them; the stored plan keeps their fingerprint, so a project whose model differs
is not planned from another model's derivation."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kimideploy.config.drafters import to_vllm_layer_ids
from kimideploy.config.project import Project

DRAFTER_HEAD_SIZE = 128
"""An EAGLE-3 llama head's attention head size (the K2.5 drafters' llama layer)."""
DRAFTER_HEADS = 64
DRAFTER_KV_HEADS = 8
"""The llama head's query and KV heads: 8 and 1 per rank at tensor-parallel 8."""
TENSOR_PARALLEL = 8
ATTENTION_KEYS = (
    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "head_dim",
)  # fmt: skip
"""config.json's attention keys the project declares (model.attention), under their own names."""
NUM_SPECULATIVE_TOKENS = 3
"""k of the speculative config the plan is evaluated with: the selection does not read it beyond
the scheduler's budget, so one k stands for every k."""


def target_config(project: Project) -> dict[str, Any] | None:
    """The target's config.json as vLLM reads it, from the facts the project declares (the
    wrapper and its DeepSeek-V3 text config); None without the attention's shape."""
    model, attention, moe = project.model, project.model.attention, project.model.moe
    if attention is None:
        return None
    text: dict[str, Any] = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": model.text_model_type,
        "hidden_size": model.hidden_size,
        "num_hidden_layers": model.num_hidden_layers,
        "vocab_size": model.vocab_size,
        "num_attention_heads": attention.num_heads,
        "num_key_value_heads": attention.num_kv_heads or attention.num_heads,
        "max_position_embeddings": model.max_model_len,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        **{
            key: getattr(attention, key)
            for key in ATTENTION_KEYS
            if getattr(attention, key) is not None
        },
    }
    if moe is not None:
        text.update(
            n_routed_experts=moe.routed_experts,
            num_experts_per_tok=moe.experts_per_token,
            moe_intermediate_size=round(moe.expert_params_m * 1e6 / (3 * model.hidden_size)),
            first_k_dense_replace=model.num_hidden_layers - moe.moe_layers,
        )
    if model.model_type == model.text_model_type:
        return {**text, "architectures": [model.architecture]}
    return {
        "architectures": [model.architecture],
        "model_type": model.model_type,
        "text_config": text,
        "torch_dtype": "bfloat16",
    }


def drafter_config(project: Project) -> dict[str, Any]:
    """An EAGLE-3 llama head's config.json over the target: its hidden size and vocabulary, the
    first llama drafter's draft vocabulary and aux layers where the project declares one."""
    model = project.model
    declared = [d for d in project.eagle_drafters.values() if d.decoder == "llama"]
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": model.hidden_size,
        "num_hidden_layers": 1,
        "num_attention_heads": DRAFTER_HEADS,
        "num_key_value_heads": DRAFTER_KV_HEADS,
        "head_dim": DRAFTER_HEAD_SIZE,
        "intermediate_size": 4 * model.hidden_size,
        "vocab_size": model.vocab_size,
        "draft_vocab_size": declared[0].draft_vocab_size if declared else model.vocab_size,
        "max_position_embeddings": model.max_model_len,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    if declared:
        layers = to_vllm_layer_ids(declared[0].aux_layer_ids, declared[0].layer_id_convention)
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": layers}
    return config


def model_configs(project: Project) -> dict[str, Any] | None:
    """What kernel_check.py builds the engine's VllmConfig from (None: no attention shape)."""
    target = target_config(project)
    if target is None:
        return None
    return {
        "target": target,
        "drafters": {"drafter": drafter_config(project)},
        "tensor_parallel": TENSOR_PARALLEL,
        "max_model_len": project.model.max_model_len,
        "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
    }


def model_fingerprint(project: Project) -> str | None:
    """Which model a derivation was evaluated for (None: no attention shape declared)."""
    configs = model_configs(project)
    if configs is None:
        return None
    return hashlib.sha256(json.dumps(configs, sort_keys=True).encode()).hexdigest()[:12]

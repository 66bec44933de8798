"""The memory plan's KV bytes per token against the pinned vLLM's own KV-cache spec: vLLM's model
config reads a DeepSeek-V3-shaped (MLA) and a Llama-shaped (grouped KV heads) config.json, its
KV-cache spec gives the page size, and the plan's arithmetic must give the same per token."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kimideploy.config.target import AttentionShape
from kimideploy.plan.memory import kv_bytes_per_token
from tests.workloads.conftest import workloads_python

MLA = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 64,
       "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 6,
       "num_attention_heads": 8, "num_key_value_heads": 8, "n_routed_experts": 8,
       "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
       "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
       "v_head_dim": 16, "vocab_size": 1024, "max_position_embeddings": 4096,
       "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
       "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
       "norm_topk_prob": True, "scoring_func": "sigmoid"}  # fmt: skip
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
         "intermediate_size": 512, "num_hidden_layers": 5, "num_attention_heads": 8,
         "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 1024,
         "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}  # fmt: skip

VLLM_PAGE = """
import json, sys
import torch
from vllm.config import ModelConfig, ParallelConfig
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec
path, tp, cache_dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model = ModelConfig(model=path, skip_tokenizer_init=True)
parallel = ParallelConfig(tensor_parallel_size=tp)
dtype = torch.float8_e4m3fn if cache_dtype == "fp8" else model.dtype
kind = MLAAttentionSpec if model.use_mla else FullAttentionSpec
spec = kind(block_size=16, num_kv_heads=model.get_num_kv_heads(parallel),
            head_size=model.get_head_size(), dtype=dtype)
print(json.dumps({"per_token": spec.page_size_bytes // 16 * model.get_num_layers(parallel),
                  "mla": model.use_mla}))
"""


def vllm_per_token(config: dict[str, object], tmp_path: Path, tp: int, cache_dtype: str) -> int:
    folder = tmp_path / str(config["model_type"])
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    done = subprocess.run([str(workloads_python()), "-c", VLLM_PAGE, str(folder), str(tp),
                           cache_dtype], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return int(json.loads(done.stdout.strip().splitlines()[-1])["per_token"])


class Shaped:
    """What kv_bytes_per_token reads of the target model."""

    def __init__(self, attention: AttentionShape, layers: int) -> None:
        self.attention, self.num_hidden_layers = attention, layers


@pytest.mark.parametrize("tp,cache_dtype", [(1, "auto"), (8, "auto"), (8, "fp8")])
def test_mla_kv_per_token_is_vllms_page_size_per_token(
    tmp_path: Path, tp: int, cache_dtype: str
) -> None:
    shape = AttentionShape(kind="mla", num_heads=8, kv_lora_rank=16, qk_rope_head_dim=8)
    ours = kv_bytes_per_token(Shaped(shape, 6), tp, cache_dtype)  # type: ignore[arg-type]
    assert ours == vllm_per_token(MLA, tmp_path, tp, cache_dtype)
    # The latent is on every rank: eight ranks hold as much per token as one.
    assert ours == (16 + 8) * 6 * (1 if cache_dtype == "fp8" else 2)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_grouped_kv_per_token_is_vllms_page_size_per_token(tmp_path: Path, tp: int) -> None:
    shape = AttentionShape(kind="mha", num_heads=8, num_kv_heads=4, head_dim=32)
    ours = kv_bytes_per_token(Shaped(shape, 5), tp, "auto")  # type: ignore[arg-type]
    assert ours == vllm_per_token(LLAMA, tmp_path, tp, "auto")

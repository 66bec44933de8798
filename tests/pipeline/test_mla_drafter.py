"""An MLA EAGLE-3 drafter shaped like vLLM's Kimi-K2.5 recipe drafter (`Eagle3DeepseekV2ForCausalLM`,
`model_type: kimi_k2`, one DeepSeek decoder layer with latent attention) served by vLLM 0.32's CPU
build for a DeepSeek-V3-shaped MLA target, with the `--speculative-config` kimideploy renders for
the example's `k25-mla` drafter and the 0.32 image's baked-in patch 0001 (vllm#45764) applied.

The CPU build runs MLA with its reference backend (CPU_MLA, named explicitly: see the test), whose
decode kernel only exists for DeepSeek's latent size (kv_lora_rank 512 + rope 64 = 576), so both
models use those shapes with a small hidden size; weights are vLLM's dummy initialisation, so nothing is accepted: what is proven
is that the drafter loads with the target's MLA attention and drafts on every step, as vLLM counts
it. (That the patch makes vLLM set the drafter's attention up as MLA is proven on the engine
configuration in tests/images: test_without_patch_0001_vllm_032_runs_the_mla_drafter_as_ordinary_
attention.)
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from tests.conftest import REPO
from tests.pipeline import pods

from kimideploy.config.loading import LoadedProject
from kimideploy.formats.vllm_metrics import acceptance
from kimideploy.images import verify
from kimideploy.services.images.operations import serve_cases, write_tiny_models

CPU_MLA = {"q_lora_rank": 64, "kv_lora_rank": 512, "qk_nope_head_dim": 32, "qk_rope_head_dim": 64,
           "v_head_dim": 32}  # fmt: skip
"""The latent shapes vLLM's CPU MLA decode kernel is built for (head size 576)."""
SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
         "num_key_value_heads": 4, "vocab_size": 1024, "torch_dtype": "float32"}  # fmt: skip


def write_models(root: Path, aux_layers: list[int]) -> tuple[Path, Path]:
    target, drafter = root / "target", root / "drafter"
    target.mkdir()
    drafter.mkdir()
    config = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", **SMALL,
        **CPU_MLA, "moe_intermediate_size": 64, "num_hidden_layers": 4,
        # Dense layers only: the MoE router is not what this test is about.
        "first_k_dense_replace": 4, "n_routed_experts": 4, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1,
        "max_position_embeddings": 4096, "rope_theta": 50000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }  # fmt: skip
    (target / "config.json").write_text(json.dumps(config))
    for name, text in verify.tiny_tokenizer_files(SMALL["vocab_size"]).items():
        (target / name).write_text(text)
    recipe = {**verify.tiny_mla_drafter_config(aux_layers, 512), **SMALL, **CPU_MLA,
              "target_hidden_size": SMALL["hidden_size"]}  # fmt: skip
    assert recipe["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert recipe["model_type"] == "kimi_k2"
    (drafter / "config.json").write_text(json.dumps(recipe))
    return target, drafter


def rendered_speculative_config(example: LoadedProject, tmp: Path, drafter: Path) -> dict:
    """The `--speculative-config` kimideploy renders for the example's MLA drafter on b200."""
    tiny_target, tiny_drafters = write_tiny_models(example.project, tmp / "rendered")
    [case] = [c for c in serve_cases(example, "vllm-0.32-kimi", tiny_target, tiny_drafters)
              if c["name"] == "b200 --drafter k25-mla"]  # fmt: skip
    argv = case["argv"]
    config: dict = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config["method"] == "eagle3" and config["model"] == str(tiny_drafters / "k25-mla")
    return {**config, "model": str(drafter)}


def test_an_mla_drafter_serves_and_drafts_on_vllms_cpu_build(
    cpu_python: Path, example: LoadedProject, tmp_path: Path
) -> None:
    target, drafter = write_models(tmp_path, [1, 2, 3])
    speculative = rendered_speculative_config(example, tmp_path, drafter)
    k = int(speculative["num_speculative_tokens"])
    overlay = verify.patched_overlay(example.project.images["vllm-0.32-kimi"], cpu_python)
    # The reference backend by name, for the target and (its own setting) the drafter: on a CPU
    # with AMX tiles (Sapphire Rapids and later) vLLM otherwise picks AMX_MLA, whose weight
    # packing takes bfloat16 only ("expect weight to be bfloat16, float16, int8, ...") while
    # these models load in float32 (CPU_ONLY_FLAGS).
    speculative["attention_backend"] = "CPU_MLA"
    args = ["--load-format", "dummy", "--speculative-config", json.dumps(speculative),
            "--max-model-len", "512", "--max-num-seqs", "2", *pods.CPU_ONLY_FLAGS,
            "--attention-backend", "CPU_MLA",
            "--host", "127.0.0.1", "--port", str(pods.free_port())]  # fmt: skip
    path = f"{overlay}:{REPO / 'src'}:{pods.SHIM}:{REPO}"
    server = pods.start_vllm(cpu_python, str(target), args, tmp_path / "serve.log",
                             env={"PYTHONPATH": path, "VLLM_LOGGING_LEVEL": "INFO"})  # fmt: skip
    try:
        pods.wait_ready([server], timeout=600)
        before = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
        request = urllib.request.Request(
            server.url + "/v1/completions",
            data=json.dumps(
                {
                    "model": str(target),
                    "prompt": "w10 w11 w12 w13",
                    "max_tokens": 16,
                    "temperature": 0,
                }
            ).encode(),
            headers={"Content-Type": "application/json"},
        )
        answer = json.loads(urllib.request.urlopen(request, timeout=300).read())
        after = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
    finally:
        server.stop()
    log = server.log.read_text(errors="replace")
    assert answer["usage"]["completion_tokens"] == 16
    assert "Resolved architecture: Eagle3DeepseekV2ForCausalLM" in log
    assert "Using CPU_MLA backend" in log
    counted = acceptance(before, after)
    assert counted is not None and counted.drafts >= 8, counted  # drafted on (nearly) every step
    assert counted.draft_tokens == counted.drafts * k  # every draft k long: EAGLE-3, fixed k

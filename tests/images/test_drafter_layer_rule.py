"""`drafter check`'s rule for where vLLM reads a drafter's aux layer ids, held to each pinned vLLM's
own code: the functions its model runners call are run on CPU on config.json variants, and their
answers compared with kimideploy.formats.drafter_files.ids_vllm_reads. If upstream moves the key again,
this fails and the rule must be read anew."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kimideploy.formats.drafter_files import Expected, _layer_finding, ids_vllm_reads
from kimideploy.images import verify as checks
from kimideploy.images.cpu_vllm import engine_python
from tests.conftest import REPO

VARIANTS: dict[str, dict[str, Any]] = {
    "top level": {"eagle_aux_hidden_state_layer_ids": [3, 31, 59]},
    "eagle_config, V1 key": {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [3, 31, 59]}},
    "eagle_config, V2 key": {"eagle_config": {"layer_ids": [3, 31, 59]}},
    "both places": {"eagle_aux_hidden_state_layer_ids": [3, 31, 59],
                    "eagle_config": {"layer_ids": [1, 2, 3]}},
    "none": {},
}  # fmt: skip

# Runs inside the pinned vLLM's venv: what each model runner takes from the drafter's hf_config.
RUNNERS = """
import json, sys
from types import SimpleNamespace
from transformers import PretrainedConfig
from kimideploy.images.engine_check import use_cpu_platform
use_cpu_platform()
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
try:
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
except ImportError:  # no Model Runner V2 in this version
    get_eagle3_aux_layers_from_config = None
out = {}
for name, config in json.loads(sys.argv[1]).items():
    spec = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=PretrainedConfig(**config)))
    v1 = GPUModelRunner._get_eagle3_aux_layers_from_config(SimpleNamespace(speculative_config=spec))
    v2 = get_eagle3_aux_layers_from_config(spec) if get_eagle3_aux_layers_from_config else "absent"
    out[name] = {"v1": list(v1) if v1 else None, "v2": list(v2) if isinstance(v2, tuple) else v2}
print("RESULT " + json.dumps(out))
"""


def runner_reads(python: Path) -> dict[str, dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run([str(python), "-c", RUNNERS, json.dumps(VARIANTS)], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result: dict[str, dict[str, Any]] = json.loads(line.removeprefix("RESULT "))
    return result


def finding(config: dict[str, Any], version: str) -> bool:
    expected = Expected("t/t", "0" * 40, 7168, 163840, 61, [3, 31, 59], "vllm", [3, 31, 59], 32000,
                        3, vllm_version=version)  # fmt: skip
    return _layer_finding(expected, config).ok


@pytest.mark.parametrize("version", ["0.16.0", "0.32.0"])
def test_the_rule_matches_what_the_pinned_vllms_model_runners_read(version: str) -> None:
    python = (
        engine_python(version) if version == "0.32.0" else checks.vllm_venv(version) / "bin/python"
    )
    reads = runner_reads(python)
    for name, config in VARIANTS.items():
        ours = ids_vllm_reads(config, version)
        # The GPU default runner: Model Runner V2 from 0.32 (tests/pipeline's CPU build runs V1).
        gpu = reads[name]["v2"] if reads[name]["v2"] != "absent" else reads[name]["v1"]
        assert ours == gpu, (version, name, reads[name])
        # A drafter passes only where every runner reads the trained ids.
        runners_agree = reads[name]["v2"] in ("absent", reads[name]["v1"])
        assert finding(config, version) == (runners_agree and gpu == [3, 31, 59]), (version, name)
    if version == "0.32.0":
        assert reads["eagle_config, V1 key"] == {"v1": [3, 31, 59], "v2": None}
        assert reads["eagle_config, V2 key"] == {"v1": None, "v2": [3, 31, 59]}
    else:
        assert all(r["v2"] == "absent" for r in reads.values())
        assert reads["eagle_config, V1 key"]["v1"] is None

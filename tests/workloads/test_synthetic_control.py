"""The worker extension `run calibrate` serves with, on the rejection samplers of vLLM 0.32's two
model runners (V1 on CPU, Model Runner V2 on GPUs), built as vLLM builds them: it finds each one's
synthetic rate tensor on the model runner and rewrites it in place with vLLM's own conditional
rates. The end-to-end path (vLLM accepting at the new rate) is tests/pipeline/test_calibrate.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import REPO

PROBE = r"""
import json, sys, types
import torch
from vllm.config import SpeculativeConfig
from vllm.v1.sample.rejection_sampler import RejectionSampler as V1, unconditional_to_conditional_rates
from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler as V2
from kimideploy.workloads.synthetic_acceptance import SyntheticAcceptanceControl

out = {}
config = types.SimpleNamespace(num_speculative_tokens=3, rejection_sample_method="synthetic",
                               synthetic_acceptance_rates=[1.0, 0.5, 0.0],
                               enable_adaptive_verification=False)
sampler = types.SimpleNamespace(logprobs_mode="raw_logprobs", use_fp64_gumbel=False)
for name, cls in (("v1", V1), ("v2", V2)):
    try:
        made = cls(sampler, config, torch.device("cpu")) if name == "v2" else cls(sampler, config)
    except TypeError:
        made = cls(sampler, spec_config=config, device=torch.device("cpu"))
    before = made.synthetic_conditional_rates
    worker = SyntheticAcceptanceControl()
    worker.model_runner = types.SimpleNamespace(rejection_sampler=made, other=object())
    answer = worker.kimideploy_set_synthetic_acceptance(json.dumps([0.6, 0.3, 0.1]))
    after = made.synthetic_conditional_rates
    out[name] = {"answer": answer, "same_tensor": after is before,
                 "rates": after.tolist(),
                 "vllm": unconditional_to_conditional_rates([0.6, 0.3, 0.1])}
try:
    worker.kimideploy_set_synthetic_acceptance(json.dumps([0.6, 0.7, 0.1]))
except ValueError as exc:
    out["rising"] = str(exc)
worker.model_runner = types.SimpleNamespace(rejection_sampler=object())
try:
    worker.kimideploy_set_synthetic_acceptance("[0.5, 0.2, 0.1]")
except RuntimeError as exc:
    out["none"] = str(exc)
print(json.dumps(out))
"""


def test_the_extension_rewrites_both_runners_rate_tensors_in_place(torch_python: Path) -> None:
    done = subprocess.run(
        [str(torch_python), "-c", PROBE], capture_output=True, text=True, timeout=600,
        env={"PYTHONPATH": str(REPO / "src"), "VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for runner in ("v1", "v2"):
        got = out[runner]
        assert got["same_tensor"] is True  # in place: nothing that holds the tensor goes stale
        assert all(abs(a - b) < 1e-6 for a, b in zip(got["rates"], got["vllm"], strict=True))
        assert got["answer"] == {"samplers": ["rejection_sampler"], "rates": [0.6, 0.3, 0.1]}
    assert "non-increasing" in out["rising"]
    assert "no synthetic rejection sampler in this worker" in out["none"]

"""What an image's runtime stage and a GPU pod's first seconds check, with the real torch (the CPU
vLLM venv's: PyPI's CUDA 13.0 build, which carries its compiled architecture list and NCCL) and
a real two-rank all-reduce (gloo on this CPU: the same probe code NCCL runs on GPUs).

On a GPU the same probes run for real in scripts/gpu-smoke; what only a GPU shows (Triton's
compile and launch, vLLM's fused-MoE kernel, NCCL itself) is recorded in bench/MEASUREMENTS.md.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

PROBE = """
import json, sys
from kimideploy.workloads import allreduce_probe
try:
    result = allreduce_probe.local(2, timeout_s=float(sys.argv[1]), size=1 << 20, iterations=3,
                                   backend="gloo")
    print(json.dumps({"ok": True, **result.as_dict()}))
except allreduce_probe.ProbeFailedError as exc:
    print(json.dumps({"ok": False, "error": str(exc)}))
"""


def run(
    python: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})})  # fmt: skip


def selfcheck(python: Path, *names: str) -> dict[str, str]:
    done = run(python, "-m", "kimideploy.images.selfcheck", *names)
    lines = [line for line in done.stderr.splitlines() if line.startswith(("ok  ", "FAIL"))]
    return {line[5:].split(": ", 1)[0]: line for line in lines}


def test_the_runtime_checks_read_torchs_architectures_and_load_nccl_without_a_gpu(
    torch_python: Path,
) -> None:
    found = selfcheck(torch_python, "cuda-archs:sm_100,sm_103,sm_120", "cuda-archs:sm_70", "nccl")
    claimed = found["cuda-archs:sm_100,sm_103,sm_120"]
    assert claimed.startswith("ok") and "run on every claimed sm_100, sm_103, sm_120" in claimed
    old = found["cuda-archs:sm_70"]
    assert old.startswith("FAIL") and "nothing runs on sm_70, which this image claims" in old
    assert found["nccl"].startswith("ok") and "NCCL 2." in found["nccl"]


def test_the_verbs_check_loads_libibverbs_and_names_it_when_missing(torch_python: Path) -> None:
    """scripts/test installs Debian's libibverbs1 here, as the runtime stage does in the image."""
    found = selfcheck(torch_python, "ibverbs")
    assert found["ibverbs"].startswith("ok"), found
    script = ("from kimideploy.images import selfcheck as s; s.IBVERBS_LIBRARY = 'libibverbs.so.0'; "
              "print(s.run(['ibverbs']))")  # fmt: skip
    done = run(torch_python, "-c", script)
    assert "does not load" in done.stdout and "NCCL would fall back to TCP sockets" in done.stdout


def probe(python: Path, timeout_s: float) -> dict[str, Any]:
    done = run(python, "-c", PROBE, str(timeout_s))
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_allreduce_probe_runs_one_process_per_device_and_reports_bus_bandwidth(
    torch_python: Path,
) -> None:
    result = probe(torch_python, 120)
    assert result["ok"], result
    assert result["ranks"] == 2 and result["bytes"] == 1 << 20 and result["backend"] == "gloo"
    assert result["bus_gbps"] > 0 and result["seconds"] > 0
    assert result["transport"] is None  # gloo writes no NCCL log


def test_an_allreduce_that_does_not_finish_in_time_is_named_a_hang(torch_python: Path) -> None:
    """Two ranks that cannot both import torch and meet within 0.2 s: the probe stops them and
    says what a hang at the first all-reduce means."""
    result = probe(torch_python, 0.2)
    assert not result["ok"]
    assert "did not finish within 0.2 s" in result["error"] and "peer-to-peer" in result["error"]


@pytest.mark.parametrize(
    ("logs", "transport"),
    [
        (["host INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0",
          "host INFO Using network IB"], "IB"),
        (["host INFO NET/Socket : Using [0]eth0:10.0.0.1<0>", "host INFO Using network Socket"],
         "Socket"),
        (["a INFO Using network IB", "b INFO Using network Socket"], "Socket"),  # one fell back
        (["host INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM"], None),  # within a node
    ],
)  # fmt: skip
def test_the_transport_is_read_from_nccls_own_log(logs: list[str], transport: str | None) -> None:
    from kimideploy.workloads.allreduce_probe import transport_from_logs

    assert transport_from_logs(logs) == transport


def test_the_flex_attention_probe_compiles_the_training_kernel_and_checks_it(
    torch_python: Path,
) -> None:
    """The train image's probe on this CPU: FlexAttention compiled by the real torch (forward
    only: torch has no CPU backward; the GPU's backward is what the pod's check adds) and
    compared with SDPA; a wrong result is named, not passed."""
    script = (
        "from kimideploy.workloads import gpucheck as g\n"
        "print(g.flex_attention('cpu', (1, 2, 256, 64)))\n"
        "import torch\n"
        "real = torch.nn.functional.scaled_dot_product_attention\n"
        "torch.nn.functional.scaled_dot_product_attention = lambda *a, **k: real(*a, **k) + 1\n"
        "try:\n    g.flex_attention('cpu', (1, 2, 256, 64))\n"
        "except RuntimeError as e:\n    print('refused:', e)\n"
    )
    done = run(torch_python, "-c", script, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("FlexAttention forward at 2 heads x 256 tokens x head dim 64")
    assert lines[-1].startswith("refused: FlexAttention differs from SDPA: outputs by 1")


def test_the_marlin_probe_packs_kimis_int4_experts_as_the_pinned_kernel_takes_them(
    torch_python: Path,
) -> None:
    """The serve pod's `marlin-moe` probe on this CPU, up to the kernel call only a GPU makes:
    vLLM's own helper quantizes and packs the experts at Kimi-K2.5's shapes (group 32), the
    arguments bind to the pinned fused_marlin_moe's signature, and the reference is the size of
    a layer's output. (The kernel itself runs in scripts/gpu-smoke.)"""
    script = (
        "import inspect, json\n"
        "from kimideploy.workloads import gpucheck as g\n"
        "from vllm.model_executor.layers.fused_moe.experts.marlin_moe import fused_marlin_moe\n"
        "args, kw, ref = g.marlin_inputs('cpu', experts=8, tokens=4)\n"
        "inspect.signature(fused_marlin_moe).bind(*args, **kw)\n"
        "print(json.dumps({'shapes': [list(a.shape) if a is not None else None for a in args],\n"
        "                  'reference': list(ref.shape), 'finite': bool(ref.isfinite().all())}))\n"
    )
    done = run(torch_python, "-c", script, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    x, w1, w2, _, _, s1, s2, weights, ids = found["shapes"]
    assert x == [4, 7168] and found["reference"] == [4, 7168] and found["finite"]
    # Marlin's INT4 packing: 16 rows of k per tile row, 8 nibbles per int32 across n.
    assert w1 == [8, 7168 // 16, 2 * 256 * 2] and w2 == [8, 256 // 16, 7168 * 2]
    # Group-32 scales: one row per 32 inputs of each expert.
    assert s1 == [8, 7168 // 32, 2 * 256] and s2 == [8, 256 // 32, 7168]
    assert weights == ids == [4, 8]  # top-8 of the experts, as Kimi routes

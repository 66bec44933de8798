"""scripts/gpu-smoke's closing table, read from what its steps print (the lines below are the
formats workloads/gpucheck.py, bench/train_precision.py, bench/train_vs_speculators.py and
bench/weight_readers.py print, as a run on a GPU and one on CPU printed them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

STEPS = (
    "1. GPU check (workloads/gpucheck.py)\t1\t41\t90\n"
    "2. train: fp32 vs bf16 autocast\t0\t212\t300\n"
    "3. train workload vs speculators' trainer\t124\t150\t150\n"
    "4. weight readers, cold and warm page cache\tskipped\t0\t0\n"
)
LOG = """
gpu-check: GPUs, architecture and driver suit this image
gpu-check: ok   torch-arch: torch's kernels (sm_90 sm_100) run on sm_90
gpu-check: ok   flex-attention: forward and backward at the drafter's shape in 0.8 s
gpu-check: FAIL marlin-moe: Marlin refused the expert shapes: out of shared memory
train bf16: {"steps": 22, "first_loss": 0.29, "last_loss": 0.09, "held_out": {"1": 1.2, "3": 1.9}, "seconds_per_step": 0.214, "seconds": 86.5}
train fp32: FAILED
fine-tune of a bf16 base drafter (bf16): {"steps": 22, "first_loss": 0.11, "last_loss": 0.09, "held_out": {}, "seconds_per_step": 0.3, "seconds": 9.0}
step time fp32 / bf16 on this GPU: 1.84x (0.394 s vs 0.214 s per step, median after two warm-up steps)
kimideploy: 16 steps, 2.40 steps/s, 9100 tokens/s, held-out mean acceptance length k=1 1.2
gpu-smoke: step stopped at its 150 s limit
lazy      cold      38.0   0.53     1.00
prefetch  warm      28.0   0.71     0.74
"""


def table(tmp_path: Path, steps: str = STEPS, log: str = LOG) -> subprocess.CompletedProcess:
    (tmp_path / "steps.tsv").write_text(steps)
    (tmp_path / "run.log").write_text(log)
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_smoke_table.py"),
         "--log", str(tmp_path / "run.log"), "--steps", str(tmp_path / "steps.tsv")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_every_step_and_every_figure_is_one_row(tmp_path: Path) -> None:
    done = table(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    rows = [line.split() for line in lines[lines.index("=== the run, one table") + 1 :]]
    assert rows[0] == ["STEP", "WHAT", "RESULT", "FIGURE"]
    by_what = {" ".join(r[1:3]) if r[1] in ("probe", "train") else r[1]: r for r in rows[1:]}
    assert by_what["probe torch-arch"][3] == "ok"
    assert by_what["probe marlin-moe"][3] == "FAIL"
    assert "0.214 s/step" in " ".join(by_what["train bf16"])
    assert "held-out k=3 1.9" in " ".join(by_what["train bf16"])
    assert by_what["train fp32"][3] == "FAIL"
    text = done.stdout
    assert "fp32 / bf16 (GPU)  ok" in text and "1.84x" in text
    assert "16 steps, 2.40 steps/s" in text and "timeout" in text
    assert "weights lazy cold" in text and "0.53 GB/s" in text
    step_lines = [line for line in lines if "  step  " in line]
    assert [line.split()[0] for line in step_lines] == ["1", "2", "3", "4"]
    assert "FAIL (1)" in step_lines[0] and "41 s of 90 s" in step_lines[0]
    assert "timeout" in step_lines[2] and "skipped" in step_lines[3]
    # each step's figures follow its own line
    marlin = next(line for line in lines if "probe marlin-moe" in line)
    assert lines.index(step_lines[0]) < lines.index(marlin) < lines.index(step_lines[1])


def test_a_run_where_no_step_ran_says_so(tmp_path: Path) -> None:
    done = table(tmp_path, steps="", log="")
    assert done.returncode == 1 and "no step ran" in done.stderr

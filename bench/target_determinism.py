"""Does the pipeline tier's test target come out the same on any x86-64 CPU? Builds it under the
settings its cache uses (tests/pipeline/target_cache.SAME_ON_ANY_CPU) while emulating other CPUs
(another thread count, AVX2/FMA/AVX-512 masked from glibc, MKL limited to SSE4.2, oneDNN
unlimited), and without them under ATen's kernels for two instruction sets (the control: those
must differ, or the check proves nothing). Prints the served weights' sha256 and the time of each.

    .venv/bin/python bench/target_determinism.py [--quick]

Each build takes a few minutes on two cores (--quick: 60 + 30 steps, same comparison).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))

from tests.pipeline.pods import cpu_env  # noqa: E402
from tests.pipeline.target_cache import SAME_ON_ANY_CPU, STEPS  # noqa: E402

from kimideploy.images.cpu_vllm import cpu_vllm_python  # noqa: E402

MASKED = {
    "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F,-AVX",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
}
VARIANTS = {
    "portable, 2 threads": {**SAME_ON_ANY_CPU, "KIMIDEPLOY_TARGET_THREADS": "2"},
    "portable, 1 thread": {**SAME_ON_ANY_CPU, "KIMIDEPLOY_TARGET_THREADS": "1"},
    "portable, 2 threads, CPU features masked": {
        **SAME_ON_ANY_CPU,
        **MASKED,
        "KIMIDEPLOY_TARGET_THREADS": "2",
    },
    "portable without oneDNN's cap": {
        k: v for k, v in SAME_ON_ANY_CPU.items() if k != "ONEDNN_MAX_CPU_ISA"
    },
    "control: ATen AVX2 kernels": {"ATEN_CPU_CAPABILITY": "avx2"},
    "control: ATen's default dispatch": {},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    steps = {"steps_previous": 60, "steps": 30} if args.quick else STEPS
    python = cpu_vllm_python()
    base_env = cpu_env(python)
    with tempfile.TemporaryDirectory() as work:
        for name, env in VARIANTS.items():
            out = Path(work) / str(abs(hash(name)))
            command = [
                str(python),
                str(REPO / "tests/pipeline/make_target.py"),
                str(out),
                f"--steps-previous={steps['steps_previous']}",
                f"--steps={steps['steps']}",
                "--seed=0",
            ]
            started = time.monotonic()
            done = subprocess.run(command, capture_output=True, text=True, env={**base_env, **env})
            seconds = time.monotonic() - started
            if done.returncode != 0:
                print(f"{name:44} failed: {done.stderr[-500:]}")
                continue
            weights = (out / "served" / "model.safetensors").read_bytes()
            loss = json.loads(done.stdout.strip().splitlines()[-1])["loss"]
            digest = hashlib.sha256(weights).hexdigest()[:16]
            print(f"{name:44} {digest}  loss {loss:.6f}  {seconds:6.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

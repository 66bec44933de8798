"""The vLLM images' baked-in FlashInfer cubins, checked the way the runtime stage checks them, with
the FlashInfer vLLM 0.16 pins (0.6.3): a pod that would download kernels at its first call fails
the image build instead."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kimideploy.images.verify import vllm_venv
from tests.conftest import REPO


def check(env: dict[str, str]) -> str:
    python = vllm_venv("0.16.0") / "bin" / "python"
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FLASHINFER_CUBIN_DIR", "VLLM_HAS_FLASHINFER_CUBIN")
    }
    done = subprocess.run([str(python), "-m", "kimideploy.images.selfcheck", "flashinfer-cubins"],
                          capture_output=True, text=True, timeout=300,
                          env={**clean, "PYTHONPATH": str(REPO / "src"), **env})  # fmt: skip
    return done.stderr.strip().splitlines()[-1]


def test_flashinfer_reads_the_cubins_baked_into_the_image(tmp_path: Path) -> None:
    cubins = tmp_path / "cubins"
    (cubins / "fmha").mkdir(parents=True)
    (cubins / "fmha" / "kernel.cubin").write_bytes(b"\x7fELF")
    found = check({"FLASHINFER_CUBIN_DIR": str(cubins), "VLLM_HAS_FLASHINFER_CUBIN": "1"})
    assert found.startswith("ok") and f"reads 1 baked-in cubins from {cubins}" in found
    assert "vLLM counts them" in found


def test_cubins_vllm_does_not_count_fail_the_build(tmp_path: Path) -> None:
    """Without VLLM_HAS_FLASHINFER_CUBIN vLLM asks NVIDIA's artifact server whether TRT-LLM
    attention's cubins exist, in every pod: no network there, no TRT-LLM attention."""
    cubins = tmp_path / "cubins"
    cubins.mkdir()
    (cubins / "kernel.cubin").write_bytes(b"\x7fELF")
    uncounted = check({"FLASHINFER_CUBIN_DIR": str(cubins)})
    assert uncounted.startswith("FAIL") and "VLLM_HAS_FLASHINFER_CUBIN unset" in uncounted


def test_no_cubins_or_no_setting_fails_the_build(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    empty = check({"FLASHINFER_CUBIN_DIR": str(tmp_path / "empty")})
    assert empty.startswith("FAIL") and "holds no cubins" in empty
    unset = check({})
    assert unset.startswith("FAIL") and "FlashInfer would download cubins in the pod" in unset
